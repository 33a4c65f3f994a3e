"""Activation rematerialisation: `train.remat` / `train.remat_policy` become the model's `remat_policy`, which
every scanned stack applies inside its scan (recompute each block's activations in the backward pass)."""

import dataclasses

from hourglass_jax.model.config import REMAT_POLICIES, ModelConfig


def training_model_config(cfg) -> ModelConfig:
  """The validated ModelConfig of `cfg.model` with the remat policy the train section asks for."""
  model_cfg = ModelConfig.from_dict(cfg.model)
  if not cfg.train.get("remat", False):
    return model_cfg
  policy = cfg.train.get("remat_policy", "nothing_saveable")
  if policy not in REMAT_POLICIES[1:]:
    raise ValueError(f"train.remat_policy={policy!r} is not supported; choose one of "
                     f"{', '.join(REMAT_POLICIES[1:])} (or train.remat=False).")
  return dataclasses.replace(model_cfg, remat_policy=policy)
