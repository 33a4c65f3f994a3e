"""The counter-hash dropout (hourglass_jax/ops/dropout.py) that every model layer uses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.ops.dropout import Dropout, keep_mask, mix32
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
