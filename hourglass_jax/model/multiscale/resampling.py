"""Causal resampling between scales of the multi-scale models (top-down, bottom-up, retina).

The Hourglass argument, applied at every scale boundary: down-sampling by k shifts its input right by k-1 first,
so token j at cumulative scale s summarises tokens js-s+1 .. js and sits at position js (its last token); a scale-1
position q may use it iff js <= q. Up-sampling by k hands the finer token i only the coarse token i // k, which
ends at or before the finer token's position.
"""

import flax.linen as nn

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.hourglass.resampling import Pool, Unpool, shift_right
from hourglass_jax.model.multiscale.scales import MultiScale

DOWNSAMPLERS = ("avg", "conv")
UPSAMPLERS = ("transposed_conv", "repeat")


def downsample(cfg: LayerConfig, downsampler: str, x_BxLxD, k: int, deterministic: bool, name: str):
  """Shift right by k-1, then `pool`."""
  return pool(cfg, downsampler, shift_right(x_BxLxD, k - 1), k, deterministic, name)


def pool(cfg: LayerConfig, downsampler: str, h0_BxLxD, k: int, deterministic: bool, name: str):
  """'avg' (mean of k) or 'conv' (strided convolution, kernel = stride = k: Pool's 'linear') of an already shifted
  stream."""
  return Pool(cfg, k, "avg" if downsampler == "avg" else "linear", name=name)(h0_BxLxD, deterministic)


def upsample(cfg: LayerConfig, upsampler: str, z_BxLkxD, k: int, deterministic: bool, name: str):
  """'repeat' or 'transposed_conv' (Unpool's 'linear', kernel = stride = k: finer token i reads only coarse token
  i // k)."""
  return Unpool(cfg, k, "repeat" if upsampler == "repeat" else "linear", name=name)(z_BxLkxD, deterministic)


def pyramid(cfg: LayerConfig, downsampler: str, x_BxLxD, factors: tuple[int, ...], deterministic: bool) -> list:
  """Scale-1 stream -> one stream per scale in `factors` (coarse to fine), each pooled from the next finer one."""
  streams = [x_BxLxD]
  for coarse, fine in zip(factors[-2::-1], factors[::-1]):
    streams.append(downsample(cfg, downsampler, streams[-1], coarse // fine, deterministic, f"downsample_{coarse}"))
  return streams[::-1]


def cached_pyramid(module, cfg: LayerConfig, downsampler: str, scales: MultiScale, x_BxTxD, position, cache: dict,
                   stack=None):
  """`pyramid` when decoding x's new rows (a prompt's, `position` None, or the one at `position`): scale s pools the
  tokens they complete (under nn.cond(position % s == 0) of `module` on a step), runs `stack(i, cache, z, first)` on
  them if given, and feeds the next coarser scale. Returns (each coarse scale's new tokens, coarse to fine; cache)."""
  streams = {}

  def feed(module, i: int, fine_BxTxD, t, cache):
    s, k = scales.factors[i], scales.relative_factor(i + 1)
    window_BxVxD, cache[f"buf_{s}"] = kv_cache.shift_in(cache[f"buf_{s}"], fine_BxTxD)

    def active(module, cache, window_BxVxD, t):
      cache = dict(cache)
      count = 1 if t is not None else kv_cache.num_coarse(fine_BxTxD.shape[1], k)
      z_BxTxD = pool(cfg, downsampler, window_BxVxD[:, :count * k], k, True, f"downsample_{s}")
      if stack is not None:
        z_BxTxD = stack(i, cache, z_BxTxD, 0 if t is None else t // s)
      cache[f"top_{s}"] = z_BxTxD[:, -1:]
      if t is None:
        streams[i] = z_BxTxD
      return cache if i == 0 else feed(module, i - 1, z_BxTxD, t, cache)

    if t is None:
      return active(module, cache, window_BxVxD, None)
    return nn.cond(t % s == 0, active, lambda module, cache, *_: cache, module, cache, window_BxVxD, t)

  cache = feed(module, len(scales.factors) - 2, x_BxTxD, position, dict(cache))
  if position is not None:  # each coarse scale's newest token (the cond may not have run)
    streams = {i: cache[f"top_{s}"] for i, s in enumerate(scales.factors[:-1])}
  return [streams[i] for i in range(len(scales.factors) - 1)], cache
