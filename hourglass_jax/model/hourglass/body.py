"""The Hourglass body: pre layers -> shorten (shift included) -> inner body -> upsample -> post layers, recursively.
Each shortened level is fixed (fixed_body.py) or dynamic (dynamic/body.py), with its forward pass and its cached
decoding; the body checks its input and builds each level's modules (`stack`, `shortening`, `inner_level`,
`upsampling`: the interface both levels use).

The same module decodes with a cache (`cache`, `position`): a level's cache holds the K/V of its stacks ('pre',
'post', or 'layers' at the center), its level's own entries and the next level's cache ('inner').
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import kv_cache
from hourglass_jax.model.checks import is_checkable
from hourglass_jax.model.hourglass import fixed_body
from hourglass_jax.model.hourglass.dynamic import body as dynamic_body
from hourglass_jax.model.hourglass.dynamic.level import (DYNAMIC, DynamicSettings, DynamicShorten, DynamicUpsample,
                                                         BoundaryPredictor, dynamic_options, level_predictors)
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, HourglassSettings, parse_hierarchy
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, module_fields
from hourglass_jax.model.layers import DecoderStack
from hourglass_jax.model.hourglass.resampling import Shorten, Upsample


def new_hourglass_cache(cfg: LayerConfig, hierarchy: Hierarchy, shorten: str, upsample: str, batch: int,
                        padded: int, segment_capacity: float, predictors: tuple = ()) -> dict:
  """Empty cache of an Hourglass body for `batch` sequences of `padded` (a multiple of the total
  factor) entries of its input stream; `predictors`: the dynamic levels', outermost first."""
  num_pre = hierarchy.levels[0][0]
  if not hierarchy.depth:
    return {"layers": kv_cache.new_stack(cfg, batch, num_pre, padded)}
  cache = {"pre": kv_cache.new_stack(cfg, batch, num_pre, padded),
           "post": kv_cache.new_stack(cfg, batch, hierarchy.post_layers[0], padded)}
  if shorten == DYNAMIC:
    entries, inner = dynamic_body.level_cache(cfg, hierarchy, batch, padded, segment_capacity, predictors[0])
  else:
    entries, inner = fixed_body.level_cache(cfg, hierarchy, shorten, upsample, batch, padded)
  if inner is not None:
    entries["inner"] = new_hourglass_cache(cfg, hierarchy.inner(), shorten, upsample, batch, inner,
                                           segment_capacity, predictors[1:])
  return dict(cache, **entries)


def check_stream(x_BxLxD, cache=None, position=None, outermost: bool = True) -> int | None:
  """Raises ValueError, naming the fix, for an input that is not a float [B, L, D] stream (non-empty where
  `outermost`), or concrete cached rows position.. that do not fit the cache; returns the cache's entries (None
  without a cache)."""
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
    position = 0
  if np.ndim(position) > 1 or (np.ndim(position) and np.shape(position) != shape[:1]) or \
      not jnp.issubdtype(jnp.result_type(position), jnp.integer):
    raise ValueError(f"Hourglass: position={position!r} must be an integer scalar or int [{shape[0]}] (the entry "
                     "of x's first row, for every row or each its own).")
  if is_checkable(position) and not (0 <= int(np.min(position)) and int(np.max(position)) + shape[1] <= size):
    bad = int(np.min(position)) if int(np.min(position)) < 0 else int(np.max(position))
    raise ValueError(f"Hourglass: position={bad} is outside the cache for {shape[1]} row(s) from it: it "
                     f"holds entries [0, {size}); make the cache with new_cache(batch, length) for a larger length.")
  return size


# A small body to build on (configs/default.py's); ModelConfig's default is the paper's enwik8 model, '5@1 24@3 5@1'.
class Hourglass(module_fields(HourglassSettings, hierarchy="2@1 4@3 2@1"), module_fields(DynamicSettings),
                LayerOptions):
  """x [B, L, D] -> y [B, L, D], causal: y[:, t] depends only on x[:, :t+1]. Any L (padded at the end inside).

  `hierarchy` is the level notation ('2@1 4@3 2@1': 2 layers at full resolution, 4 at 1/3, 2 back at full; a
  single '8@1' is a plain decoder stack); `shorten` and `upsample` pick the resampling methods (see `Shorten`,
  `Upsample`); `outer_factor` is the input stream's own shortening. Block settings: `LayerOptions`. Params: 'pre',
  'shorten', 'inner' (the next level, the same layout), 'upsample', 'post'; or 'layers' for a single level.

  Cached decoding: `cache` from `new_cache` (entries in units of this stream), `position` the (traced) entry of x's
  first row (None: 0, a prompt), one for every row or int [B], each row at its own; x's T rows are fed together,
  each attending to the cache and to the rows before it; returns (y, cache). `tap`: also the outermost shortened
  level's output (its up-sampled stream plus the residual, what the post layers read), as (y, tap) or
  (y, cache, tap). The cache is indexed by position: feeding rows from an earlier entry again (the rows a
  speculative decoder rejected, replaced) overwrites what followed it.

  shorten='dynamic' takes `DynamicSettings` (the level's and its predictors') and passes `inputs` to the outermost
  level's predictor: 'whitespace' takes `boundaries_BxL` (`whitespace_boundaries(tokens)`, or with run bytes
  `byte_mask(tokens, boundary_bytes)` and `runs_BxL`, `byte_mask(tokens, run_bytes)`, to merge runs in decoding).
  """
  outer_factor: int = 1

  def new_cache(self, batch: int, length: int, d_model: int) -> dict:
    """Empty decoding cache for `batch` sequences of up to `length` (a multiple of the total factor) positions of
    width `d_model`."""
    hierarchy = parse_hierarchy(self.hierarchy)
    predictors = self.predictors(hierarchy) if self.shorten == DYNAMIC and hierarchy.depth else ()
    self.check_cache_length(length, hierarchy.total_factor)
    return new_hourglass_cache(self.layer_config(d_model), hierarchy, self.shorten, self.upsample, batch, length,
                               self.segment_capacity, predictors)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, cache=None, position=None, lengths_B=None,
               tap: bool = False, **inputs):
    hierarchy = parse_hierarchy(self.hierarchy)
    size = check_stream(x_BxLxD, cache, position, self.outer_factor == 1)
    options = self.layer_config(x_BxLxD.shape[-1]).options()
    start = 0 if position is None else position
    if tap and not hierarchy.depth:
      raise ValueError(f"Hourglass(hierarchy={self.hierarchy!r}).__call__(tap=True): there is no shortened level "
                       "to tap; tap a hierarchy with one.")
    if not hierarchy.depth:  # the center: a plain stack
      layers = self.stack(hierarchy.levels[0][0], "layers", options)
      if cache is None:
        return layers(x_BxLxD, deterministic)
      y_BxLxD, layers_cache = layers(x_BxLxD, True, cache["layers"], kv_cache.entries(start, x_BxLxD.shape[1]))
      cache, short = dict(cache, layers=layers_cache), None
    else:
      level = dynamic_body if self.shorten == DYNAMIC else fixed_body
      if cache is None:
        y_BxLxD, short = level.forward(self, hierarchy, options, x_BxLxD, deterministic, lengths_B, **inputs)
        return (y_BxLxD, short) if tap else y_BxLxD
      y_BxLxD, cache, short = level.decode(self, hierarchy, options, x_BxLxD, cache, start, **inputs)
    if self.outer_factor == 1 and not is_checkable(start):  # as the LM's decode_step
      bad_B = kv_cache.out_of_range(start, x_BxLxD.shape[1], size)
      y_BxLxD = jnp.where(jnp.reshape(bad_B, (-1, 1, 1)), jnp.nan, y_BxLxD)
    return (y_BxLxD, cache, short) if tap else (y_BxLxD, cache)

  def predictors(self, hierarchy) -> tuple[type[BoundaryPredictor], ...]:
    """The dynamic levels' predictors, this level's first: resolved once, then handed to the level and inward."""
    return level_predictors(hierarchy, self.upsample, self.boundaries, "Hourglass.")

  def stack(self, num_layers: int, name: str, options):
    return DecoderStack(num_layers=num_layers, factor=self.outer_factor, **options, name=name)

  def shortening(self, hierarchy, options):
    """The level's shortening: `Shorten`, or with shorten='dynamic' `DynamicShorten` with its predictor."""
    if self.shorten == DYNAMIC:
      return DynamicShorten(factor=hierarchy.relative_factor(0), **dict(
          dynamic_options(self), boundaries=self.predictors(hierarchy)[0]), **options, name="shorten")
    return Shorten(factor=hierarchy.relative_factor(0), method=self.shorten, outer_factor=self.outer_factor,
                   **options, name="shorten")

  def inner_level(self, hierarchy, options):
    """The next level in: an Hourglass over the shortened stream (with shorten='dynamic' the next predictors)."""
    dynamic = dynamic_options(self)
    if self.shorten == DYNAMIC and hierarchy.depth > 1:
      dynamic["boundaries"] = self.predictors(hierarchy)[1:]
    return Hourglass(hierarchy=str(hierarchy.inner()), shorten=self.shorten, upsample=self.upsample,
                     outer_factor=self.outer_factor * hierarchy.relative_factor(0), **dynamic, **options,
                     name="inner")

  def upsampling(self, hierarchy, options):
    """The level's up-sampling: `Upsample`, or with shorten='dynamic' `DynamicUpsample`."""
    if self.shorten == DYNAMIC:
      return DynamicUpsample(**options, name="upsample")
    return Upsample(factor=hierarchy.relative_factor(0), method=self.upsample, outer_factor=self.outer_factor,
                    **options, name="upsample")
