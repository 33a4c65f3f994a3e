"""Activation rematerialisation: `train.remat` / `train.remat_policy` become the model's `remat_policy`, which
every scanned stack applies inside its scan (recompute each block's activations in the backward pass)."""

import dataclasses

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.train.settings import TrainSettings


def training_model_config(cfg) -> ModelConfig:
  """The validated ModelConfig of `cfg.model` with the remat policy the train section asks for."""
  model_cfg = ModelConfig.from_dict(cfg.model)
  train = TrainSettings.of(cfg.train)
  if not train.remat:
    return model_cfg
  return dataclasses.replace(model_cfg, remat_policy=train.remat_policy)  # checked by TrainSettings
