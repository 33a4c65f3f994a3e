"""Learned shortening for a config file: its one shortened level pools dynamic segments (configs/dynamic.py,
configs/enwik8_dynamic.py)."""

import ml_collections

from hourglass_jax.model.hourglass.dynamic_level import BOUNDARY_PREDICTORS

ROUTING_RATIO_LOSS_WEIGHT = 0.03  # H-Net's alpha for its ratio loss


def with_dynamic_shortening(cfg: ml_collections.ConfigDict, predictor: str,
                            config_name: str) -> ml_collections.ConfigDict:
  """`cfg` with shorten='dynamic' and boundaries=`predictor` (from the file's ':predictor' argument)."""
  if predictor not in BOUNDARY_PREDICTORS:
    raise ValueError(f"configs/{config_name}.py: unknown boundary predictor {predictor!r}; choose one of "
                     f"{', '.join(BOUNDARY_PREDICTORS)} (e.g. --config=configs/{config_name}.py:gumbel).")
  cfg.model.update(shorten="dynamic", upsample="repeat", boundaries=predictor)
  if predictor == "routing":
    cfg.model.boundary_loss_weight = ROUTING_RATIO_LOSS_WEIGHT
  return cfg
