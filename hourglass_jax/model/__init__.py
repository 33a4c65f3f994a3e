"""Hourglass / vanilla transformer language models as Flax Linen modules."""

from typing import Any, Mapping

import flax.linen as nn

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.lm import HourglassLM


def build_model(model_cfg: Mapping[str, Any] | ModelConfig) -> nn.Module:
  """Validates a `model` config section (ConfigDict, dict or ModelConfig) and returns the Linen module."""
  cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
  return HourglassLM(cfg)


__all__ = ["Hierarchy", "HourglassLM", "ModelConfig", "build_model", "parse_hierarchy"]
