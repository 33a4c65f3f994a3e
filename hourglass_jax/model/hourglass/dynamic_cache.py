"""The running segment of a dynamically shortened level during cached decoding (dynamic.py has the segments of a
whole sequence).

Per row the state holds 'completed' (segments closed so far, capped at M-1: the merged tail never closes), and the
float32 'sum' and 'size' of the open segment. A token adds itself to the open segment; when its boundary closes it
(and it is not the merged tail), the segment's mean goes through the inner level as entry 'completed' and the
count advances. Rows close segments at different tokens, so the inner level runs row by row (a vmap) whenever
any row closes one, and only the closing rows keep its result. With M from the cache length, decoding equals the
forward pass over that many positions.
"""

import jax
import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic import pool_segments, segment_ids


def new_segment_state(batch: int, d_model: int) -> dict:
  return {"sum": jnp.zeros((batch, d_model), jnp.float32), "size": jnp.zeros((batch,), jnp.int32),
          "completed": jnp.zeros((batch,), jnp.int32)}


def prefill_segments(x_BxPxD, boundaries_BxP, max_segments: int):
  """A prompt's segments: (means [B, N, D] of the first N = min(P, M-1) segments, the ones a prompt of P tokens
  can complete; ids [B, P]; the state after it)."""
  length = x_BxPxD.shape[1]
  ids_BxP = segment_ids(boundaries_BxP, max_segments)
  z_BxMxD, _ = pool_segments(x_BxPxD, ids_BxP, max_segments)
  completed_B = jnp.minimum(boundaries_BxP.astype(jnp.int32).sum(axis=1), max_segments - 1)
  open_BxP = ids_BxP == completed_B[:, None]  # the positions after the last boundary
  state = {"sum": jnp.einsum("bp,bpd->bd", open_BxP.astype(jnp.float32), x_BxPxD.astype(jnp.float32)),
           "size": open_BxP.sum(axis=1, dtype=jnp.int32), "completed": completed_B}
  return z_BxMxD[:, :min(length, max_segments - 1)], ids_BxP, state


def add_token(state: dict, x_Bx1xD, boundary_B, max_segments: int):
  """(state with the token in its open segment, closes [B]: its boundary closes a segment that is not the tail,
  the mean [B, 1, D] of that segment)."""
  total_BxD = state["sum"] + x_Bx1xD[:, 0].astype(jnp.float32)
  size_B = state["size"] + 1
  closes_B = boundary_B & (state["completed"] < max_segments - 1)
  mean_Bx1xD = (total_BxD / size_B[:, None].astype(jnp.float32))[:, None].astype(x_Bx1xD.dtype)
  state = {"sum": jnp.where(closes_B[:, None], 0.0, total_BxD), "size": jnp.where(closes_B, 0, size_B),
           "completed": state["completed"] + closes_B.astype(jnp.int32)}
  return state, closes_B, mean_Bx1xD


def take_rows(closes_B, new, old, batch_axis: int = 0):
  """`new` in the rows that close a segment, `old` elsewhere (trees; `batch_axis` of their leaves)."""
  def pick(a, b):
    shape = [1] * a.ndim
    shape[batch_axis] = a.shape[batch_axis]
    return jnp.where(closes_B.reshape(shape), a, b)
  return jax.tree.map(pick, new, old)
