"""Hourglass, vanilla and multi-scale (top-down, bottom-up, retina) transformer LMs as Flax Linen modules."""

from typing import Any, Mapping

import flax.linen as nn

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.lm import HourglassLM
from hourglass_jax.model.multiscale.scales import MultiScale


def build_model(model_cfg: Mapping[str, Any] | ModelConfig) -> nn.Module:
  """Validates a `model` config section (ConfigDict, dict or ModelConfig) and returns the Linen module.

  One module for every kind: `HourglassLM` picks its body (Hourglass, top-down, bottom-up, retina) from `kind`.
  """
  cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
  return HourglassLM(cfg)


__all__ = ["Hierarchy", "HourglassLM", "ModelConfig", "MultiScale", "build_model", "parse_hierarchy"]
