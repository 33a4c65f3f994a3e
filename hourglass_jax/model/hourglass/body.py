"""The Hourglass body: pre layers -> shorten (shift included) -> inner body -> upsample -> post layers, recursively.

The same module decodes with a cache (`cache`, `position`): a level's cache holds the K/V of its stacks ('pre',
'post', or 'layers' at the center), the last k-1 pre-stack outputs ('buf': with the newest one they are the
shifted window a shortened token summarises), the attention resampling caches ('short', 'up'), the newest
shortened output ('z') and the next level's cache ('inner'). Shortened token j becomes computable at stream entry
jk, so the shortening and the inner level run under `nn.cond(position % k == 0)`: a level at total factor F runs
once every F tokens.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hourglass_jax.model import kv_cache
from hourglass_jax.model.checks import is_checkable
from hourglass_jax.model.hourglass.dynamic import (completed_segments, segment_boundary_probs, segments_holding,
                                                   smooth_segments, smooth_step)
from hourglass_jax.model.hourglass.dynamic_cache import (after_rows, close_segment, join_segment, new_segment_state,
                                                         prefill_segments, take_rows)
from hourglass_jax.model.hourglass.dynamic_level import (DynamicShorten, DynamicUpsample, Segments,
                                                         check_dynamic_level, max_segments)
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions
from hourglass_jax.model.layers import DecoderStack, pad_to
from hourglass_jax.model.hourglass.resampling import Shorten, Upsample


def new_hourglass_cache(cfg: LayerConfig, hierarchy: Hierarchy, shorten: str, upsample: str, batch: int,
                        padded: int, segment_capacity: float = 1.5) -> dict:
  """Empty cache of an Hourglass body for `batch` sequences of `padded` (a multiple of the total
  factor) entries of its input stream."""
  num_pre = hierarchy.levels[0][0]
  if not hierarchy.depth:
    return {"layers": kv_cache.new_stack(cfg, batch, num_pre, padded)}
  cache = {"pre": kv_cache.new_stack(cfg, batch, num_pre, padded),
           "post": kv_cache.new_stack(cfg, batch, hierarchy.post_layers[0], padded)}
  k = hierarchy.relative_factor(0)
  if shorten == "dynamic":  # the inner level's stream: the M segment slots of the forward pass, of which the M-1
    segments = max_segments(padded, k, segment_capacity)  # that can complete are ever written (dynamic_cache.py)
    return dict(cache, z=jnp.zeros((batch, 1, cfg.d_model), cfg.compute_dtype),
                segment=new_segment_state(batch, cfg.d_model, cfg.compute_dtype),
                inner=new_hourglass_cache(cfg, hierarchy.inner(), shorten, upsample, batch, segments,
                                          segment_capacity))
  if upsample != "none":
    cache["buf"] = jnp.zeros((batch, k - 1, cfg.d_model), cfg.compute_dtype)
    cache["z"] = jnp.zeros((batch, 1, cfg.d_model), cfg.compute_dtype)
    cache["inner"] = new_hourglass_cache(cfg, hierarchy.inner(), shorten, upsample, batch, padded // k)
    if shorten.startswith("attention_"):
      cache["short"] = kv_cache.new_kv(cfg, batch, padded)
    if upsample.startswith("attention_"):
      cache["up"] = kv_cache.new_kv(cfg, batch, padded // k)
  return cache


def check_stream(x_BxLxD, cache=None, position=None, outermost: bool = True) -> int | None:
  """Raises ValueError, naming the fix, for an input that is not a float [B, L, D] stream (non-empty: `outermost`;
  a prefill passes an inner level no positions while the prompt completes none of its tokens), or a concrete cached
  `position` outside the cache; returns the cache's entries (None without a cache)."""
  shape = tuple(getattr(x_BxLxD, "shape", ()))
  if len(shape) != 3:
    raise ValueError(f"Hourglass takes a stream x [batch, length, width], got shape {shape}; embed token ids first "
                     "(e.g. nn.Embed) and add a batch axis with x[None] for a single sequence.")
  if not jnp.issubdtype(x_BxLxD.dtype, jnp.floating):
    raise ValueError(f"Hourglass takes a float stream x [batch, length, width], got dtype {x_BxLxD.dtype}: token ids "
                     "go through an embedding (e.g. nn.Embed) first.")
  if outermost and (not shape[1] or not shape[2]):
    raise ValueError(f"Hourglass got an empty stream of shape {shape}; pass at least one position of width >= 1.")
  if cache is None:
    return None
  size = max(leaf.shape[-2] for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
             if getattr(path[-1], "key", None) == "v")
  if position is None:
    if shape[1] > size:
      raise ValueError(f"Hourglass: a prompt of {shape[1]} positions does not fit the cache of {size}; make the cache "
                       "with new_cache(batch, length) for a larger length.")
    return size
  if np.ndim(position) or not jnp.issubdtype(jnp.result_type(position), jnp.integer):
    raise ValueError(f"Hourglass: position={position!r} must be an integer scalar (the entry of x's single row).")
  if is_checkable(position) and not 0 <= int(position) < size:
    raise ValueError(f"Hourglass: position={int(position)} is outside the cache, which holds entries [0, {size}); "
                     "make the cache with new_cache(batch, length) for a larger length.")
  return size


def cache_batch_axes(cache: dict) -> dict:
  """The batch axis of each leaf of an Hourglass cache: 1 in the K/V stacks (layers first), 0 in a dynamic
  level's newest output 'z' and segment state."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: 0 if any(getattr(key, "key", None) in ("z", "segment") for key in path) else 1, cache)


class Hourglass(LayerOptions):
  """x [B, L, D] -> y [B, L, D], causal: y[:, t] depends only on x[:, :t+1]. Any L (padded at the end inside).

  `hierarchy` is the level notation ('2@1 4@3 2@1': 2 layers at full resolution, 4 at 1/3, 2 back at full; a
  single '8@1' is a plain decoder stack); `shorten` and `upsample` pick the resampling methods (see `Shorten`,
  `Upsample`); `outer_factor` is the input stream's own shortening. Block settings: `LayerOptions`. Params: 'pre',
  'shorten', 'inner' (the next level, the same layout), 'upsample', 'post'; or 'layers' for a single level.

  Cached decoding: `cache` from `new_cache` (entries in units of this stream), `position` None to prefill x's
  rows as entries 0.. (a prompt), else the (traced) entry of x's single row; returns (y, cache).

  shorten='dynamic' with boundaries='whitespace' takes `boundaries_BxL` (`whitespace_boundaries(tokens)`), and
  for run bytes whose runs close one segment `runs_BxL` (`byte_mask(tokens, run_bytes)`) beside
  `byte_mask(tokens, boundary_bytes)` as the boundaries: cached decoding needs both to merge runs across steps.
  """
  # A small body to build on (configs/default.py's); ModelConfig's default is the paper's enwik8 model, '5@1 24@3 5@1'.
  hierarchy: str = "2@1 4@3 2@1"
  shorten: str = "attention_avg"
  upsample: str = "attention_repeat"
  outer_factor: int = 1
  boundaries: str = "gumbel"
  segment_capacity: float = 1.5
  gumbel_temperature: float = 0.5
  boundary_loss_weight: float = 1.0
  boundary_vocab: int = 256
  segment_pooling: str = "mean"
  gumbel_evaluation: str = "threshold"

  def new_cache(self, batch: int, length: int, d_model: int) -> dict:
    """Empty decoding cache for `batch` sequences of up to `length` (a multiple of the total factor) positions of
    width `d_model`."""
    hierarchy = parse_hierarchy(self.hierarchy)
    if self.shorten == "dynamic" and hierarchy.depth:
      check_dynamic_level(hierarchy, self.upsample, self.boundaries, "Hourglass.")
    self.check_cache_length(length, hierarchy.total_factor)
    return new_hourglass_cache(self.layer_config(d_model), hierarchy, self.shorten, self.upsample, batch, length,
                               self.segment_capacity)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, cache=None, position=None, boundaries_BxL=None,
               next_tokens_BxL=None, lengths_B=None, runs_BxL=None):
    hierarchy = parse_hierarchy(self.hierarchy)
    size = check_stream(x_BxLxD, cache, position, self.outer_factor == 1)
    options = self.layer_config(x_BxLxD.shape[-1]).options()
    dynamic = self.shorten == "dynamic" and hierarchy.depth
    if cache is not None:
      if dynamic:
        y_BxLxD, cache = self._dynamic_decode(hierarchy, options, x_BxLxD, cache, position, boundaries_BxL,
                                              lengths_B, runs_BxL)
      else:
        y_BxLxD, cache = self._decode(hierarchy, options, x_BxLxD, cache, position)
      if position is not None and self.outer_factor == 1 and not is_checkable(position):
        y_BxLxD = jnp.where((position < 0) | (position >= size), jnp.nan, y_BxLxD)  # as the LM's decode_step
      return y_BxLxD, cache
    if dynamic:
      return self._dynamic(hierarchy, options, x_BxLxD, deterministic, boundaries_BxL, next_tokens_BxL, lengths_B,
                           runs_BxL)
    if not hierarchy.depth:
      return self._stack(hierarchy.levels[0][0], "layers", options)(x_BxLxD, deterministic)
    length = x_BxLxD.shape[1]
    x_BxPxD = pad_to(x_BxLxD, hierarchy.total_factor)
    x_BxPxD = self._stack(hierarchy.levels[0][0], "pre", options)(x_BxPxD, deterministic)
    z_BxQxD = self._shorten(hierarchy, options)(x_BxPxD, deterministic)
    z_BxQxD = self._inner(hierarchy, options)(z_BxQxD, deterministic)
    y_BxPxD = self._upsample(hierarchy, options)(z_BxQxD, x_BxPxD, deterministic)
    y_BxPxD = self._stack(hierarchy.post_layers[0], "post", options)(y_BxPxD, deterministic)
    return y_BxPxD[:, :length]

  def _dynamic(self, hierarchy, options, x_BxLxD, deterministic, boundaries_BxL, next_tokens_BxL, lengths_B,
               runs_BxL):
    """pre stack -> segments -> inner level over them -> each position's last completed segment + x -> post.
    `lengths_B`: a level inside another dynamic one, whose rows hold lengths_B segments, then empty slots."""
    x_BxLxD = self._stack(hierarchy.levels[0][0], "pre", options)(x_BxLxD, deterministic)
    z_BxMxD, segments = self._dynamic_shorten(hierarchy, options)(x_BxLxD, deterministic, boundaries_BxL,
                                                                  next_tokens_BxL=next_tokens_BxL,
                                                                  lengths_B=lengths_B, runs_BxL=runs_BxL)
    z_BxMxD = self._inner(hierarchy, options)(z_BxMxD, deterministic,
                                              lengths_B=segments_holding(segments.ids_BxL, lengths_B))
    y_BxLxD = DynamicUpsample(**options, name="upsample")(z_BxMxD, segments, x_BxLxD)
    return self._stack(hierarchy.post_layers[0], "post", options)(y_BxLxD, deterministic)

  def _predictors(self, hierarchy) -> tuple[str, ...]:
    """The dynamic levels' predictors, this level's first."""
    return check_dynamic_level(hierarchy, self.upsample, self.boundaries, "Hourglass.")

  def _dynamic_shorten(self, hierarchy, options):
    return DynamicShorten(factor=hierarchy.relative_factor(0), boundaries=self._predictors(hierarchy)[0],
                          segment_capacity=self.segment_capacity, gumbel_temperature=self.gumbel_temperature,
                          boundary_loss_weight=self.boundary_loss_weight, vocab_size=self.boundary_vocab,
                          segment_pooling=self.segment_pooling, gumbel_evaluation=self.gumbel_evaluation, **options,
                          name="shorten")

  def _dynamic_decode(self, hierarchy, options, x_BxTxD, cache, position, boundaries_BxT, lengths_B, runs_BxT):
    """`_dynamic` with a cache (dynamic_cache.py): a prompt pools its segments and runs the inner level over them at
    once; a token joins the open segment, closes it when its boundary says so, and reads the newest completed one.
    A prompt's `lengths_B` (a level inside another dynamic one) are its rows' token counts."""
    length = x_BxTxD.shape[1]
    index_T = (0 if position is None else position) + jnp.arange(length)
    cache = dict(cache)
    x_BxTxD, cache["pre"] = self._stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"],
                                                                                  index_T)
    b_BxT, probs_BxT, updates, pooled_BxTxD = self._dynamic_shorten(hierarchy, options)(
        x_BxTxD, True, boundaries_BxT, previous=cache["segment"], positions_L=index_T, runs_BxL=runs_BxT)
    state = after_rows(cache["segment"], updates, lengths_B)  # what the predictor keeps of the last token
    num_segments = max_segments(kv_cache.size(cache["pre"]), hierarchy.relative_factor(0), self.segment_capacity)
    smooth = self._predictors(hierarchy)[0] == "routing"
    if position is None:
      if lengths_B is not None:
        b_BxT &= jnp.arange(length)[None, :] < lengths_B[:, None]
      z_BxNxD, ids_BxT, opened = prefill_segments(pooled_BxTxD, b_BxT, num_segments, lengths_B)
      y_BxNxD, cache["inner"] = self._inner(hierarchy, options)(z_BxNxD, True, cache["inner"], None,
                                                                lengths_B=opened["completed"])
      if smooth:
        boundary_probs_BxM = segment_boundary_probs(probs_BxT, b_BxT, ids_BxT, num_segments)
        y_BxNxD = smooth_segments(y_BxNxD, boundary_probs_BxM[:, :y_BxNxD.shape[1]])
      completed_B = opened["completed"]
      cache["z"] = jnp.take_along_axis(y_BxNxD, jnp.maximum(completed_B - 1, 0)[:, None, None], axis=1)
      state.update(opened)
      completed_BxT = completed_segments(b_BxT, num_segments)
    else:
      state, closes_B, mean_Bx1xD = close_segment(join_segment(state, pooled_BxTxD), b_BxT[:, 0], num_segments)
      entry_B = state["completed"] - 1
      cache["z"], cache["inner"] = self._close_segments(hierarchy, options, closes_B, mean_Bx1xD, entry_B,
                                                        probs_BxT[:, 0] if smooth else None, cache["z"],
                                                        cache["inner"])
      y_BxNxD, completed_BxT = cache["z"], jnp.minimum(state["completed"], 1)[:, None]
    cache["segment"] = state
    y_BxTxD = DynamicUpsample(**options, name="upsample")(y_BxNxD, Segments(None, completed_BxT, None), x_BxTxD)
    y_BxTxD, cache["post"] = self._stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                     index_T)
    return y_BxTxD, cache

  def _close_segments(self, hierarchy, options, closes_B, mean_Bx1xD, entry_B, closed_prob_B, z_Bx1xD, inner):
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
    axes = cache_batch_axes(inner)
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
          y_Cx1xD = smooth_step(z_Bx1xD[rows_C], y_Cx1xD, closed_prob_B[rows_C][:, None, None]).astype(
              z_Bx1xD.dtype)
        y_Cx1xD = take_rows(valid_C, y_Cx1xD, z_Bx1xD[rows_C])

        def write_back(a, new_Cx, axis):  # in place, a row at a time; a chunk's unused rows keep their cache
          for i in range(rows_C.shape[0]):
            a = lax.dynamic_update_slice_in_dim(a, jnp.where(valid_C[i], new_Cx[i], row(a, axis, i)), rows_C[i], axis)
          return a
        return z_Bx1xD.at[rows_C].set(y_Cx1xD), each(write_back, inner, new)
      return run

    for start in range(0, batch, size):
      z_Bx1xD, inner = nn.cond(count > start, chunk(start), lambda module, z, inner: (z, inner), self, z_Bx1xD,
                               inner)
    return z_Bx1xD, inner

  def _stack(self, num_layers: int, name: str, options):
    return DecoderStack(num_layers=num_layers, factor=self.outer_factor, **options, name=name)

  def _shorten(self, hierarchy, options):
    return Shorten(factor=hierarchy.relative_factor(0), method=self.shorten, outer_factor=self.outer_factor,
                   **options, name="shorten")

  def _inner(self, hierarchy, options):
    dynamic = {}
    if self.shorten == "dynamic" and hierarchy.depth > 1:  # the next levels' predictors and settings
      dynamic = dict(boundaries=",".join(self._predictors(hierarchy)[1:]), segment_capacity=self.segment_capacity,
                     gumbel_temperature=self.gumbel_temperature, boundary_loss_weight=self.boundary_loss_weight,
                     boundary_vocab=self.boundary_vocab, segment_pooling=self.segment_pooling,
                     gumbel_evaluation=self.gumbel_evaluation)
    return Hourglass(hierarchy=str(hierarchy.inner()), shorten=self.shorten, upsample=self.upsample,
                     outer_factor=self.outer_factor * hierarchy.relative_factor(0), **dynamic, **options,
                     name="inner")

  def _upsample(self, hierarchy, options):
    return Upsample(factor=hierarchy.relative_factor(0), method=self.upsample, outer_factor=self.outer_factor,
                    **options, name="upsample")

  def _decode(self, hierarchy, options, x_BxTxD, cache, position):
    """The level's cached forward: pre stack, the shortened path when a token completes, upsample, post stack."""
    length = x_BxTxD.shape[1]
    start = 0 if position is None else position
    index_T = start + jnp.arange(length)
    cache = dict(cache)
    if not hierarchy.depth:
      x_BxTxD, cache["layers"] = self._stack(hierarchy.levels[0][0], "layers", options)(
          x_BxTxD, True, cache["layers"], index_T)
      return x_BxTxD, cache
    x_BxTxD, cache["pre"] = self._stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"],
                                                                                  index_T)
    y_BxTxD = x_BxTxD
    if self.upsample != "none":
      k = hierarchy.relative_factor(0)
      window_BxWxD, cache["buf"] = kv_cache.shift_in(cache["buf"], x_BxTxD)  # shifted stream entries start-k+1 ..

      def advance(module, sub, window_BxWxD, j):
        """Shortened tokens from j (all the prompt completes when `position` is None) through the inner level."""
        j0 = 0 if j is None else j
        z_BxNxD, short = module._shorten(hierarchy, options)(window_BxWxD, True, sub.get("short"), j0)
        z_BxNxD, inner = module._inner(hierarchy, options)(z_BxNxD, True, sub["inner"], j)
        sub = dict(sub, inner=inner, z=z_BxNxD[:, -1:])
        if short is not None:
          sub["short"] = short
        return z_BxNxD, sub

      sub = {name: cache[name] for name in ("short", "inner", "z") if name in cache}
      if position is None:
        z_BxNxD, sub = advance(self, sub, window_BxWxD[:, :kv_cache.num_coarse(length, k) * k], None)
      else:
        sub = nn.cond(position % k == 0, lambda module, sub, w, j: advance(module, sub, w, j)[1],
                      lambda module, sub, w, j: sub, self, sub, window_BxWxD, position // k)
        z_BxNxD = sub["z"]
      cache.update(sub)
      y_BxTxD, up = self._upsample(hierarchy, options)(z_BxNxD, x_BxTxD, True, cache.get("up"), start)
      if up is not None:
        cache["up"] = up
    y_BxTxD, cache["post"] = self._stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                     index_T)
    return y_BxTxD, cache
