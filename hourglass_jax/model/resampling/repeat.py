"""'repeat' up-sampling, the multi-scale models' 'repeat' upsampler: each vector copied k times (no parameters)."""

import jax.numpy as jnp

from hourglass_jax.model.resampling.base import Upsampling, register_upsampling


@register_upsampling
class Repeat(Upsampling):
  key = "repeat"
  multiscale_name = "repeat"

  @classmethod
  def unpool(cls, cfg, k: int, z_BxSxD, deterministic: bool, name: str = "unpool"):
    return jnp.repeat(z_BxSxD, k, axis=1)
