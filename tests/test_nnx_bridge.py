"""The Linen modules inside an NNX model through flax.nnx.bridge: the way to reuse them in NNX code.

Our params carry logical axis names; NNX would shard such variables eagerly and then needs a mesh with rules,
so models built without one are created under `nnx.use_eager_sharding(False)`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import optax
import pytest
from flax import nnx
from flax.nnx import bridge

from hourglass_jax.model import build_model
from hourglass_jax.model.layers import DecoderStack
from tests.helpers import small_config


class Classifier(nnx.Module):
  """An NNX model of a user's own: a Hourglass LM backbone + an NNX linear probe on its logits."""

  def __init__(self, rngs: nnx.Rngs):
    self.backbone = bridge.ToNNX(build_model(small_config()), rngs=rngs)
    self.probe = nnx.Linear(50, 2, rngs=rngs)

  def __call__(self, tokens_BxL):
    return self.probe(self.backbone(tokens_BxL).mean(axis=1))


@pytest.mark.slow
def test_hourglass_lm_inside_an_nnx_model_trains():
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, size=(4, 12)), jnp.int32)
  labels = jnp.array([0, 1, 0, 1])
  with nnx.use_eager_sharding(False):
    model = Classifier(nnx.Rngs(0))
    bridge.lazy_init(model.backbone, tokens)
  linen_params = jax.eval_shape(build_model(small_config()).init, jax.random.key(0), tokens)["params"]
  nnx_shapes = jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(model.backbone, nnx.Param)))
  assert nnx_shapes == jax.tree.map(jnp.shape, nn.meta.unbox(linen_params))

  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(tokens), labels).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(8)]
  assert losses[-1] < losses[0]


def test_a_decoder_stack_runs_as_an_nnx_layer():
  cfg = small_config()
  x_BxLxD = jnp.ones((2, 6, cfg.d_model))
  with nnx.use_eager_sharding(False):
    stack = bridge.ToNNX(DecoderStack(num_layers=2, num_heads=cfg.num_heads), rngs=nnx.Rngs(0))
    bridge.lazy_init(stack, x_BxLxD, True)
  y_BxLxD = stack(x_BxLxD, True)
  assert y_BxLxD.shape == x_BxLxD.shape
  np.testing.assert_allclose(y_BxLxD.mean(-1), 0.0, atol=1e-5)  # the stack ends with LayerNorm
