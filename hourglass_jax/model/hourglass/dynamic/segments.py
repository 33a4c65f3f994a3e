"""Dynamic shortening: segments of variable length from per-position boundary decisions (dynamic token pooling,
Nawrot et al. 2023), exactly causal and with static shapes under jit.

A boundary at position t closes the segment that contains t; every predictor decides b_t from positions <= t.
Position t lies in segment s_t = the number of boundaries strictly before t (a cumulative sum, no host round-trip).
A row holds at most `max_segments` (M) segments: every position from segment M-1 on belongs to segment M-1, the
merged tail, which is never read. Segment j < M-1 completes at its last position e_j (its boundary). Position t
reads the output of the newest segment completed at or before t, j = r_t - 1 with r_t = the boundaries at or before
t (nothing while r_t = 0), so it depends only on positions <= t: as in fixed shortening, where position jk reads
the shortened token that ends at jk, a segment is read from its closing position on.

Learned boundaries get gradients as in Nawrot et al.: with straight-through decisions b (value 0/1, gradient of a
soft decision), c_t = sum_{u<t} b_u has the value s_t, and each position's pooling weight is
1 + (c_t - stop_gradient(c_t)): exactly 1, with d weight / d c_t = 1 (`straight_through_weights`); its up-sampling
weight does the same with the count up to and including t.
"""

import jax
import jax.numpy as jnp


def segment_ids(boundaries_BxL, max_segments: int):
  """int32 [B, L]: s_t = the boundaries strictly before t, capped at max_segments - 1 (the merged tail)."""
  if not isinstance(max_segments, int) or max_segments < 2:
    raise ValueError(f"max_segments={max_segments!r} must be an integer >= 2 (one segment that can complete and "
                     "the merged tail).")
  b_BxL = boundaries_BxL.astype(jnp.int32)
  return jnp.minimum(jnp.cumsum(b_BxL, axis=1) - b_BxL, max_segments - 1)


def completed_segments(boundaries_BxL, max_segments: int):
  """int32 [B, L]: r_t = the segments completed at or before t, the boundaries up to and including t, capped at
  max_segments - 1 (the merged tail never completes). Position t reads segment r_t - 1."""
  return jnp.minimum(jnp.cumsum(boundaries_BxL.astype(jnp.int32), axis=1), max_segments - 1)


def segments_holding(ids_BxL, lengths_B=None):
  """int32 [B]: the segments that hold any of a row's first `lengths_B` positions (all of them when None), the
  length of the segment stream a nested dynamic level reads: the slots after them are empty."""
  last_B = ids_BxL.shape[1] - 1 if lengths_B is None else jnp.maximum(lengths_B - 1, 0)
  count_B = jnp.take_along_axis(ids_BxL, jnp.broadcast_to(jnp.asarray(last_B), ids_BxL.shape[:1])[:, None],
                                axis=1)[:, 0] + 1
  return count_B if lengths_B is None else jnp.where(lengths_B > 0, count_B, 0)


def straight_through_weights(boundaries_BxL, inclusive: bool = False):
  """float32 [B, L] of ones whose gradient flows to the boundaries before each position (see the module doc), or
  with `inclusive` (up-sampling's) to those up to and including it."""
  b_BxL = boundaries_BxL.astype(jnp.float32)
  c_BxL = jnp.cumsum(b_BxL, axis=1) - (0.0 if inclusive else b_BxL)
  return 1.0 + (c_BxL - jax.lax.stop_gradient(c_BxL))


def _segment_reduce(reduce, values_BxLx, ids_BxL, max_segments: int):
  """`reduce` (a jax.ops.segment_* op) of each row's values over its segment ids -> [B, M, ...]. Mapped over
  rows (a scatter with a batch dimension), so a batch sharded over devices stays sharded."""
  return jax.vmap(lambda values, ids: reduce(values, ids, num_segments=max_segments))(values_BxLx, ids_BxL)


def pool_segments(x_BxLxD, ids_BxL, max_segments: int, weights_BxL=None):
  """(z [B, M, D] the mean of each segment's vectors (zeros for an empty one), count [B, M] of its positions).
  `weights_BxL` (ones in value, `straight_through_weights`) make it the weighted mean, for their gradients."""
  count_BxM = _segment_reduce(jax.ops.segment_sum, jnp.ones(ids_BxL.shape, jnp.int32), ids_BxL, max_segments)
  w_BxL = jnp.ones(ids_BxL.shape, jnp.float32) if weights_BxL is None else weights_BxL.astype(jnp.float32)
  sum_BxMxD = _segment_reduce(jax.ops.segment_sum, x_BxLxD.astype(jnp.float32) * w_BxL[..., None], ids_BxL,
                              max_segments)
  weight_BxM = _segment_reduce(jax.ops.segment_sum, w_BxL, ids_BxL, max_segments)
  z_BxMxD = sum_BxMxD / jnp.where(count_BxM > 0, weight_BxM, 1.0)[..., None]
  return z_BxMxD.astype(x_BxLxD.dtype), count_BxM


def upsample_segments(y_BxMxD, completed_BxL, weights_BxL=None):
  """[B, L, D]: position t gets y[r_t - 1], the output of the newest segment completed at or before t
  (`completed_segments`; zeros while r_t = 0), times `weights_BxL` when given (ones in value, for their
  gradients)."""
  read_BxL = completed_BxL - 1
  rows_BxLxD = jnp.take_along_axis(y_BxMxD, jnp.maximum(read_BxL, 0)[..., None], axis=1)
  if weights_BxL is not None:
    rows_BxLxD = rows_BxLxD * weights_BxL[..., None].astype(rows_BxLxD.dtype)
  return jnp.where((read_BxL >= 0)[..., None], rows_BxLxD, 0).astype(y_BxMxD.dtype)


def positions_in_segments(starts_BxL, open_size_B=None):
  """int32 [B, L]: each position's index in its segment, t minus the last start at or before t. Before the row's
  first start the count goes on from `open_size_B` (the open segment's size before the row, in cached decoding;
  0 when not given). Only the merged tail differs from the forward pass's count when a cache continues a row, and
  no position reads the tail."""
  length = starts_BxL.shape[1]
  index_L = jnp.arange(length, dtype=jnp.int32)
  last_start_BxL = jax.lax.cummax(jnp.where(starts_BxL.astype(bool), index_L[None, :], -1), axis=1)
  open_B = jnp.zeros(starts_BxL.shape[:1], jnp.int32) if open_size_B is None else open_size_B.astype(jnp.int32)
  return jnp.where(last_start_BxL >= 0, index_L[None, :] - last_start_BxL, open_B[:, None] + index_L[None, :])


def segment_boundary_probs(probs_BxL, boundaries_BxL, ids_BxL, max_segments: int):
  """[B, M]: P_j, the router's probability at the position that closes segment j (H-Net's smoothing weight: how
  sure the cut is); 0 for a segment no boundary closes. `boundaries_BxL` (hard) marks each segment's last
  position."""
  at_boundary_BxL = jnp.where(boundaries_BxL, probs_BxL.astype(jnp.float32), 0.0)
  return _segment_reduce(jax.ops.segment_sum, at_boundary_BxL, ids_BxL, max_segments)


def smooth_step(previous_ybar, y, boundary_prob):
  """One step of H-Net's smoothing, ybar_j = P_j y_j + (1 - P_j) ybar_{j-1}, in float32 (P broadcasts against y)."""
  return boundary_prob * y.astype(jnp.float32) + (1.0 - boundary_prob) * previous_ybar.astype(jnp.float32)


def smooth_segments(y_BxMxD, boundary_probs_BxM):
  """H-Net's smoothing of the segment outputs (`smooth_step` over j, a linear recurrence run as an associative
  scan). A confident boundary (P_j = 1) passes y_j; an unsure one blends in the segment before."""
  p_BxMx1 = boundary_probs_BxM[..., None].astype(jnp.float32)

  def combine(earlier, later):  # (1 - P, P y) pairs compose as affine maps
    decay_a, value_a = earlier
    decay_b, value_b = later
    return decay_a * decay_b, decay_b * value_a + value_b

  _, smoothed_BxMxD = jax.lax.associative_scan(combine, (1.0 - p_BxMx1, p_BxMx1 * y_BxMxD.astype(jnp.float32)),
                                               axis=1)
  return smoothed_BxMxD.astype(y_BxMxD.dtype)
