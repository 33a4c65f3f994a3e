"""Rematerialisation reaches every block kind: the decoder block, attention shortening and up-sampling tails, the
bottom-up aggregation block and the retina block. For each, three blocks in a row compile to less temporary memory
with `remat_policy='nothing_saveable'` than without, and give the same loss and gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax import nn as hnn

pytestmark = pytest.mark.slow  # five compiled gradient pairs at 256 tokens

WIDTH, LENGTH = 64, 256
OPTIONS = dict(num_heads=4, d_ff=256)


class ThreeBlocks(nn.Module):
  """Three blocks of one kind in a row, each [B, L, D] -> [B, L, D]."""
  kind: str
  remat_policy: str

  @nn.compact
  def __call__(self, x_BxLxD):
    options = dict(OPTIONS, remat_policy=self.remat_policy)
    if self.kind == "decoder":
      return hnn.DecoderStack(num_layers=3, **options)(x_BxLxD)
    if self.kind == "retina":
      return hnn.Retina(num_layers=3, scales="4,1", retina_windows="0:16,16:64", **options)(x_BxLxD)
    for _ in range(3):
      if self.kind == "shorten":  # factor 1: the attention tail at full length
        x_BxLxD = hnn.Shorten(factor=1, method="attention_avg", **options)(x_BxLxD)
      elif self.kind == "upsample":
        x_BxLxD = hnn.Upsample(factor=1, method="attention_repeat", **options)(x_BxLxD, x_BxLxD)
      else:  # no stacks: the aggregation block alone
        x_BxLxD = hnn.BottomUp(scales="4,1", layers_per_scale="0,0", **options)(x_BxLxD)
    return x_BxLxD


def loss_and_memory(kind, remat_policy, x_BxLxD):
  model = ThreeBlocks(kind, remat_policy)
  params = jax.jit(model.init)(jax.random.key(0), x_BxLxD)
  loss = lambda params: jnp.mean(model.apply(params, x_BxLxD) ** 2)
  step = jax.jit(jax.value_and_grad(loss))
  memory = step.lower(params).compile().memory_analysis().temp_size_in_bytes
  return step(params), memory


@pytest.mark.parametrize("kind", ["decoder", "shorten", "upsample", "aggregation", "retina"])
def test_remat_lowers_the_memory_of_every_block_kind_and_keeps_its_function(kind):
  x_BxLxD = jax.random.normal(jax.random.key(1), (2, LENGTH, WIDTH))
  (loss, grads), memory = loss_and_memory(kind, "none", x_BxLxD)
  (remat_loss, remat_grads), remat_memory = loss_and_memory(kind, "nothing_saveable", x_BxLxD)
  assert remat_memory < 0.8 * memory, (kind, remat_memory, memory)
  np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
