"""Activation rematerialisation: `train.remat` / `train.remat_policy` become the model's `remat_policy`, which
every scanned stack applies inside its scan (recompute each block's activations in the backward pass)."""

import dataclasses

from hourglass_jax.model.config import REMAT_POLICIES, ModelConfig
from hourglass_jax.train.settings import TrainSettings


def training_model_config(cfg) -> ModelConfig:
  """The validated ModelConfig of `cfg.model` with the remat policy the train section asks for."""
  model_cfg = ModelConfig.from_dict(cfg.model)
  train = TrainSettings.of(cfg.train)
  if not train.remat:
    return model_cfg
  policy = train.remat_policy
  if policy not in REMAT_POLICIES[1:]:
    raise ValueError(f"train.remat_policy={policy!r} is not supported; choose one of "
                     f"{', '.join(REMAT_POLICIES[1:])} (or train.remat=False).")
  return dataclasses.replace(model_cfg, remat_policy=policy)
