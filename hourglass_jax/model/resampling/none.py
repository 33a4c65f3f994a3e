"""'none' up-sampling: the level returns its residual r alone, so nothing reads its shortened tokens (decoding keeps
no cache for them and skips the levels inside; their parameters stay, unused)."""

from hourglass_jax.model.resampling.base import Upsampling, register_upsampling


@register_upsampling
class NoUpsampling(Upsampling):
  key = "none"
  reads_shortened = False

  @classmethod
  def upsample(cls, cfg, k, outer_factor, z_BxSxD, r_BxLxD, deterministic, rows, kv=None, start=None, first=None):
    return r_BxLxD, kv

  cost = classmethod(lambda cls, cfg, k, length: (0, 0))
