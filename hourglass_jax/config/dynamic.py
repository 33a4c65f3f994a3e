"""Learned shortening for a config file: its shortened levels pool dynamic segments (configs/dynamic.py,
configs/enwik8_dynamic.py)."""

import ml_collections

from hourglass_jax.model.hourglass.dynamic_level import BOUNDARY_PREDICTORS, level_predictors

ROUTING_RATIO_LOSS_WEIGHT = 0.03  # H-Net's alpha for its ratio loss


def with_dynamic_shortening(cfg: ml_collections.ConfigDict, predictor: str, config_name: str,
                            nested_hierarchy: str | None = None,
                            routing_loss_weight: float = ROUTING_RATIO_LOSS_WEIGHT) -> ml_collections.ConfigDict:
  """`cfg` with shorten='dynamic' and boundaries=`predictor` (from the file's ':predictor' argument). Two names
  ('whitespace,gumbel': the outer level's, then the inner one's) make it the two-level `nested_hierarchy`.
  `routing_loss_weight` is the ratio loss's weight when every level with a loss routes."""
  names = [name.strip() for name in predictor.split(",")]
  for name in names:
    if name not in BOUNDARY_PREDICTORS:
      raise ValueError(f"configs/{config_name}.py: unknown boundary predictor {name!r}; choose one of "
                       f"{', '.join(BOUNDARY_PREDICTORS)}, or two of them for two levels (e.g. "
                       f"--config=configs/{config_name}.py:gumbel or :whitespace,gumbel).")
  if len(names) > (2 if nested_hierarchy else 1):
    levels = "one or two dynamic levels (e.g. :whitespace,gumbel)" if nested_hierarchy else "one dynamic level"
    raise ValueError(f"configs/{config_name}.py:{predictor} names {len(names)} predictors; the file has {levels}. "
                     "Set model.hierarchy and model.boundaries for more.")
  if len(names) == 2:
    cfg.model.hierarchy = nested_hierarchy
    level_predictors(predictor, 2, f"configs/{config_name}.py:{predictor}: model.boundaries")
  cfg.model.update(shorten="dynamic", upsample="repeat", boundaries=",".join(names))
  learned = [name for name in names if name != "whitespace"]
  if learned and all(name == "routing" for name in learned):  # one weight serves every level: the prior's 1
    cfg.model.boundary_loss_weight = routing_loss_weight  # unless every level with a loss routes
  return cfg
