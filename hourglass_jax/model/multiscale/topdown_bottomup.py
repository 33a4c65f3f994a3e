"""Top-down and bottom-up multi-scale bodies (Subramanian et al. 2020), causal at every scale boundary.

Both map the scale-1 stream x [B, L, D] to the scale-1 representation y [B, L, D] (any L: padded at the end
inside to a multiple of the coarsest scale). A stack at cumulative scale s runs at positions 0, s, 2s... (its
tokens' last positions), so rotary and relative positions measure real distances, as in Hourglass.

Both decode with a cache (`cache`, `position`; an empty one from the module's `new_cache`), rows position.. at
once (`position` one entry for every row, or int [B]: each row its own). Per coarse scale s it holds 'scale_<s>'
(its stack's K/V), 'stream_<s>' (the finer stream it pools, shifted by k-1 rows: the causal shift) and 'z_<s>' (its
outputs); bottom-up adds 'aggregate_<g>' (K/V of the aggregation layer's head group g); and the scale-1 stack
'scale_1'. Token j of scale s completes at position js, so scale s
runs for the tokens the new rows complete (under nn.cond where there may be none), nested by factor.
"""

import functools

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice, module_fields
from hourglass_jax.model.layers import DecoderStack, dense, feed_forward_residual, layer_norm, pad_to, rematerialised
from hourglass_jax.model.multiscale.attention import ScaleAttention
from hourglass_jax.model.multiscale.resampling import (cached_pyramid, coarse_chain, downsample, pool, pyramid,
                                                      pyramid_cache, upsample)
from hourglass_jax.model.multiscale.scales import MultiScale, MultiScaleSettings, parse_multiscale
from hourglass_jax.model.resampling import DOWNSAMPLERS, UPSAMPLERS
from hourglass_jax.ops.dropout import Dropout


def new_multiscale_cache(cfg: LayerConfig, kind: str, scales: MultiScale, batch: int, padded: int) -> dict:
  """Empty cache of a 'topdown' or 'bottomup' body for `batch` sequences of `padded` (a multiple of the coarsest
  scale) positions."""
  factors = scales.factors
  cache = pyramid_cache(cfg, scales, batch, padded)
  for i, s in enumerate(factors[:-1]):
    cache[f"scale_{s}"] = kv_cache.new_stack(cfg, batch, scales.layers[i], padded // s)
  cache["scale_1"] = kv_cache.new_stack(cfg, batch, scales.layers[-1], padded)
  if kind == "bottomup":
    for g, (s, n) in enumerate(zip(factors, scales.heads)):
      cache[f"aggregate_{g}"] = kv_cache.new_kv(cfg, batch, padded // s, n)
  return cache


def merge(cfg: LayerConfig, e_BxLxD, u_BxLxD, deterministic: bool, name: str):
  """A finer scale's input: GELU(Linear(concat(its pooled inputs, the up-sampled coarser output))), dropped out."""
  h_BxLxD = dense(cfg, cfg.d_model, ("mlp", "embed"), name)(jnp.concatenate([e_BxLxD, u_BxLxD], axis=-1))
  return Dropout(cfg.dropout)(nn.gelu(h_BxLxD, approximate=True), deterministic=deterministic)


def _stack(cfg: LayerConfig, scales: MultiScale, i: int):
  s = scales.factors[i]
  return DecoderStack(num_layers=scales.layers[i], factor=s, **cfg.options(), name=f"scale_{s}")


def _cached_stack(cfg: LayerConfig, scales: MultiScale, i: int, cache: dict, x_BxTxD, start):
  """Scale i's stack on its tokens start.. (extends cache['scale_<s>'])."""
  name = f"scale_{scales.factors[i]}"
  index_T = kv_cache.entries(start, x_BxTxD.shape[1])  # [T], or [B, T]: rows at their own entries
  y_BxTxD, cache[name] = _stack(cfg, scales, i)(x_BxTxD, True, cache[name], index_T)
  return y_BxTxD


# A small body to build on (so is BottomUp): ModelConfig's defaults are the paper's four-scale model.
class TopDown(module_fields(MultiScaleSettings, "scales", "layers_per_scale", "downsampler", "upsampler",
                            scales="16,4,1", layers_per_scale="2,2,2"), LayerOptions):
  """Coarsest scale on pooled inputs; each finer scale's input is GELU(Linear(concat(pooled inputs, up-sampled
  coarser output))); the scale-1 stack's output is y. `scales` ('64,16,4,1', coarse to fine) and
  `layers_per_scale` ('2,4,8,12') as in the multi-scale notation; `downsampler` 'avg' | 'conv', `upsampler`
  'transposed_conv' | 'repeat'. Block settings: `LayerOptions`. Cached decoding: see the module docstring;
  returns (y, cache)."""

  def new_cache(self, batch: int, length: int, d_model: int) -> dict:
    """Empty decoding cache for `batch` sequences of up to `length` (a multiple of the coarsest scale) positions."""
    cfg = self.layer_config(d_model)
    scales = self.parsed_scales(cfg.num_heads)
    self.check_cache_length(length, scales.coarsest)
    return new_multiscale_cache(cfg, "topdown", scales, batch, length)

  def parsed_scales(self, num_heads: int) -> MultiScale:
    return parse_multiscale("topdown", self.scales, self.layers_per_scale, "", "", num_heads)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, cache=None, position=None):
    check_choice("TopDown.downsampler", self.downsampler, DOWNSAMPLERS)
    check_choice("TopDown.upsampler", self.upsampler, UPSAMPLERS)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    scales = self.parsed_scales(cfg.num_heads)
    if cache is not None:
      start = 0 if position is None else position
      sizes = {s: cache[f"z_{s}"].shape[1] for s in scales.factors[:-1]}
      chain = coarse_chain(scales, sizes, start, x_BxLxD.shape[1])
      cache = dict(cache)
      return self._extend(cfg, scales, chain, len(scales.factors) - 1, x_BxLxD, start, cache), cache
    factors = scales.factors
    length = x_BxLxD.shape[1]
    e = pyramid(cfg, self.downsampler, pad_to(x_BxLxD, scales.coarsest), factors, deterministic)
    z = _stack(cfg, scales, 0)(e[0], deterministic)
    for i in range(1, len(factors)):
      u = upsample(cfg, self.upsampler, z, scales.relative_factor(i), deterministic, f"upsample_{factors[i - 1]}")
      z = _stack(cfg, scales, i)(merge(cfg, e[i], u, deterministic, f"merge_{factors[i]}"), deterministic)
    return z[:, :length]

  def _extend(self, cfg, scales, chain, i: int, e_BxTxD, start, cache):
    """Scale i on its new rows start.. (pooled inputs e): the coarser scales on the tokens they complete (`chain`),
    then this scale's stack on e merged with the coarser outputs they read; returns its outputs (`cache` updated in
    place)."""
    if i == 0:
      return _cached_stack(cfg, scales, 0, cache, e_BxTxD, start)
    k, coarse, new = scales.relative_factor(i), scales.factors[i - 1], chain[i - 1]
    cache[f"stream_{coarse}"] = kv_cache.write_rows(cache[f"stream_{coarse}"], e_BxTxD, start + k - 1)
    window_BxWxD = kv_cache.read_rows(cache[f"stream_{coarse}"], new.first * k, new.count * k)

    def coarser(module, cache, window_BxWxD, first):
      cache = dict(cache)
      e_c = pool(cfg, module.downsampler, window_BxWxD, k, True, f"downsample_{coarse}")
      z_c = module._extend(cfg, scales, chain, i - 1, e_c, first, cache)
      cache[f"z_{coarse}"] = kv_cache.write_rows(cache[f"z_{coarse}"], z_c, first)
      return cache

    if new.any_new is True:
      cache.update(coarser(self, cache, window_BxWxD, new.first))
    else:
      cache.update(nn.cond(new.any_new, coarser, lambda module, cache, *_: cache, self, dict(cache), window_BxWxD,
                           new.first))
    length = e_BxTxD.shape[1]
    first, count = kv_cache.coarse_read(start, length, k, cache[f"z_{coarse}"].shape[1])
    rows_BxRxD = upsample(cfg, self.upsampler, kv_cache.read_rows(cache[f"z_{coarse}"], first, count), k, True,
                          f"upsample_{coarse}")
    u_BxTxD = kv_cache.read_rows(rows_BxRxD, start - first * k, length)
    return _cached_stack(cfg, scales, i, cache, merge(cfg, e_BxTxD, u_BxTxD, True, f"merge_{scales.factors[i]}"),
                         start)


class AggregationBlock(nn.Module):
  """Pre-LN block at scale 1 whose head groups attend causally to the streams of the different scales.

  `streams` are aligned with the scales (coarse to fine); the scale-1 group attends to the block's own normed input.
  Cached (`kvs` the groups' K/V caches, `position` and `firsts` as in `ScaleAttention`): streams hold each coarse
  scale's tokens from its entry in `firsts`; returns (y, kvs).
  """
  cfg: LayerConfig
  scales: MultiScale

  @nn.compact
  def __call__(self, x_BxLxD, streams, deterministic: bool, kvs=None, position=None, firsts=None):
    cfg = self.cfg
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    attention = ScaleAttention(cfg, self.scales, name="attention")
    rows = list(streams[:-1]) + [h_BxLxD]
    if kvs is not None:
      h_BxLxD, kvs = attention(h_BxLxD, rows, deterministic, kvs, position, firsts)
      return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic), kvs
    h_BxLxD = attention(h_BxLxD, rows, deterministic)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)


class BottomUp(module_fields(MultiScaleSettings, "scales", "layers_per_scale", "heads_per_scale", "downsampler",
                             scales="16,4,1", layers_per_scale="2,2,2"), LayerOptions):
  """Pool upward from x, each coarser scale from the finer scale's output, running each scale's stack; then one
  aggregation layer at scale 1 whose head groups (`heads_per_scale`, '' = even split) read all scales; then the
  scale-1 stack gives y. Fields as `TopDown`; block settings: `LayerOptions`. Cached decoding: see the module
  docstring; returns (y, cache)."""

  def new_cache(self, batch: int, length: int, d_model: int) -> dict:
    """Empty decoding cache for `batch` sequences of up to `length` (a multiple of the coarsest scale) positions."""
    cfg = self.layer_config(d_model)
    scales = self.parsed_scales(cfg.num_heads)
    self.check_cache_length(length, scales.coarsest)
    return new_multiscale_cache(cfg, "bottomup", scales, batch, length)

  def parsed_scales(self, num_heads: int) -> MultiScale:
    return parse_multiscale("bottomup", self.scales, self.layers_per_scale, self.heads_per_scale, "", num_heads)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, cache=None, position=None):
    check_choice("BottomUp.downsampler", self.downsampler, DOWNSAMPLERS)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    scales = self.parsed_scales(cfg.num_heads)
    factors = scales.factors
    if cache is not None:
      return self._decode(cfg, scales, x_BxLxD, cache, position)
    length = x_BxLxD.shape[1]
    x_BxLxD = pad_to(x_BxLxD, scales.coarsest)
    streams = [x_BxLxD]
    for i in range(len(factors) - 2, -1, -1):
      z = downsample(cfg, self.downsampler, streams[0], scales.relative_factor(i + 1), deterministic,
                     f"downsample_{factors[i]}")
      streams.insert(0, _stack(cfg, scales, i)(z, deterministic))
    aggregate = rematerialised(cfg, AggregationBlock, static_argnums=(3,))
    x_BxLxD = aggregate(cfg, scales, name="aggregate")(x_BxLxD, tuple(streams), deterministic)
    y_BxLxD = _stack(cfg, scales, len(factors) - 1)(x_BxLxD, deterministic)
    return y_BxLxD[:, :length]

  def _decode(self, cfg, scales, x_BxTxD, cache, position):
    n = len(scales.factors)
    start = 0 if position is None else position
    coarse, cache = cached_pyramid(self, cfg, self.downsampler, scales, x_BxTxD, start, cache,
                                   functools.partial(_cached_stack, cfg, scales))
    kvs = [cache[f"aggregate_{g}"] for g in range(n)]
    streams, firsts = [rows for rows, _ in coarse] + [None], [first for _, first in coarse] + [start]
    x_BxTxD, kvs = AggregationBlock(cfg, scales, name="aggregate")(x_BxTxD, streams, True, kvs, position, firsts)
    cache.update({f"aggregate_{g}": kv for g, kv in enumerate(kvs)})
    return _cached_stack(cfg, scales, n - 1, cache, x_BxTxD, start), cache
