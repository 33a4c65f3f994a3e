"""Causal resampling between scales of the multi-scale models (top-down, bottom-up, retina).

The Hourglass argument, applied at every scale boundary: down-sampling by k shifts its input right by k-1 first,
so token j at cumulative scale s summarises tokens js-s+1 .. js and sits at position js (its last token); a scale-1
position q may use it iff js <= q. Up-sampling by k hands the finer token i only the coarse token i // k, which
ends at or before the finer token's position.
"""

from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.hourglass.resampling import Pool, Unpool, shift_right

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
