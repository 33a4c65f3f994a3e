"""'linear' resampling, kernel = stride = k: shortening (the multi-scale 'conv' downsampler, a strided convolution)
projects each group's position-major concatenation with Dense(d); up-sampling (the 'transposed_conv' upsampler)
expands each vector with Dense(k*d), split position-major, so finer vector i reads only z[i // k]. Parameters
'<name>/proj'."""

import flax.linen as nn

from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.layers import dense
from hourglass_jax.model.resampling.base import Shortening, Upsampling, register_shortening, register_upsampling
from hourglass_jax.ops.dropout import Dropout


class LinearPool(nn.Module):
  """k consecutive vectors -> Dense(d) of their position-major concatenation."""
  cfg: LayerConfig
  k: int

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    b, length, d = x_BxLxD.shape
    z_BxLkxD = dense(self.cfg, d, ("mlp", "embed"), "proj")(x_BxLxD.reshape(b, length // self.k, self.k * d))
    return Dropout(self.cfg.dropout)(z_BxLkxD, deterministic=deterministic)


class LinearUnpool(nn.Module):
  """One vector -> Dense(k*d), split position-major into k."""
  cfg: LayerConfig
  k: int

  @nn.compact
  def __call__(self, z_BxSxD, deterministic: bool):
    b, short, d = z_BxSxD.shape
    u_BxSxKD = dense(self.cfg, self.k * d, ("embed", "mlp"), "proj")(z_BxSxD)
    u_BxSxKD = Dropout(self.cfg.dropout)(u_BxSxKD, deterministic=deterministic)
    return u_BxSxKD.reshape(b, short * self.k, d)


@register_shortening
class Linear(Shortening):
  key = "linear"
  multiscale_name = "conv"

  @classmethod
  def pool(cls, cfg, k: int, h_BxLxD, deterministic: bool, name: str = "pool"):
    return LinearPool(cfg, k, name=name)(h_BxLxD, deterministic)

  @classmethod
  def pool_cost(cls, cfg, k: int, short: int) -> tuple[int, int]:
    d = cfg.d_model
    return k * d * d + d, 2 * short * k * d * d


@register_upsampling
class LinearUp(Upsampling):
  key = "linear"
  multiscale_name = "transposed_conv"

  @classmethod
  def unpool(cls, cfg, k: int, z_BxSxD, deterministic: bool, name: str = "unpool"):
    return LinearUnpool(cfg, k, name=name)(z_BxSxD, deterministic)

  @classmethod
  def unpool_cost(cls, cfg, k: int, short: int) -> tuple[int, int]:
    d = cfg.d_model
    return d * k * d + k * d, 2 * short * d * k * d
