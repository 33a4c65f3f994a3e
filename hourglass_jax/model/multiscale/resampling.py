"""Causal resampling between scales of the multi-scale models (top-down, bottom-up, retina).

The Hourglass argument, applied at every scale boundary: down-sampling by k shifts its input right by k-1 first,
so token j at cumulative scale s summarises tokens js-s+1 .. js and sits at position js (its last token); a scale-1
position q may use it iff js <= q. Up-sampling by k hands the finer token i only the coarse token i // k, which
ends at or before the finer token's position.
"""

import flax.linen as nn

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.multiscale.scales import MultiScale
from hourglass_jax.model.resampling import downsampling, scale_upsampling, shift_right


def downsample(cfg: LayerConfig, downsampler: str, x_BxLxD, k: int, deterministic: bool, name: str):
  """Shift right by k-1, then `pool`."""
  return pool(cfg, downsampler, shift_right(x_BxLxD, k - 1), k, deterministic, name)


def pool(cfg: LayerConfig, downsampler: str, h0_BxLxD, k: int, deterministic: bool, name: str):
  """The shortening `downsampler` names ('avg': the mean of k; 'conv': a strided convolution, kernel = stride = k,
  the 'linear' shortening) of an already shifted stream."""
  return downsampling(downsampler).pool(cfg, k, h0_BxLxD, deterministic, name)


def upsample(cfg: LayerConfig, upsampler: str, z_BxLkxD, k: int, deterministic: bool, name: str):
  """The up-sampling `upsampler` names ('repeat', or 'transposed_conv': the 'linear' up-sampling, kernel = stride =
  k), without the residual: finer token i reads only coarse token i // k."""
  return scale_upsampling(upsampler).unpool(cfg, k, z_BxLkxD, deterministic, name)


def pyramid(cfg: LayerConfig, downsampler: str, x_BxLxD, factors: tuple[int, ...], deterministic: bool) -> list:
  """Scale-1 stream -> one stream per scale in `factors` (coarse to fine), each pooled from the next finer one."""
  streams = [x_BxLxD]
  for coarse, fine in zip(factors[-2::-1], factors[::-1]):
    streams.append(downsample(cfg, downsampler, streams[-1], coarse // fine, deterministic, f"downsample_{coarse}"))
  return streams[::-1]


def coarse_chain(scales: MultiScale, sizes: dict, start, length: int) -> dict:
  """{i: kv_cache.Coarse} for every coarse scale i: the tokens of scale i that the new rows of scale i+1 complete,
  from the scale-1 rows start .. start+length-1 (each scale's rows are the tokens the next finer one computes);
  `sizes` maps each coarse factor to its stream's size."""
  chain = {}
  for i in range(len(scales.factors) - 2, -1, -1):
    chain[i] = kv_cache.coarse_tokens(start, length, scales.relative_factor(i + 1), sizes[scales.factors[i]])
    start, length = chain[i].first, chain[i].count
  return chain


def pyramid_cache(cfg: LayerConfig, scales: MultiScale, batch: int, padded: int) -> dict:
  """Per coarse scale s: 'stream_<s>' the finer stream it pools (shifted by k-1 rows), 'z_<s>' its tokens."""
  cache = {}
  for i, s in enumerate(scales.factors[:-1]):
    k = scales.relative_factor(i + 1)
    cache[f"stream_{s}"] = kv_cache.new_stream(cfg, batch, padded // scales.factors[i + 1], lead=k - 1)
    cache[f"z_{s}"] = kv_cache.new_stream(cfg, batch, padded // s)
  return cache


def cached_pyramid(module, cfg: LayerConfig, downsampler: str, scales: MultiScale, x_BxTxD, start, cache: dict,
                   stack=None):
  """`pyramid` when decoding x's rows at positions start..: each coarse scale pools the tokens they complete (under
  nn.cond of `module` where there may be none), runs `stack(i, cache, z, first)` on them if given, stores them and
  feeds the next coarser scale. Returns (each coarse scale's (tokens, first entry) from its store, coarse to fine,
  covering the tokens the rows complete; cache)."""
  cache = dict(cache)
  chain = coarse_chain(scales, {s: cache[f"z_{s}"].shape[1] for s in scales.factors[:-1]}, start, x_BxTxD.shape[1])

  def feed(module, i: int, fine_BxTxD, fine_start, cache):
    s, k, new = scales.factors[i], scales.relative_factor(i + 1), chain[i]
    cache = dict(cache)
    cache[f"stream_{s}"] = kv_cache.write_rows(cache[f"stream_{s}"], fine_BxTxD, fine_start + k - 1)
    window_BxWxD = kv_cache.read_rows(cache[f"stream_{s}"], new.first * k, new.count * k)

    def active(module, cache, window_BxWxD, first):
      cache = dict(cache)
      z_BxNxD = pool(cfg, downsampler, window_BxWxD, k, True, f"downsample_{s}")
      if stack is not None:
        z_BxNxD = stack(i, cache, z_BxNxD, first)
      cache[f"z_{s}"] = kv_cache.write_rows(cache[f"z_{s}"], z_BxNxD, first)
      return cache if i == 0 else feed(module, i - 1, z_BxNxD, first, cache)

    if new.any_new is True:
      return active(module, cache, window_BxWxD, new.first)
    return nn.cond(new.any_new, active, lambda module, cache, *_: cache, module, cache, window_BxWxD, new.first)

  cache = feed(module, len(scales.factors) - 2, x_BxTxD, start, cache)
  tokens = [(kv_cache.read_rows(cache[f"z_{s}"], chain[i].first, chain[i].count), chain[i].first)
            for i, s in enumerate(scales.factors[:-1])]
  return tokens, cache
