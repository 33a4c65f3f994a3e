"""Dropout from a counter hash: one threefry draw per call, then an integer hash per element.

jax.random draws every element's bits with threefry, about a hundred integer operations per 32-bit word; on a CPU
that was 4-6% of the enwik8 train step for the residual and feed-forward dropout alone. Here the rng gives two
32-bit seeds s0, s1 and element (row, col) of x viewed as [rows, last axis] keeps with probability 1 - rate when
its hash is below 2^32 (1 - rate). Each mix32 is a bijection, so distinct rows (or columns) never share bits, and
the row/column split keeps this well defined for arrays of more than 2^32 elements without 64-bit integers.

Two hashes, one per use:
- `keep_mask` (attention probabilities; ops/flash_dropout.py computes the same bits per tile in its kernels):
  mix32(mix32(col ^ s0) ^ mix32(row ^ s1)).
- `dropout` (the residual stream and the feed-forward): mix32(C[col] ^ R[row] ^ s0) with C and R hashed counters
  that no seed enters, so one pair of vectors serves every layer and step (XLA computes them once per step,
  instead of two small kernels per layer), and the seed meets them in the fusion that consumes the mask. Its
  backward pass keeps the seed, not the mask, and recomputes the mask in the fusion that consumes it.
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


def _below(bits, rate: float):
  threshold = np.uint64(round(2 ** 32 * (1.0 - rate)))
  return bits < jnp.uint32(threshold) if threshold < 2 ** 32 else jnp.ones(bits.shape, bool)


def _check_rate(rate: float) -> None:
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate {rate!r} must be in [0, 1).")


def keep_mask(rng, rate: float, shape: tuple[int, ...]):
  """Bool keep mask of `shape`, True with probability 1 - rate (within 2^-32), from a jax.random key: the
  attention-probability mask (the flash kernel's bits)."""
  _check_rate(rate)
  rows, cols = _rows_cols(shape)
  seeds = jax.random.bits(rng, (2,), jnp.uint32)
  # The row and column halves are hashed as vectors and meet in one mix32 per element: no full-size index array
  # exists for XLA to hoist out of a scanned stack and read back from memory, and a third of the integer work.
  col_C = mix32(jnp.arange(cols, dtype=jnp.uint32) ^ seeds[0])
  row_R = mix32(jnp.arange(rows, dtype=jnp.uint32) ^ seeds[1])
  return _below(mix32(col_C[None, :] ^ row_R[:, None]), rate).reshape(shape)


_ROW_KEY = np.uint32(0x9E3779B9)  # rows hash through another bijection than columns: R is not C


def stream_keep_mask(seed, rate: float, shape: tuple[int, ...]):
  """`dropout`'s keep mask of `shape` from a uint32 `seed`: mix32(C[col] ^ R[row] ^ seed) < 2^32 (1 - rate)."""
  rows, cols = _rows_cols(shape)
  col_C = mix32(jnp.arange(cols, dtype=jnp.uint32))
  row_R = mix32(mix32(jnp.arange(rows, dtype=jnp.uint32)) ^ _ROW_KEY)
  return _below(mix32(col_C[None, :] ^ row_R[:, None] ^ seed), rate).reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dropped(x, seed, rate: float):
  keep = stream_keep_mask(seed, rate, x.shape)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def _dropped_fwd(x, seed, rate):
  return _dropped(x, seed, rate), seed


def _dropped_bwd(rate, seed, d_y):
  keep = stream_keep_mask(seed, rate, d_y.shape)
  return jnp.where(keep, d_y, jnp.zeros((), d_y.dtype)) / jnp.asarray(1.0 - rate, d_y.dtype), None


_dropped.defvjp(_dropped_fwd, _dropped_bwd)


def dropout(x, rng, rate: float):
  """Inverted dropout: x / (1 - rate) where `stream_keep_mask(seed, rate, x.shape)` keeps (seed: 32 bits drawn
  from `rng`), else 0. The backward pass keeps the seed and recomputes the mask in the fusion that consumes it, so
  no full-size mask is stored between the passes; values and gradients are those of the plain expression."""
  _check_rate(rate)
  if rate == 0.0:
    return x
  _rows_cols(x.shape)
  return _dropped(x, jax.random.bits(rng, (), jnp.uint32), float(rate))


class Dropout(nn.Module):
  """flax.linen.Dropout's interface (`rate`, `__call__(x, deterministic)`, rng collection 'dropout'): `dropout`,
  inverted, kept elements scaled by 1 / (1 - rate)."""
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    return dropout(x, self.make_rng("dropout"), float(self.rate))
