"""The counter-hash dropout (hourglass_jax/ops/dropout.py) that every model layer uses: its formula, the rate and
independence of its masks (within an array, across the layers of a scanned stack and across steps), and a backward
pass that recomputes the mask rather than keeping it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from hourglass_jax.ops.dropout import Dropout, dropout, keep_mask, mix32, stream_keep_mask
from tests.helpers import mix32_numpy


def test_mix32_is_lowbias32_and_a_bijection_on_a_range():
  x = np.arange(1 << 16, dtype=np.uint32) * np.uint32(65537)
  np.testing.assert_array_equal(mix32(jnp.asarray(x)), mix32_numpy(x))
  assert len(np.unique(np.asarray(mix32(jnp.asarray(x))))) == len(x)


def test_keep_mask_follows_its_formula():
  rng = jax.random.key(5)
  keep = keep_mask(rng, 0.3, (2, 3, 7))
  s0, s1 = np.asarray(jax.random.bits(rng, (2,), jnp.uint32))
  row, col = np.meshgrid(np.arange(6, dtype=np.uint32), np.arange(7, dtype=np.uint32), indexing="ij")
  bits = mix32_numpy(mix32_numpy(col ^ s0) ^ mix32_numpy(row ^ s1))
  np.testing.assert_array_equal(keep, (bits < np.uint32(round(2 ** 32 * 0.7))).reshape(2, 3, 7))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_keep_mask_keeps_one_minus_rate_in_every_row_and_column_independently(rate):
  keep = np.asarray(keep_mask(jax.random.key(0), rate, (512, 1024)))
  assert abs(keep.mean() - (1 - rate)) < 0.005
  assert np.all(np.abs(keep.mean(0) - (1 - rate)) < 0.1) and np.all(np.abs(keep.mean(1) - (1 - rate)) < 0.1)
  chance = rate ** 2 + (1 - rate) ** 2
  for shift in (1, 2, 64):  # neighbouring rows and columns agree only at the chance rate
    assert abs(np.mean(keep[shift:] == keep[:-shift]) - chance) < 0.01, shift
    assert abs(np.mean(keep[:, shift:] == keep[:, :-shift]) - chance) < 0.01, shift


def test_keep_mask_depends_on_the_key_only():
  a, b = (keep_mask(jax.random.key(k), 0.5, (64, 64)) for k in (1, 1))
  np.testing.assert_array_equal(a, b)
  other = np.asarray(keep_mask(jax.random.key(2), 0.5, (64, 64)))
  assert abs(np.mean(np.asarray(a) == other) - 0.5) < 0.05
  assert keep_mask(jax.random.key(1), 0.5, ()).shape == ()


def test_keep_mask_rejects_a_rate_outside_zero_to_one():
  for rate in (-0.1, 1.0):
    with pytest.raises(ValueError, match=r"dropout rate .* must be in \[0, 1\)"):
      keep_mask(jax.random.key(0), rate, (4,))


def test_the_module_scales_kept_elements_and_is_the_identity_when_deterministic():
  x = jnp.linspace(1.0, 2.0, 4 * 256).reshape(4, 256)
  layer = Dropout(0.25)
  np.testing.assert_array_equal(layer.apply({}, x, deterministic=True), x)
  np.testing.assert_array_equal(Dropout(0.0).apply({}, x, deterministic=False), x)
  y = np.asarray(layer.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)}))
  kept = y != 0  # x > 0 everywhere: a zero is a dropped element
  assert abs(kept.mean() - 0.75) < 0.05
  np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
  assert y.dtype == x.dtype
  again = layer.apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
  np.testing.assert_array_equal(again, y)
  half = layer.apply({}, x.astype(jnp.bfloat16), deterministic=False, rngs={"dropout": jax.random.key(3)})
  assert half.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(half) != 0, kept)
  # The gradient flows through kept elements only, scaled like them.
  grad = jax.grad(lambda v: layer.apply({}, v, deterministic=False, rngs={"dropout": jax.random.key(3)}).sum())(x)
  np.testing.assert_allclose(grad, np.where(kept, 1 / 0.75, 0.0), rtol=1e-6)


def test_stream_keep_mask_follows_its_formula():
  keep = stream_keep_mask(jnp.uint32(12345), 0.3, (2, 3, 7))
  row, col = np.meshgrid(np.arange(6, dtype=np.uint32), np.arange(7, dtype=np.uint32), indexing="ij")
  bits = mix32_numpy(mix32_numpy(col) ^ mix32_numpy(mix32_numpy(row) ^ np.uint32(0x9E3779B9)) ^ np.uint32(12345))
  np.testing.assert_array_equal(keep, (bits < np.uint32(round(2 ** 32 * 0.7))).reshape(2, 3, 7))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_stream_keep_mask_keeps_one_minus_rate_independently(rate):
  keep = np.asarray(stream_keep_mask(jnp.uint32(7), rate, (512, 1024)))
  assert abs(keep.mean() - (1 - rate)) < 0.005
  chance = rate ** 2 + (1 - rate) ** 2
  for shift in (1, 2, 64):
    assert abs(np.mean(keep[shift:] == keep[:-shift]) - chance) < 0.01, shift
    assert abs(np.mean(keep[:, shift:] == keep[:, :-shift]) - chance) < 0.01, shift
  square = np.asarray(stream_keep_mask(jnp.uint32(7), rate, (512, 512)))
  assert abs(np.mean(square == square.T) - chance) < 0.01  # rows and columns hash differently


def test_dropout_keeps_its_seed_for_the_backward_pass_and_differentiates_as_the_plain_expression():
  x = jax.random.normal(jax.random.key(1), (6, 40, 24), jnp.bfloat16)
  rng, rate = jax.random.key(2), 0.3
  seed = jax.random.bits(rng, (), jnp.uint32)
  plain = lambda x: jnp.where(stream_keep_mask(seed, rate, x.shape), x / jnp.asarray(1 - rate, x.dtype), 0)
  cotangent = jax.random.normal(jax.random.key(3), x.shape, jnp.bfloat16)
  for f in (plain, lambda x: dropout(x, rng, rate)):
    y, vjp = jax.vjp(f, x)
    np.testing.assert_array_equal(y, plain(x))
    np.testing.assert_array_equal(vjp(cotangent)[0], jax.vjp(plain, x)[1](cotangent)[0])
  saved = [aval.shape for aval, _ in saved_residuals(lambda x: (dropout(x, rng, rate) * 2).sum(), x)]
  assert all(np.prod(shape) <= 1 for shape in saved), saved  # the seed, no mask


class _Stack(nn.Module):
  """Dropout of ones in each of 4 scanned layers, per-layer keys split as model/layers.scan_blocks splits them."""

  @nn.compact
  def __call__(self, x):
    layer = nn.scan(lambda block, carry, _: (carry, block(carry)), variable_axes={}, split_rngs={"dropout": True},
                    length=4)
    return layer(_Drop(), x, None)[1]


class _Drop(nn.Module):
  @nn.compact
  def __call__(self, x):
    return Dropout(0.2)(x, deterministic=False)


def test_masks_keep_the_rate_and_are_independent_across_layers_and_steps():
  x = jnp.ones((64, 512))
  step_rng = lambda step: jax.random.fold_in(jax.random.key(0), step)  # train/compiled/step.py's key of a step
  kept = [np.asarray(_Stack().apply({}, x, rngs={"dropout": step_rng(step)}) != 0) for step in (0, 1)]
  layers = [*kept[0], kept[1][0]]  # four layers of step 0, layer 0 of step 1
  chance = 0.2 ** 2 + 0.8 ** 2
  for mask in layers:
    assert abs(mask.mean() - 0.8) < 0.01
  for i in range(len(layers)):
    for j in range(i):
      assert abs(np.mean(layers[i] == layers[j]) - chance) < 0.01, (i, j)
