"""The segments of a dynamically shortened level during cached decoding (segments.py has those of a whole sequence).

Everything is stored by position, so that decoding can go back to any earlier position: after each stream entry t,
'state' holds 'completed' (segments closed at or before t, capped at M-1: the merged tail never closes), the float32
'sum' and 'size' of the open segment, and what the level's predictor keeps of the token (its `new_state`,
predictors/); per segment entry j, 'means' holds the mean that went through the inner level, 'probs' the boundary
probability that closed it (H-Net's smoothing) and 'ybar' the inner level's (smoothed) output that positions read.

New tokens join the open segment one after another; a boundary closes it unless it is the merged tail, and the
segments they close go through the inner level together, at entries completed.. of its stream. A token then reads
the newest segment completed at or before it. With M counted from the cache length, decoding equals the forward
pass over that many positions.
"""

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import kv_cache


def new_level_state(batch: int, size: int, d_model: int, predictor_state: dict) -> dict:
  """The per-position state of `size` entries; `predictor_state`: the predictor's `new_state` for one entry [B, ...]."""
  state = {"sum": jnp.zeros((batch, d_model), jnp.float32), "size": jnp.zeros((batch,), jnp.int32),
           "completed": jnp.zeros((batch,), jnp.int32), **predictor_state}
  return jax.tree.map(lambda a: jnp.zeros((a.shape[0], size) + a.shape[1:], a.dtype), state)


def state_before(state: dict, start):
  """The state after entry start-1 ([B, ...] each; zeros, the empty state, when start is 0; start one entry for
  every row, or int [B])."""
  def before(a):
    row = kv_cache.read_row(a, jnp.maximum(start - 1, 0))
    return jnp.where(jnp.reshape(start > 0, jnp.shape(start) + (1,) * (row.ndim - jnp.ndim(start))), row, 0)
  return jax.tree.map(before, state)


def write_state(state: dict, rows: dict, start) -> dict:
  """`state` with each token's [B, T, ...] rows at entries start..start+T-1 (of the names `rows` has: a predictor
  keeps only what it reads; start one entry for every row, or int [B])."""
  return dict(state, **{name: kv_cache.write_rows(state[name], row, start) for name, row in rows.items()})


def _segmented_cumsum(starts_BxT, values_BxTx):
  """Sums of values along T that restart at every position where `starts` is set."""
  flags = starts_BxT.reshape(starts_BxT.shape + (1,) * (values_BxTx.ndim - 2))

  def combine(earlier, later):
    start_a, sum_a = earlier
    start_b, sum_b = later
    return start_a | start_b, jnp.where(start_b, sum_b, sum_a + sum_b)

  return lax.associative_scan(combine, (jnp.broadcast_to(flags, values_BxTx.shape), values_BxTx), axis=1)[1]


def add_tokens(previous: dict, x_BxTxD, boundary_BxT, max_segments: int):
  """(each token's segment state after it {'sum', 'size', 'completed'} [B, T, ...]; closes [B, T]: the token closed
  a segment (not the merged tail); the mean [B, T, D] float32 of the segment a token closes) once the tokens join the
  open segment of `previous` in order."""
  b_BxT = boundary_BxT.astype(jnp.int32)
  before_BxT = previous["completed"][:, None] + jnp.cumsum(b_BxT, axis=1) - b_BxT
  closes_BxT = boundary_BxT & (before_BxT < max_segments - 1)
  completed_BxT = previous["completed"][:, None] + jnp.cumsum(closes_BxT.astype(jnp.int32), axis=1)
  starts_BxT = jnp.pad(closes_BxT[:, :-1], ((0, 0), (1, 0)))
  x_BxTxD = x_BxTxD.astype(jnp.float32).at[:, 0].add(previous["sum"])
  ones_BxT = jnp.ones(b_BxT.shape, jnp.int32).at[:, 0].add(previous["size"])
  sum_BxTxD, size_BxT = _segmented_cumsum(starts_BxT, x_BxTxD), _segmented_cumsum(starts_BxT, ones_BxT)
  mean_BxTxD = sum_BxTxD / jnp.maximum(size_BxT, 1)[..., None].astype(jnp.float32)
  after = {"sum": jnp.where(closes_BxT[..., None], 0.0, sum_BxTxD), "size": jnp.where(closes_BxT, 0, size_BxT),
           "completed": completed_BxT}
  return after, closes_BxT, mean_BxTxD


def closed_in_order(closes_BxT, count: int, *values_BxTx):
  """The values at the tokens that close segments, in closing order, in `count` slots per row (the rest: values of
  tokens that close none)."""
  order_BxN = jnp.argsort(~closes_BxT, axis=1, stable=True)[:, :count]
  take = lambda v: jnp.take_along_axis(v, order_BxN.reshape(order_BxN.shape + (1,) * (v.ndim - 2)), axis=1)
  return tuple(take(v) for v in values_BxTx)


def put_rows(store_BxMx, rows_BxNx, first_B, count_B=None):
  """`store` with each row's rows at its entries first_B.. (only its first count_B of them, when given)."""
  slots_N = jnp.arange(rows_BxNx.shape[1])
  index_BxN = first_B[:, None] + slots_N[None, :]
  if count_B is not None:
    index_BxN = jnp.where(slots_N[None, :] < count_B[:, None], index_BxN, store_BxMx.shape[1])  # dropped
  rows_B = jnp.arange(store_BxMx.shape[0])[:, None]
  return store_BxMx.at[rows_B, index_BxN].set(rows_BxNx.astype(store_BxMx.dtype), mode="drop")


def take_rows(store_BxMx, first_B, count: int):
  """Each row's `count` entries from first_B (in range)."""
  index_BxN = first_B[:, None] + jnp.arange(count)[None, :]
  return jnp.take_along_axis(store_BxMx, index_BxN.reshape(index_BxN.shape + (1,) * (store_BxMx.ndim - 2)), axis=1)
