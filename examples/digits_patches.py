"""An Hourglass body over image patches, a model hourglass_jax does not ship: next-patch regression on digits.

Each 8x8 scikit-learn digit becomes 16 patches of 2x2 pixels in raster order. A Linen model of our own embeds
the patches (Dense), runs `hourglass_jax.nn.Hourglass` over them (shortened 2x in the middle) and predicts the
next patch's 4 pixels with a mean-squared error, trained with optax. Only the public layer API is used.

  python examples/digits_patches.py --steps 300
"""

import argparse

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

from hourglass_jax.nn import Hourglass

PATCH = 2


def digit_patches() -> np.ndarray:
  """[1797, 16, 4]: the digits scaled to [0, 1], cut into 2x2 patches in raster order."""
  images = load_digits().images.astype(np.float32) / 16.0  # [N, 8, 8]
  n, side = images.shape[0], images.shape[1] // PATCH
  patches = images.reshape(n, side, PATCH, side, PATCH).transpose(0, 1, 3, 2, 4)
  return patches.reshape(n, side * side, PATCH * PATCH)


class NextPatch(nn.Module):
  """patches [B, L, 4] -> predictions [B, L, 4]; prediction t sees patches < t only (a learned start vector
  leads). The start vector is not zero on purpose: blank patches embed to exactly zero at init, and a run of
  exactly-zero rows at the start makes every LayerNorm's gradient 1/sqrt(eps) there, which overflows."""
  width: int = 32

  @nn.compact
  def __call__(self, patches_BxLxP, deterministic: bool = True):
    start_D = self.param("start", nn.initializers.normal(1.0), (self.width,))
    x_BxLxD = nn.Dense(self.width)(patches_BxLxP)
    start_Bx1xD = jnp.broadcast_to(start_D, (x_BxLxD.shape[0], 1, self.width))
    x_BxLxD = jnp.concatenate([start_Bx1xD, x_BxLxD[:, :-1]], axis=1)
    y_BxLxD = Hourglass(hierarchy="1@1 2@2 1@1", num_heads=4, shorten="attention_avg",
                        upsample="attention_repeat")(x_BxLxD, deterministic)
    return nn.Dense(patches_BxLxP.shape[-1])(y_BxLxD)


def train(steps: int, batch_size: int = 32, learning_rate: float = 3e-3, seed: int = 0, log_every: int = 50):
  """Trains `steps` steps; returns the training losses and the held-out loss beside the mean-patch baseline."""
  data = digit_patches()
  train_set, held_out = data[:1600], data[1600:]
  model = NextPatch()
  params = model.init(jax.random.key(seed), train_set[:1])["params"]
  optimizer = optax.adamw(learning_rate)
  opt_state = optimizer.init(params)

  def loss_fn(params, patches):
    return jnp.mean((model.apply({"params": params}, patches) - patches) ** 2)

  @jax.jit
  def step(params, opt_state, patches):
    loss, grads = jax.value_and_grad(loss_fn)(params, patches)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(seed)
  losses = []
  for i in range(steps):
    batch = train_set[rng.integers(0, len(train_set), batch_size)]
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
    if (i + 1) % log_every == 0 or i + 1 == steps:
      print(f"step {i + 1}: train mse {losses[-1]:.4f}", flush=True)
  held_out_loss = float(jax.jit(loss_fn)(params, held_out))
  baseline = float(np.mean((held_out - train_set.mean(axis=(0, 1))) ** 2))
  print(f"held-out mse {held_out_loss:.4f} (predicting the mean patch: {baseline:.4f})")
  return {"losses": losses, "held_out": held_out_loss, "baseline": baseline}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--learning_rate", type=float, default=3e-3)
  args = parser.parse_args(argv)
  return train(args.steps, args.batch_size, args.learning_rate)


if __name__ == "__main__":
  main()
