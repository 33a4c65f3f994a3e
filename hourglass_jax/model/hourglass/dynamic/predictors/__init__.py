"""Boundary predictors of a dynamic level, one module each, and their registry (base.py has the interface).
`resolve(name)` picks one by the name `boundaries` gives; BOUNDARY_PREDICTORS lists the names that need no
setting."""

from hourglass_jax.model.hourglass.dynamic.predictors.base import (PREDICTORS, BoundaryPredictor, Decision, register,
                                                           resolve)
from hourglass_jax.model.hourglass.dynamic.predictors import whitespace, gumbel, routing, entropy, every  # noqa: F401  registers

BOUNDARY_PREDICTORS = tuple(key for key, cls in PREDICTORS.items() if cls.parse(key) is not None)
INNER_PREDICTORS = tuple(key for key, cls in PREDICTORS.items() if cls.inner)

__all__ = ["BOUNDARY_PREDICTORS", "INNER_PREDICTORS", "PREDICTORS", "BoundaryPredictor", "Decision", "register",
           "resolve"]
