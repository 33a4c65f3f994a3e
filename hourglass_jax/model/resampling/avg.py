"""'avg' shortening, the multi-scale models' 'avg' downsampler: the mean of each group of k vectors (no
parameters, no cache, no FLOPs counted)."""

from hourglass_jax.model.resampling.base import Shortening, register_shortening


@register_shortening
class Avg(Shortening):
  key = "avg"
  multiscale_name = "avg"

  @classmethod
  def pool(cls, cfg, k: int, h_BxLxD, deterministic: bool, name: str = "pool"):
    b, length, d = h_BxLxD.shape
    return h_BxLxD.reshape(b, length // k, k, d).mean(axis=2)
