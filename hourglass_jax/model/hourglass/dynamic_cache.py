"""The running segment of a dynamically shortened level during cached decoding (dynamic.py has the segments of a
whole sequence).

Per row the state holds 'completed' (segments closed so far, capped at M-1: the merged tail never closes), the
float32 'sum' and 'size' of the open segment, and what the level's predictor keeps of the token before (its
`new_state`, predictors/).

A token first joins the open segment. If its boundary b_t closes the segment and the open one is not the merged
tail, the segment's mean goes through the inner level as entry 'completed'. Rows close segments at different
tokens, so the inner level runs row by row (a vmap), for the closing rows only, gathered in chunks
(`dynamic_body.close_segments`). The token then reads the newest completed segment's output, its own segment's when
it closed one. With M counted from the cache length, decoding equals the forward pass over that many positions.
"""

import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic import completed_segments, pool_segments, segment_ids


def new_segment_state(batch: int, d_model: int) -> dict:
  return {"sum": jnp.zeros((batch, d_model), jnp.float32), "size": jnp.zeros((batch,), jnp.int32),
          "completed": jnp.zeros((batch,), jnp.int32)}


def prefill_segments(x_BxPxD, boundaries_BxP, max_segments: int, lengths_B=None):
  """A prompt's segments: (means [B, N, D] of the first N = min(P, M-1) segments, the ones a prompt of P tokens
  can complete; ids [B, P]; the state's 'sum', 'size' and 'completed' after it). With `lengths_B` a row's prompt is
  its first lengths_B tokens (no boundary may lie past them): the rest neither joins nor closes a segment."""
  length = x_BxPxD.shape[1]
  ids_BxP = segment_ids(boundaries_BxP, max_segments)
  z_BxMxD, _ = pool_segments(x_BxPxD, ids_BxP, max_segments)
  completed_B = completed_segments(boundaries_BxP, max_segments)[:, -1]
  open_BxP = ids_BxP == completed_B[:, None]  # the positions after the last boundary
  if lengths_B is not None:
    open_BxP &= jnp.arange(length)[None, :] < lengths_B[:, None]
  state = {"sum": jnp.einsum("bp,bpd->bd", open_BxP.astype(jnp.float32), x_BxPxD.astype(jnp.float32)),
           "size": open_BxP.sum(axis=1, dtype=jnp.int32), "completed": completed_B}
  return z_BxMxD[:, :min(length, max_segments - 1)], ids_BxP, state


def after_rows(state: dict, updates: dict, lengths_B=None) -> dict:
  """`state` with what the predictor keeps of a row's last token: `updates` ([B, T, ...] after each token) at token
  lengths_B - 1 (the last, when None); a row of no tokens keeps its `state`."""
  if lengths_B is None:
    return dict(state, **{name: value[:, -1] for name, value in updates.items()})

  def pick(name, value_BxT):
    last_B = jnp.maximum(lengths_B - 1, 0)
    row = jnp.take_along_axis(value_BxT, last_B.reshape((-1, 1) + (1,) * (value_BxT.ndim - 2)), axis=1)[:, 0]
    return jnp.where((lengths_B > 0).reshape((-1,) + (1,) * (row.ndim - 1)), row, state[name])
  return dict(state, **{name: pick(name, value) for name, value in updates.items()})


def add_token(state: dict, x_Bx1xD, boundary_B, max_segments: int):
  """(state once the token x joins the open segment and its boundary closes it, closes [B]: the segment closed (it
  is not the tail), its mean [B, 1, D] in float32)."""
  state = dict(state, sum=state["sum"] + x_Bx1xD[:, 0].astype(jnp.float32), size=state["size"] + 1)
  closes_B = boundary_B & (state["completed"] < max_segments - 1)
  mean_BxD = state["sum"] / jnp.maximum(state["size"], 1)[:, None].astype(jnp.float32)
  new = dict(state, sum=jnp.where(closes_B[:, None], 0.0, state["sum"]), size=jnp.where(closes_B, 0, state["size"]),
             completed=state["completed"] + closes_B.astype(jnp.int32))
  return new, closes_B, mean_BxD[:, None]
