"""A dynamic Hourglass level of the body (shorten='dynamic'): its forward pass, its cached decoding and its cache
entries. `body` is the Hourglass module whose level this is: it builds the level's modules (`stack`, ...)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import kv_cache
from hourglass_jax.model.hourglass.dynamic import cache as dynamic_cache
from hourglass_jax.model.hourglass.dynamic.segments import segments_holding, smooth_segments
from hourglass_jax.model.hourglass.dynamic.level import BoundaryPredictor, Segments, max_segments


def level_cache(cfg, hierarchy, batch: int, padded: int, segment_capacity: float, predictor: type[BoundaryPredictor]):
  """(this level's cache entries: the per-position segment state with what `predictor` keeps, and per segment its
  mean, boundary probability and output (cache.py); the inner level's stream length: the M segment slots of
  the forward pass, of which the M-1 that can complete are ever read)."""
  num = max_segments(padded, hierarchy.relative_factor(0), segment_capacity)
  dtype = cfg.compute_dtype
  state = dynamic_cache.new_level_state(batch, padded, cfg.d_model, predictor.new_state(batch, cfg.d_model, dtype))
  entries = dict(state=state, means=jnp.zeros((batch, num, cfg.d_model), dtype),
                 probs=jnp.zeros((batch, num), jnp.float32), ybar=jnp.zeros((batch, num, cfg.d_model), dtype))
  return entries, num


def forward(body, hierarchy, options, x_BxLxD, deterministic, lengths_B=None, **inputs):
  """pre stack -> segments -> inner level over them -> each position's last completed segment + x -> post;
  returns (y, what the post stack reads). `lengths_B`: a level inside another dynamic one, whose rows hold lengths_B
  segments, then empty slots."""
  x_BxLxD = body.stack(hierarchy.levels[0][0], "pre", options)(x_BxLxD, deterministic)
  z_BxMxD, segments = body.shortening(hierarchy, options)(x_BxLxD, deterministic, lengths_B=lengths_B,
                                                                **inputs)
  z_BxMxD = body.inner_level(hierarchy, options)(z_BxMxD, deterministic,
                                            lengths_B=segments_holding(segments.ids_BxL, lengths_B))
  y_BxLxD = body.upsampling(hierarchy, options)(z_BxMxD, segments, x_BxLxD)
  return body.stack(hierarchy.post_layers[0], "post", options)(y_BxLxD, deterministic), y_BxLxD


def decode(body, hierarchy, options, x_BxTxD, cache, start, **inputs):
  """`forward` with a cache (cache.py) for x's T rows at stream entries start..: the tokens join and close
  segments in order, the segments they close go through the inner level together, and each token reads the newest
  segment completed at or before it. `start` is one entry for every row or int [B]; returns (y, cache, what the
  post stack reads)."""
  length = x_BxTxD.shape[1]
  index_T = kv_cache.entries(start, length)
  cache = dict(cache)
  x_BxTxD, cache["pre"] = body.stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"], index_T)
  previous = dynamic_cache.state_before(cache["state"], start)
  b_BxT, probs_BxT, updates, pooled_BxTxD = body.shortening(hierarchy, options)(
      x_BxTxD, True, previous=previous, positions_L=index_T, **inputs)
  num = cache["means"].shape[1]
  after, closes_BxT, mean_BxTxD = dynamic_cache.add_tokens(previous, pooled_BxTxD, b_BxT, num)
  cache["state"] = dynamic_cache.write_state(cache["state"], dict(after, **updates), start)
  count = min(length, num - 1)  # slots for the segments the rows close (at most one per token)
  closed_B = closes_BxT.sum(axis=1)
  first_B = jnp.minimum(previous["completed"], num - count)  # so that the slots fit; earlier ones recompute
  smooths = probs_BxT is not None  # H-Net's smoothing ('routing')
  probs_BxT = jnp.zeros(b_BxT.shape, jnp.float32) if probs_BxT is None else probs_BxT.astype(jnp.float32)
  mean_BxNxD, prob_BxN = dynamic_cache.closed_in_order(closes_BxT, count, mean_BxTxD, probs_BxT)
  for name, rows in (("means", mean_BxNxD), ("probs", prob_BxN)):
    cache[name] = dynamic_cache.put_rows(cache[name], rows, previous["completed"], closed_B)
  z_BxNxD = dynamic_cache.take_rows(cache["means"], first_B, count)
  y_BxNxD, cache["inner"] = run_inner(body, hierarchy, options, z_BxNxD, first_B, closed_B > 0, cache["inner"],
                                      shared_first=0 if isinstance(start, int) and start == 0 else None)
  if smooths:
    y_BxNxD = _smoothed(cache, y_BxNxD, first_B, count)
  old_BxNxD = dynamic_cache.take_rows(cache["ybar"], first_B, count)
  y_BxNxD = jnp.where((closed_B > 0)[:, None, None], y_BxNxD.astype(old_BxNxD.dtype), old_BxNxD)
  cache["ybar"] = dynamic_cache.put_rows(cache["ybar"], y_BxNxD, first_B)
  y_BxTxD = body.upsampling(hierarchy, options)(cache["ybar"], Segments(None, after["completed"], None), x_BxTxD)
  out_BxTxD, cache["post"] = body.stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                     index_T)
  return out_BxTxD, cache, y_BxTxD


def _smoothed(cache, y_BxNxD, first_B, count: int):
  """H-Net's smoothing of the slots' outputs, on from the stored output of the entry before them (zeros before
  entry 0), by the stored boundary probabilities."""
  before_BxD = jnp.where((first_B > 0)[:, None], dynamic_cache.take_rows(cache["ybar"], jnp.maximum(first_B - 1, 0),
                                                                          1)[:, 0], 0)
  probs_BxN = dynamic_cache.take_rows(cache["probs"], first_B, count)
  y_Bx1NxD = jnp.concatenate([before_BxD[:, None].astype(y_BxNxD.dtype), y_BxNxD], axis=1)
  probs_Bx1N = jnp.concatenate([jnp.ones_like(probs_BxN[:, :1]), probs_BxN], axis=1)
  return smooth_segments(y_Bx1NxD, probs_Bx1N)[:, 1:]


def _batch_axis(path) -> int:
  """The batch axis of an inner cache leaf: 1 in the K/V stacks (layers first), 0 elsewhere."""
  return 1 if any(getattr(key, "key", None) in ("pre", "post", "layers") for key in path) else 0


def run_inner(body, hierarchy, options, z_BxNxD, first_B, active_B, inner, shared_first=None):
  """The inner level on each row's N slots at its entries first_B.. (`shared_first`: the same static entry for
  every row), for the `active_B` rows; returns (outputs [B, N, D], only meaningful for active rows, inner cache).

  A shared entry (a prompt's) runs as one call, a single row as one call under nn.cond. Rows
  at their own entries run row by row (a vmap), the active ones first, in chunks of C = ceil(B N / k) rows (about
  the rows that close a segment per step at the target rate), each chunk under `nn.cond` (run while active rows
  remain), so a step costs C rows of the inner level per chunk it needs rather than all B. A chunk's cache rows are
  sliced out and written back one row at a time, with the rows axis first for the vmap: a gather over the batch
  axis and the vmap's axis moves copied the whole chunk's cache several times a step
  (benchmarks/dynamic_decode.py)."""
  batch, slots = z_BxNxD.shape[:2]
  inner_level = lambda module, z, inner, first: module.inner_level(hierarchy, options)(z, True, inner, first)
  if shared_first is not None:  # a prompt: also makes the relative-position tables, so not under a cond
    return inner_level(body, z_BxNxD, inner, shared_first)
  if batch == 1:
    return nn.cond(active_B[0], inner_level, lambda module, z, inner, first: (z, inner), body, z_BxNxD, inner,
                   first_B[0])
  size = min(batch, -(-batch * slots // hierarchy.relative_factor(0)))
  order_B = jnp.argsort(~active_B, stable=True)
  count = active_B.sum()
  axes = jax.tree_util.tree_map_with_path(lambda path, _: _batch_axis(path), inner)
  each = lambda f, *trees: jax.tree.map(f, *trees, axes)
  rows = nn.vmap(inner_level, variable_axes={"params": None, "tables": None}, split_rngs={"params": False},
                 in_axes=0, out_axes=0)

  def chunk(start: int):
    def run(module, y_BxNxD, inner):
      rows_C = order_B[start:start + size]
      valid_C = start + jnp.arange(rows_C.shape[0]) < count
      row = lambda a, axis, i: lax.dynamic_slice_in_dim(a, rows_C[i], 1, axis)  # its batch axis kept, size 1
      picked = each(lambda a, axis: jnp.stack([row(a, axis, i) for i in range(rows_C.shape[0])]), inner)
      y_Cx1xNxD, new = rows(module, z_BxNxD[rows_C][:, None], picked, first_B[rows_C])

      def write_back(a, new_Cx, axis):  # in place, a row at a time; a chunk's unused rows keep their cache
        for i in range(rows_C.shape[0]):
          a = lax.dynamic_update_slice_in_dim(a, jnp.where(valid_C[i], new_Cx[i], row(a, axis, i)), rows_C[i], axis)
        return a
      return y_BxNxD.at[rows_C].set(y_Cx1xNxD[:, 0].astype(y_BxNxD.dtype)), each(write_back, inner, new)
    return run

  y_BxNxD = z_BxNxD
  for start in range(0, batch, size):
    y_BxNxD, inner = nn.cond(count > start, chunk(start), lambda module, y, inner: (y, inner), body, y_BxNxD, inner)
  return y_BxNxD, inner
