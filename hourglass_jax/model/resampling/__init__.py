"""Fixed resampling methods, one module each, and their registries (base.py has the interfaces): the Hourglass
levels shorten and up-sample with them (`Shorten`, `Upsample`), the multi-scale models pool and unpool between
scales with those that declare a `multiscale_name`. `shortening` / `upsampling` pick one by name.
SHORTEN_METHODS, UPSAMPLE_METHODS, DOWNSAMPLERS, UPSAMPLERS: the names, in the order registered."""

from hourglass_jax.model.resampling.base import (SHORTENINGS, UPSAMPLINGS, Shortening, Upsampling, by_multiscale_name,
                                                 downsampling, register_shortening, register_upsampling,
                                                 scale_upsampling, shift_right, shortening, upsampling)
from hourglass_jax.model.resampling import avg, repeat, linear, attention, none  # noqa: F401
from hourglass_jax.model.resampling.attention import shorten_mask, upsample_mask

SHORTEN_METHODS = tuple(SHORTENINGS)
UPSAMPLE_METHODS = tuple(UPSAMPLINGS)
DOWNSAMPLERS = tuple(by_multiscale_name(SHORTENINGS))
UPSAMPLERS = tuple(by_multiscale_name(UPSAMPLINGS))

__all__ = ["DOWNSAMPLERS", "SHORTENINGS", "SHORTEN_METHODS", "UPSAMPLERS", "UPSAMPLE_METHODS", "UPSAMPLINGS",
           "Shortening", "Upsampling", "downsampling", "register_shortening", "register_upsampling",
           "scale_upsampling", "shift_right", "shorten_mask", "shortening", "upsample_mask", "upsampling"]
