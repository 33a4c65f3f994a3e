"""Dropout from a counter hash: one threefry draw per call, then an integer hash per element.

jax.random draws every element's bits with threefry, about a hundred integer operations per 32-bit word; on a CPU
that was 4-6% of the enwik8 train step for the residual and feed-forward dropout alone. Here the rng gives two
32-bit seeds, and element (row, col) of x viewed as [rows, last axis] keeps with probability 1 - rate when
mix32(mix32(col ^ s0) ^ mix32(row ^ s1)) < 2^32 (1 - rate). Each mix32 is a bijection, so distinct rows
(or columns) never share bits, and the row/column split keeps this well defined for arrays of more than 2^32
elements (a pod-sized batch) without 64-bit integers.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def mix32(x):
  """lowbias32 (C. Wellons' integer hash): a bijection of uint32 whose output bits each flip with probability
  close to 1/2 when any input bit flips."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
  cols = shape[-1] if shape else 1
  rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
  if rows >= 2 ** 32 or cols >= 2 ** 32:
    raise ValueError(f"dropout on {shape}: more than 2^32 rows or columns.")
  return rows, cols


def _bits(seeds, shape: tuple[int, ...], elementwise: bool):
  """mix32(mix32(col ^ s0) ^ mix32(row ^ s1)) of x viewed as [rows, last axis], as [rows, cols] uint32.

  Two forms of the same values. Vectors: the row and column halves are hashed once each and meet in one mix32 per
  element, a third of the integer work, and no full-size index array exists for XLA:CPU to hoist out of a scanned
  stack and read back from memory. Elementwise: every element hashes its own counters, so the hash fuses into the
  kernel that consumes the mask and launches nothing of its own (on a GPU, where a launch costs more than the
  integer work)."""
  rows, cols = _rows_cols(shape)
  if elementwise:
    col = jax.lax.broadcasted_iota(jnp.uint32, (rows, cols), 1)
    row = jax.lax.broadcasted_iota(jnp.uint32, (rows, cols), 0)
    return mix32(mix32(col ^ seeds[0]) ^ mix32(row ^ seeds[1]))
  col_C = mix32(jnp.arange(cols, dtype=jnp.uint32) ^ seeds[0])
  row_R = mix32(jnp.arange(rows, dtype=jnp.uint32) ^ seeds[1])
  return mix32(col_C[None, :] ^ row_R[:, None])


def _keep(seeds, rate: float, shape: tuple[int, ...], elementwise: bool = False):
  bits = _bits(seeds, shape, elementwise)
  threshold = np.uint64(round(2 ** 32 * (1.0 - rate)))
  keep = bits < jnp.uint32(threshold) if threshold < 2 ** 32 else jnp.ones(bits.shape, bool)
  return keep.reshape(shape)


def _check_rate(rate: float) -> None:
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate {rate!r} must be in [0, 1).")


def keep_mask(rng, rate: float, shape: tuple[int, ...]):
  """Bool keep mask of `shape`, True with probability 1 - rate (within 2^-32), from a jax.random key."""
  _check_rate(rate)
  _rows_cols(shape)
  return _keep(jax.random.bits(rng, (2,), jnp.uint32), rate, shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dropped(x, seeds, rate: float, elementwise: bool):
  keep = _keep(seeds, rate, x.shape, elementwise)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def _dropped_fwd(x, seeds, rate, elementwise):
  return _dropped(x, seeds, rate, elementwise), seeds


def _dropped_bwd(rate, elementwise, seeds, d_y):
  keep = _keep(seeds, rate, d_y.shape, elementwise)
  return jnp.where(keep, d_y, jnp.zeros((), d_y.dtype)) / jnp.asarray(1.0 - rate, d_y.dtype), None


_dropped.defvjp(_dropped_fwd, _dropped_bwd)


def dropout(x, rng, rate: float):
  """Inverted dropout: x / (1 - rate) where `keep_mask(rng, rate, x.shape)` keeps, else 0. Only the two seeds
  are kept for the backward pass, which recomputes the mask inside the fusion that consumes it: no full-size mask
  is stored between the passes. Values and gradients are those of the plain expression; on a GPU the hash is
  computed per element (`_bits`)."""
  _check_rate(rate)
  if rate == 0.0:
    return x
  _rows_cols(x.shape)
  return _dropped(x, jax.random.bits(rng, (2,), jnp.uint32), float(rate), jax.default_backend() == "gpu")


class Dropout(nn.Module):
  """flax.linen.Dropout's interface (`rate`, `__call__(x, deterministic)`, rng collection 'dropout') with the
  keep mask from `keep_mask`: inverted dropout, kept elements scaled by 1 / (1 - rate)."""
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    return dropout(x, self.make_rng("dropout"), float(self.rate))
