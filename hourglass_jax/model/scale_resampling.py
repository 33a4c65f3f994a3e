"""Causal resampling between scales of the multi-scale models (top-down, bottom-up, retina).

The Hourglass argument, applied at every scale boundary: down-sampling by k shifts its input right by k-1 first,
so token j at cumulative scale s summarises tokens js-s+1 .. js and sits at position js (its last token); a scale-1
position q may use it iff js <= q. Up-sampling by k hands the finer token i only the coarse token i // k, which
ends at or before the finer token's position.
"""

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.resampling import Pool, Unpool, shift_right


def down_method(cfg: ModelConfig) -> str:
  """The Pool method of cfg.downsampler: 'avg', or 'linear' for 'conv'."""
  return "avg" if cfg.downsampler == "avg" else "linear"


def up_method(cfg: ModelConfig) -> str:
  """The Unpool method of cfg.upsampler: 'repeat', or 'linear' for 'transposed_conv'."""
  return "repeat" if cfg.upsampler == "repeat" else "linear"


def downsample(cfg: ModelConfig, x_BxLxD, k: int, deterministic: bool, name: str):
  """Shift right by k-1, then 'avg' (mean of k) or 'conv' (strided convolution, kernel = stride = k)."""
  return Pool(cfg, k, down_method(cfg), name=name)(shift_right(x_BxLxD, k - 1), deterministic)


def upsample(cfg: ModelConfig, z_BxLkxD, k: int, deterministic: bool, name: str):
  """'repeat' or 'transposed_conv' (kernel = stride = k: finer token i reads only coarse token i // k)."""
  return Unpool(cfg, k, up_method(cfg), name=name)(z_BxLkxD, deterministic)


def pyramid(cfg: ModelConfig, x_BxLxD, factors: tuple[int, ...], deterministic: bool) -> list:
  """Scale-1 stream -> one stream per scale in `factors` (coarse to fine), each pooled from the next finer one."""
  streams = [x_BxLxD]
  for coarse, fine in zip(factors[-2::-1], factors[::-1]):
    streams.append(downsample(cfg, streams[-1], coarse // fine, deterministic, f"downsample_{coarse}"))
  return streams[::-1]

