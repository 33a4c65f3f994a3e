"""Top-down and bottom-up multi-scale bodies (Subramanian et al. 2020), causal at every scale boundary.

Both map the scale-1 stream x [B, L, D] to the scale-1 representation y [B, L, D] (any L: padded at the end
inside to a multiple of the coarsest scale). A stack at cumulative scale s runs at positions 0, s, 2s... (its
tokens' last positions), so rotary and relative positions measure real distances, as in Hourglass.

Both decode with a cache (`cache`, `position`; an empty one from the module's `new_cache`). Per coarse scale s it
holds 'scale_<s>' (its stack's K/V) and 'buf_<s>' (the last k-1 rows of the finer stream it pools: the causal
shift); top-down adds 'rows_<s>' (the k up-sampled rows of its newest output), bottom-up 'top_<s>' (its newest
output) and 'aggregate_<g>' (K/V of the aggregation layer's head group g), and its scale-1 stack 'scale_1'. Token j
of scale s completes at position js, so scale s runs under `nn.cond(position % s == 0)`, nested by factor.
"""

import functools

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice
from hourglass_jax.model.layers import DecoderStack, dense, feed_forward_residual, layer_norm, pad_to, rematerialised
from hourglass_jax.model.multiscale.attention import ScaleAttention
from hourglass_jax.model.multiscale.resampling import (DOWNSAMPLERS, UPSAMPLERS, cached_pyramid, downsample, pool,
                                                      pyramid, upsample)
from hourglass_jax.model.multiscale.scales import MultiScale, parse_multiscale
from hourglass_jax.ops.dropout import Dropout


def new_multiscale_cache(cfg: LayerConfig, kind: str, scales: MultiScale, batch: int, padded: int) -> dict:
  """Empty cache of a 'topdown' or 'bottomup' body for `batch` sequences of `padded` (a multiple of the coarsest
  scale) positions."""
  factors, dtype = scales.factors, cfg.compute_dtype
  cache = {}
  for i, s in enumerate(factors[:-1]):
    cache[f"scale_{s}"] = kv_cache.new_stack(cfg, batch, scales.layers[i], padded // s)
    cache[f"buf_{s}"] = jnp.zeros((batch, scales.relative_factor(i + 1) - 1, cfg.d_model), dtype)
    extra = "rows" if kind == "topdown" else "top"
    rows = scales.relative_factor(i + 1) if kind == "topdown" else 1
    cache[f"{extra}_{s}"] = jnp.zeros((batch, rows, cfg.d_model), dtype)
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
  y_BxTxD, cache[name] = _stack(cfg, scales, i)(x_BxTxD, True, cache[name], start + jnp.arange(x_BxTxD.shape[1]))
  return y_BxTxD


class TopDown(LayerOptions):
  """Coarsest scale on pooled inputs; each finer scale's input is GELU(Linear(concat(pooled inputs, up-sampled
  coarser output))); the scale-1 stack's output is y. `scales` ('64,16,4,1', coarse to fine) and
  `layers_per_scale` ('2,4,8,12') as in the multi-scale notation; `downsampler` 'avg' | 'conv', `upsampler`
  'transposed_conv' | 'repeat'. Block settings: `LayerOptions`. Cached decoding: see the module docstring;
  returns (y, cache)."""
  # A small body to build on; ModelConfig's defaults are the paper's four-scale model ('64,16,4,1', '2,4,8,12').
  scales: str = "16,4,1"
  layers_per_scale: str = "2,2,2"
  downsampler: str = "avg"
  upsampler: str = "transposed_conv"

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
      cache = dict(cache)
      if position is None:
        return self._prefill(cfg, scales, x_BxLxD, cache), cache
      return self._step(cfg, scales, len(scales.factors) - 1, x_BxLxD, position, cache), cache
    factors = scales.factors
    length = x_BxLxD.shape[1]
    e = pyramid(cfg, self.downsampler, pad_to(x_BxLxD, scales.coarsest), factors, deterministic)
    z = _stack(cfg, scales, 0)(e[0], deterministic)
    for i in range(1, len(factors)):
      u = upsample(cfg, self.upsampler, z, scales.relative_factor(i), deterministic, f"upsample_{factors[i - 1]}")
      z = _stack(cfg, scales, i)(merge(cfg, e[i], u, deterministic, f"merge_{factors[i]}"), deterministic)
    return z[:, :length]

  def _prefill(self, cfg, scales, x_BxTxD, cache):
    factors = scales.factors
    e = {len(factors) - 1: x_BxTxD}  # the pooled inputs, fine to coarse
    for i in range(len(factors) - 2, -1, -1):
      k = scales.relative_factor(i + 1)
      window_BxVxD, cache[f"buf_{factors[i]}"] = kv_cache.shift_in(cache[f"buf_{factors[i]}"], e[i + 1])
      count = kv_cache.num_coarse(e[i + 1].shape[1], k)
      e[i] = pool(cfg, self.downsampler, window_BxVxD[:, :count * k], k, True, f"downsample_{factors[i]}")
    z_BxTxD = _cached_stack(cfg, scales, 0, cache, e[0], 0)
    for i in range(1, len(factors)):
      k, coarse = scales.relative_factor(i), factors[i - 1]
      rows_BxRxD = upsample(cfg, self.upsampler, z_BxTxD, k, True, f"upsample_{coarse}")
      cache[f"rows_{coarse}"] = rows_BxRxD[:, -k:]
      h_BxTxD = merge(cfg, e[i], rows_BxRxD[:, :e[i].shape[1]], True, f"merge_{factors[i]}")
      z_BxTxD = _cached_stack(cfg, scales, i, cache, h_BxTxD, 0)
    return z_BxTxD

  def _step(self, cfg, scales, i: int, e_Bx1xD, t, cache):
    """Scale i at position t (a multiple of its factor): the coarser scales whose token completes at t, then this
    scale's stack on its token t // s; returns its output [B, 1, D] (`cache` updated in place)."""
    factors = scales.factors
    j = t // factors[i]
    if i == 0:
      return _cached_stack(cfg, scales, 0, cache, e_Bx1xD, j)
    k, coarse = scales.relative_factor(i), factors[i - 1]
    window_BxKxD, cache[f"buf_{coarse}"] = kv_cache.shift_in(cache[f"buf_{coarse}"], e_Bx1xD)

    def coarser(module, cache, window_BxKxD, t):
      cache = dict(cache)
      e_c = pool(cfg, module.downsampler, window_BxKxD, k, True, f"downsample_{coarse}")
      z_c = module._step(cfg, scales, i - 1, e_c, t, cache)
      cache[f"rows_{coarse}"] = upsample(cfg, module.upsampler, z_c, k, True, f"upsample_{coarse}")
      return cache

    cache.update(nn.cond(t % coarse == 0, coarser, lambda module, cache, *_: cache, self, dict(cache), window_BxKxD,
                         t))
    u_Bx1xD = jnp.take(cache[f"rows_{coarse}"], (j % k)[None], axis=1)
    return _cached_stack(cfg, scales, i, cache, merge(cfg, e_Bx1xD, u_Bx1xD, True, f"merge_{factors[i]}"), j)


class AggregationBlock(nn.Module):
  """Pre-LN block at scale 1 whose head groups attend causally to the streams of the different scales.

  `streams` are aligned with the scales (coarse to fine); the scale-1 group attends to the block's own normed input.
  Cached (`kvs` the groups' K/V caches, `position` as in `ScaleAttention`): streams hold each coarse scale's new
  tokens (all of the prompt's, or the newest); returns (y, kvs).
  """
  cfg: LayerConfig
  scales: MultiScale

  @nn.compact
  def __call__(self, x_BxLxD, streams, deterministic: bool, kvs=None, position=None):
    cfg = self.cfg
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    attention = ScaleAttention(cfg, self.scales, name="attention")
    rows = list(streams[:-1]) + [h_BxLxD]
    if kvs is not None:
      h_BxLxD, kvs = attention(h_BxLxD, rows, deterministic, kvs, position)
      return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic), kvs
    h_BxLxD = attention(h_BxLxD, rows, deterministic)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)


class BottomUp(LayerOptions):
  """Pool upward from x, each coarser scale from the finer scale's output, running each scale's stack; then one
  aggregation layer at scale 1 whose head groups (`heads_per_scale`, '' = even split) read all scales; then the
  scale-1 stack gives y. Fields as `TopDown`; block settings: `LayerOptions`. Cached decoding: see the module
  docstring; returns (y, cache)."""
  # A small body to build on; ModelConfig's defaults are the paper's four-scale model ('64,16,4,1', '2,4,8,12').
  scales: str = "16,4,1"
  layers_per_scale: str = "2,2,2"
  heads_per_scale: str = ""
  downsampler: str = "avg"

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
    coarse, cache = cached_pyramid(self, cfg, self.downsampler, scales, x_BxTxD, position, cache,
                                   functools.partial(_cached_stack, cfg, scales))
    kvs = [cache[f"aggregate_{g}"] for g in range(n)]
    x_BxTxD, kvs = AggregationBlock(cfg, scales, name="aggregate")(x_BxTxD, coarse + [None], True, kvs, position)
    cache.update({f"aggregate_{g}": kv for g, kv in enumerate(kvs)})
    return _cached_stack(cfg, scales, n - 1, cache, x_BxTxD, start), cache
