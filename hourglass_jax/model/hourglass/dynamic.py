"""Dynamic shortening: segments of variable length from per-position boundary decisions (dynamic token pooling,
Nawrot et al. 2023), exactly causal and with static shapes under jit.

A boundary at position t closes the segment that contains t. Position t lies in segment s_t = the number of
boundaries strictly before t (a cumulative sum, no host round-trip). A row holds at most `max_segments` (M)
segments: every position from segment M-1 on belongs to segment M-1, the merged tail, which is never read. Segment
j < M-1 completes at its last position e_j (its boundary); position t reads the output of the last segment
completed strictly before it, j = s_t - 1 (nothing while s_t = 0), so it depends only on positions < t.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Bytes after which the 'whitespace' predictor closes a segment: space, newline, tab and ASCII punctuation.
WHITESPACE_BYTES = b" \n\t" + bytes(sorted(set(b".,;:!?\"'()[]{}-/")))


def whitespace_boundaries(tokens_BxL, boundary_bytes: bytes = WHITESPACE_BYTES):
  """bool [B, L]: a boundary after every byte of `boundary_bytes` (the parameter-free 'whitespace' predictor)."""
  table_V = np.zeros(256, bool)
  table_V[list(boundary_bytes)] = True
  return jnp.asarray(table_V)[jnp.clip(tokens_BxL, 0, 255)] & (tokens_BxL >= 0) & (tokens_BxL < 256)


def segment_ids(boundaries_BxL, max_segments: int):
  """int32 [B, L]: s_t = the boundaries strictly before t, capped at max_segments - 1 (the merged tail)."""
  if not isinstance(max_segments, int) or max_segments < 2:
    raise ValueError(f"max_segments={max_segments!r} must be an integer >= 2 (one segment that can complete and "
                     "the merged tail).")
  b_BxL = boundaries_BxL.astype(jnp.int32)
  return jnp.minimum(jnp.cumsum(b_BxL, axis=1) - b_BxL, max_segments - 1)


def _segment_reduce(reduce, values_BxLx, ids_BxL, max_segments: int):
  """`reduce` (a jax.ops.segment_* op) of each row's values over its segment ids -> [B, M, ...]."""
  batch = ids_BxL.shape[0]
  flat_ids = (ids_BxL + max_segments * jnp.arange(batch)[:, None]).reshape(-1)
  flat = values_BxLx.reshape(flat_ids.shape[0], *values_BxLx.shape[2:])
  out = reduce(flat, flat_ids, num_segments=batch * max_segments)
  return out.reshape(batch, max_segments, *values_BxLx.shape[2:])


def pool_segments(x_BxLxD, ids_BxL, max_segments: int):
  """(z [B, M, D] the mean of each segment's vectors (zeros for an empty one), count [B, M] of its positions)."""
  count_BxM = _segment_reduce(jax.ops.segment_sum, jnp.ones(ids_BxL.shape, jnp.int32), ids_BxL, max_segments)
  sum_BxMxD = _segment_reduce(jax.ops.segment_sum, x_BxLxD.astype(jnp.float32), ids_BxL, max_segments)
  z_BxMxD = sum_BxMxD / jnp.maximum(count_BxM, 1)[..., None]
  return z_BxMxD.astype(x_BxLxD.dtype), count_BxM


def segment_ends(boundaries_BxL, ids_BxL, max_segments: int):
  """(position [B, M] of each segment's last position e_j, completed [B, M]): a segment j < M-1 completes at its
  boundary. An incomplete segment (empty, the open last one, the merged tail) gets the row length as position."""
  length = boundaries_BxL.shape[1]
  closing_BxL = jnp.where(boundaries_BxL, jnp.arange(length)[None, :], -1)
  end_BxM = _segment_reduce(jax.ops.segment_max, closing_BxL, ids_BxL, max_segments)
  completed_BxM = (end_BxM >= 0) & (jnp.arange(max_segments) < max_segments - 1)[None, :]
  return jnp.where(completed_BxM, end_BxM, length), completed_BxM


def upsample_segments(y_BxMxD, ids_BxL):
  """[B, L, D]: position t gets y[s_t - 1], the output of the last segment completed strictly before t (zeros
  while s_t = 0)."""
  read_BxL = ids_BxL - 1
  rows_BxLxD = jnp.take_along_axis(y_BxMxD, jnp.maximum(read_BxL, 0)[..., None], axis=1)
  return jnp.where((read_BxL >= 0)[..., None], rows_BxLxD, 0).astype(y_BxMxD.dtype)
