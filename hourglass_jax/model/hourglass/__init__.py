"""The Hourglass model: the level notation and settings (hierarchy.py), causal resampling (resampling.py, by the
methods of model/resampling/), learned shortening (dynamic/) and the recursive body (body.py, with its fixed_body.py
and dynamic/body.py levels)."""

from hourglass_jax.model.hourglass.body import Hourglass
from hourglass_jax.model.hourglass.dynamic.level import DynamicShorten, DynamicUpsample, Segments, max_segments
from hourglass_jax.model.hourglass.dynamic.predictors import BOUNDARY_PREDICTORS
from hourglass_jax.model.hourglass.dynamic.predictors.whitespace import (CODE_BOUNDARY_BYTES, WHITESPACE_BYTES,
                                                                         byte_mask, whitespace_boundaries)
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.hourglass.resampling import Shorten, Upsample
from hourglass_jax.model.resampling import SHORTEN_METHODS, UPSAMPLE_METHODS, shift_right

__all__ = ["BOUNDARY_PREDICTORS", "CODE_BOUNDARY_BYTES", "SHORTEN_METHODS", "UPSAMPLE_METHODS", "WHITESPACE_BYTES",
           "DynamicShorten", "DynamicUpsample", "Hierarchy", "Hourglass", "Segments", "Shorten", "Upsample",
           "byte_mask", "max_segments", "parse_hierarchy", "shift_right", "whitespace_boundaries"]
