"""Retina body (Subramanian et al. 2020): one stack whose attention head groups see different scales, each over its
own window of the past (e.g. '0:8,8:256,256:512': scale-1 heads the last 8 tokens, scale-4 heads 8..255 back,
scale-16 heads 256..511 back). Keys and values of a group are the layer's normed input pooled causally at its scale.

Cached decoding (`cache` from the module's `new_cache`, `position`): per block (stacked on a leading layer axis, scanned
like the blocks' params) 'group_<g>' holds the K/V of head group g, 'stream_<s>' the finer stream that scale s pools
(shifted by k-1 rows) and 'z_<s>' its tokens. Scale s pools the tokens new rows complete (under nn.cond where they
may complete none); rows past a prompt attend over only the slice of each group's cache their windows can reach,
so their cost does not grow with the context beyond the widest window.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice, check_int, module_fields
from hourglass_jax.model.layers import feed_forward_residual, layer_norm, pad_to, scan_blocks
from hourglass_jax.model.multiscale.attention import ScaleAttention
from hourglass_jax.model.multiscale.resampling import cached_pyramid, pyramid, pyramid_cache
from hourglass_jax.model.multiscale.scales import MultiScale, MultiScaleSettings, parse_multiscale
from hourglass_jax.model.resampling import DOWNSAMPLERS
from hourglass_jax.runtime.sharding import LAYERS_AXIS


def check_windows_fit(scales: MultiScale, retina_windows: str, length: int) -> None:
  """Raises when a window starts beyond a `length`-token sequence (its heads would never see a token)."""
  for scale, (start, stop) in zip(scales.factors, scales.windows):
    if start >= length:
      raise ValueError(f"model.retina_windows={retina_windows!r}: window {start}:{stop} of the scale-{scale} "
                       f"heads starts beyond this {length}-token sequence, so those heads would see nothing; use "
                       f"sequences longer than {start} tokens (pad prompts at the end: it is causal-safe) or "
                       "shrink the windows.")


def new_retina_cache(cfg: LayerConfig, num_layers: int, scales: MultiScale, batch: int, padded: int) -> dict:
  """Empty cache of a Retina body for `batch` sequences of `padded` (a multiple of the coarsest scale) positions."""
  block = {f"group_{g}": kv_cache.new_kv(cfg, batch, padded // s, n)
           for g, (s, n) in enumerate(zip(scales.factors, scales.heads))}
  block.update(pyramid_cache(cfg, scales, batch, padded))
  return jax.tree.map(lambda a: jnp.zeros((num_layers, *a.shape), a.dtype), block)


class RetinaBlock(nn.Module):
  """Pre-LN block: x + drop(RetinaAttn(LN x)); x + drop(FFN(LN x)).

  Cached (`cache` this block's, `position` as in `Retina`): returns (y, cache).
  """
  cfg: LayerConfig
  scales: MultiScale
  downsampler: str

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool, cache=None, position=None):
    cfg, scales = self.cfg, self.scales
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    attention = ScaleAttention(cfg, scales, name="attention")
    if cache is not None:
      start = 0 if position is None else position
      coarse, cache = cached_pyramid(self, cfg, self.downsampler, scales, h_BxLxD, start, cache)
      kvs = [cache[f"group_{g}"] for g in range(len(scales.factors))]
      streams, firsts = [rows for rows, _ in coarse] + [h_BxLxD], [first for _, first in coarse] + [start]
      h_BxLxD, kvs = attention(h_BxLxD, streams, True, kvs, position, firsts)
      cache.update({f"group_{g}": kv for g, kv in enumerate(kvs)})
      return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic), cache
    kvs = pyramid(cfg, self.downsampler, h_BxLxD, scales.factors, deterministic)
    h_BxLxD = attention(h_BxLxD, kvs, deterministic)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)


# A small body to build on: ModelConfig's scales are the paper's '64,16,4,1', and its retina_windows have no default.
class Retina(module_fields(MultiScaleSettings, "scales", "retina_windows", "heads_per_scale", "downsampler",
                           scales="16,4,1", retina_windows="0:8,8:32,32:64"), LayerOptions):
  """x [B, L, D] -> y [B, L, D]: `num_layers` retina blocks (scanned, params under 'blocks'), ending with its own
  LayerNorm. `scales` ('16,4,1'), `retina_windows` (one 'a:b' window per scale, nearest first, e.g.
  '0:8,8:32,32:64'), `heads_per_scale` ('' = even split) and `downsampler` ('avg' | 'conv') as in the multi-scale
  notation. Block settings: `LayerOptions`. Cached decoding: `cache`, and `position` None to prefill x's rows as
  positions 0.., else the (traced) position of x's first row; returns (y, cache)."""
  num_layers: int = 2

  def new_cache(self, batch: int, length: int, d_model: int) -> dict:
    """Empty decoding cache for `batch` sequences of up to `length` (a multiple of the coarsest scale) positions."""
    cfg = self.layer_config(d_model)
    scales = self.parsed_scales(cfg.num_heads)
    self.check_cache_length(length, scales.coarsest)
    return new_retina_cache(cfg, self.num_layers, scales, batch, length)

  def parsed_scales(self, num_heads: int) -> MultiScale:
    return parse_multiscale("retina", self.scales, "", self.heads_per_scale, self.retina_windows, num_heads)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, cache=None, position=None):
    check_choice("Retina.downsampler", self.downsampler, DOWNSAMPLERS)
    check_int("Retina.num_layers", self.num_layers, 0)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    scales = self.parsed_scales(cfg.num_heads)
    if cache is not None:
      return self._decode(cfg, scales, x_BxLxD, cache, position)
    length = x_BxLxD.shape[1]
    check_windows_fit(scales, self.retina_windows, length)
    y_BxLxD = scan_blocks(cfg, RetinaBlock, self.num_layers, pad_to(x_BxLxD, scales.coarsest), deterministic,
                          scales=scales, downsampler=self.downsampler)
    return layer_norm(cfg, "final_norm")(y_BxLxD)[:, :length]

  def _decode(self, cfg, scales, x_BxTxD, cache, position):
    """The blocks as one scan over their params and their caches (block i reads and returns cache[i])."""
    if self.num_layers:
      step = lambda block, x, block_cache: block(x, True, block_cache, position)
      scanned = nn.scan(step, variable_axes={"params": 0, "tables": 0}, split_rngs={"params": True},
                        length=self.num_layers, metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})
      x_BxTxD, cache = scanned(RetinaBlock(cfg, scales, self.downsampler, name="blocks"), x_BxTxD, cache)
    return layer_norm(cfg, "final_norm")(x_BxTxD), cache
