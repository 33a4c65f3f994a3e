"""A dynamic Hourglass level of the body (shorten='dynamic'): its forward pass, its cached decoding and its cache
entries. `body` is the Hourglass module whose level this is: it builds the stacks and the inner level."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import kv_cache
from hourglass_jax.model.hourglass.dynamic import (completed_segments, segment_boundary_probs, segments_holding,
                                                   smooth_segments, smooth_step)
from hourglass_jax.model.hourglass.dynamic_cache import add_token, after_rows, new_segment_state, prefill_segments
from hourglass_jax.model.hourglass.dynamic_level import DynamicUpsample, Segments, max_segments
from hourglass_jax.model.hourglass.predictors import resolve


def level_cache(cfg, hierarchy, batch: int, padded: int, segment_capacity: float, predictor: str):
  """(this level's cache entries: the newest output 'z' and the segment state with what `predictor` keeps, the
  inner level's stream length: the M segment slots of the forward pass, of which the M-1 that can complete are ever
  written)."""
  state = dict(new_segment_state(batch, cfg.d_model), **resolve(predictor)[0].new_state(batch, cfg.d_model,
                                                                                        cfg.compute_dtype))
  entries = dict(z=jnp.zeros((batch, 1, cfg.d_model), cfg.compute_dtype), segment=state)
  return entries, max_segments(padded, hierarchy.relative_factor(0), segment_capacity)


def forward(body, hierarchy, options, x_BxLxD, deterministic, lengths_B=None, **inputs):
  """pre stack -> segments -> inner level over them -> each position's last completed segment + x -> post.
  `lengths_B`: a level inside another dynamic one, whose rows hold lengths_B segments, then empty slots."""
  x_BxLxD = body._stack(hierarchy.levels[0][0], "pre", options)(x_BxLxD, deterministic)
  z_BxMxD, segments = body._dynamic_shorten(hierarchy, options)(x_BxLxD, deterministic, lengths_B=lengths_B,
                                                                **inputs)
  z_BxMxD = body._inner(hierarchy, options)(z_BxMxD, deterministic,
                                            lengths_B=segments_holding(segments.ids_BxL, lengths_B))
  y_BxLxD = DynamicUpsample(**options, name="upsample")(z_BxMxD, segments, x_BxLxD)
  return body._stack(hierarchy.post_layers[0], "post", options)(y_BxLxD, deterministic)


def decode(body, hierarchy, options, x_BxTxD, cache, position, lengths_B=None, **inputs):
  """`forward` with a cache (dynamic_cache.py): a prompt pools its segments and runs the inner level over them at
  once; a token joins the open segment, closes it when its boundary says so, and reads the newest completed one.
  A prompt's `lengths_B` (a level inside another dynamic one) are its rows' token counts."""
  length = x_BxTxD.shape[1]
  index_T = (0 if position is None else position) + jnp.arange(length)
  cache = dict(cache)
  x_BxTxD, cache["pre"] = body._stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"], index_T)
  b_BxT, probs_BxT, updates, pooled_BxTxD = body._dynamic_shorten(hierarchy, options)(
      x_BxTxD, True, previous=cache["segment"], positions_L=index_T, **inputs)
  state = after_rows(cache["segment"], updates, lengths_B)  # what the predictor keeps of the last token
  num_segments = max_segments(kv_cache.size(cache["pre"]), hierarchy.relative_factor(0), body.segment_capacity)
  if position is None:
    if lengths_B is not None:
      b_BxT &= jnp.arange(length)[None, :] < lengths_B[:, None]
    z_BxNxD, ids_BxT, opened = prefill_segments(pooled_BxTxD, b_BxT, num_segments, lengths_B)
    y_BxNxD, cache["inner"] = body._inner(hierarchy, options)(z_BxNxD, True, cache["inner"], None,
                                                              lengths_B=opened["completed"])
    if probs_BxT is not None:
      boundary_probs_BxM = segment_boundary_probs(probs_BxT, b_BxT, ids_BxT, num_segments)
      y_BxNxD = smooth_segments(y_BxNxD, boundary_probs_BxM[:, :y_BxNxD.shape[1]])
    completed_B = opened["completed"]
    cache["z"] = jnp.take_along_axis(y_BxNxD, jnp.maximum(completed_B - 1, 0)[:, None, None], axis=1)
    state.update(opened)
    completed_BxT = completed_segments(b_BxT, num_segments)
  else:
    state, closes_B, mean_Bx1xD = add_token(state, pooled_BxTxD, b_BxT[:, 0], num_segments)
    entry_B = state["completed"] - 1
    cache["z"], cache["inner"] = close_segments(body, hierarchy, options, closes_B, mean_Bx1xD, entry_B,
                                                None if probs_BxT is None else probs_BxT[:, 0], cache["z"],
                                                cache["inner"])
    y_BxNxD, completed_BxT = cache["z"], jnp.minimum(state["completed"], 1)[:, None]
  cache["segment"] = state
  y_BxTxD = DynamicUpsample(**options, name="upsample")(y_BxNxD, Segments(None, completed_BxT, None), x_BxTxD)
  y_BxTxD, cache["post"] = body._stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                   index_T)
  return y_BxTxD, cache


def close_segments(body, hierarchy, options, closes_B, mean_Bx1xD, entry_B, closed_prob_B, z_Bx1xD, inner):
  """Runs the closing rows' segment means through the inner level, each at its own cache entry: the rows that
  close come first, in chunks of C = ceil(B / k) rows (about the rows that close per step at the target rate),
  each chunk under `nn.cond` (run while rows remain), so a step costs C rows of the inner level for each chunk
  it needs rather than all B. A chunk's cache rows are sliced out and written back one row at a time, with the
  rows axis first for the vmap: a gather over the batch axis and the vmap's axis moves copied the whole chunk's
  cache several times a step (benchmarks/dynamic_decode.py). Returns the newest outputs z [B, 1, D] and the inner
  cache."""
  batch = closes_B.shape[0]
  size = -(-batch // hierarchy.relative_factor(0))
  order_B = jnp.argsort(~closes_B, stable=True)
  count = closes_B.sum()
  # each leaf's batch axis: 1 in the K/V stacks (layers first), 0 in a dynamic level's newest output 'z' and state
  axes = jax.tree_util.tree_map_with_path(
      lambda path, _: 0 if any(getattr(key, "key", None) in ("z", "segment") for key in path) else 1, inner)
  each = lambda f, *trees: jax.tree.map(f, *trees, axes)
  rows = nn.vmap(lambda module, z_1x1xD, inner, entry: module._inner(hierarchy, options)(z_1x1xD, True, inner,
                                                                                         entry),
                 variable_axes={"params": None, "tables": None}, split_rngs={"params": False},
                 in_axes=0, out_axes=0)

  def chunk(start: int):
    def run(module, z_Bx1xD, inner):
      rows_C = order_B[start:start + size]
      valid_C = start + jnp.arange(rows_C.shape[0]) < count
      row = lambda a, axis, i: lax.dynamic_slice_in_dim(a, rows_C[i], 1, axis)  # its batch axis kept, size 1
      picked = each(lambda a, axis: jnp.stack([row(a, axis, i) for i in range(rows_C.shape[0])]), inner)
      y_Cx1x1xD, new = rows(module, mean_Bx1xD[rows_C][:, None].astype(z_Bx1xD.dtype), picked, entry_B[rows_C])
      y_Cx1xD = y_Cx1x1xD[:, 0]
      if closed_prob_B is not None:
        y_Cx1xD = smooth_step(z_Bx1xD[rows_C], y_Cx1xD, closed_prob_B[rows_C][:, None, None]).astype(z_Bx1xD.dtype)
      y_Cx1xD = jnp.where(valid_C[:, None, None], y_Cx1xD, z_Bx1xD[rows_C])

      def write_back(a, new_Cx, axis):  # in place, a row at a time; a chunk's unused rows keep their cache
        for i in range(rows_C.shape[0]):
          a = lax.dynamic_update_slice_in_dim(a, jnp.where(valid_C[i], new_Cx[i], row(a, axis, i)), rows_C[i], axis)
        return a
      return z_Bx1xD.at[rows_C].set(y_Cx1xD), each(write_back, inner, new)
    return run

  for start in range(0, batch, size):
    z_Bx1xD, inner = nn.cond(count > start, chunk(start), lambda module, z, inner: (z, inner), body, z_Bx1xD, inner)
  return z_Bx1xD, inner
