"""The Hourglass model: the level notation (hierarchy.py), causal shortening and up-sampling (resampling.py) and the
recursive body (body.py)."""

from hourglass_jax.model.hourglass.body import Hourglass
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.hourglass.resampling import (SHORTEN_METHODS, UPSAMPLE_METHODS, Shorten, Upsample,
                                                      shift_right)

__all__ = ["SHORTEN_METHODS", "UPSAMPLE_METHODS", "Hierarchy", "Hourglass", "Shorten", "Upsample", "parse_hierarchy",
           "shift_right"]
