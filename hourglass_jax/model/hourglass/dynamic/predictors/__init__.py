"""Boundary predictors of a dynamic level, one module each, and their registry (base.py has the interface): `resolve`
picks one by name; BOUNDARY_PREDICTORS: the names with no setting; EXAMPLES: the grid's; SETTINGS: theirs."""

from hourglass_jax.model.hourglass.dynamic.predictors.base import (DYNAMIC, PREDICTORS, BoundaryPredictor, Decision,
                                                                   register, resolve)
from hourglass_jax.model.hourglass.dynamic.predictors import whitespace, gumbel, routing, entropy, every  # noqa: F401

BOUNDARY_PREDICTORS = tuple(key for key, cls in PREDICTORS.items() if cls.parse(key) is not None)
INNER_PREDICTORS = tuple(key for key, cls in PREDICTORS.items() if cls.inner)
EXAMPLES = tuple(name for key, cls in PREDICTORS.items() for name in cls.examples or (key,))
SETTINGS = tuple({f.name: f for cls in (BoundaryPredictor, *PREDICTORS.values()) for f in cls.settings()}.values())

__all__ = ["BOUNDARY_PREDICTORS", "DYNAMIC", "EXAMPLES", "INNER_PREDICTORS", "PREDICTORS", "SETTINGS",
           "BoundaryPredictor", "Decision", "register", "resolve"]
