"""Frozen model configuration, validated when built; modules read this, never the ConfigDict."""

import dataclasses
from typing import Any, Mapping

from hourglass_jax.model.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.layer_config import (ATTENTION_IMPLS, DTYPES, LAYER_FIELDS, POSITIONS, REMAT_POLICIES,
                                              DerivedLayerSettings, LayerConfig, check_choice, check_int,
                                              check_layer_settings, check_types)
from hourglass_jax.model.resampling import SHORTEN_METHODS, UPSAMPLE_METHODS
from hourglass_jax.model.scale_resampling import DOWNSAMPLERS, UPSAMPLERS
from hourglass_jax.model.scales import MultiScale, parse_multiscale

KINDS = ("hourglass", "vanilla", "topdown", "bottomup", "retina")
MULTISCALE_KINDS = ("topdown", "bottomup", "retina")
SHORTEN = SHORTEN_METHODS
UPSAMPLE = UPSAMPLE_METHODS
__all__ = ["ATTENTION_IMPLS", "DOWNSAMPLERS", "DTYPES", "POSITIONS", "REMAT_POLICIES", "UPSAMPLERS", "ModelConfig"]


@dataclasses.dataclass(frozen=True)
class ModelConfig(DerivedLayerSettings):
  """Everything a model module needs. Build from a ConfigDict with `ModelConfig.from_dict(cfg.model)`.

  hourglass and vanilla take their depth from `hierarchy`; retina (one stack) from a single-level `hierarchy` such
  as '12@1'; topdown and bottomup from `layers_per_scale`. See scales.py for the multi-scale notation.
  """
  kind: str = "hourglass"
  vocab_size: int = 256
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  hierarchy: str = "5@1 24@3 5@1"
  shorten: str = "attention_avg"
  upsample: str = "attention_repeat"
  position: str = "rope"
  dropout: float = 0.0
  attention_dropout: float | None = None  # attention-probability dropout; None = model.dropout (as the paper)
  dtype: str = "float32"
  attention_impl: str = "auto"
  layer_norm_eps: float = 1e-6
  rope_base: float = 10_000.0
  scales: str = "64,16,4,1"
  layers_per_scale: str = "2,4,8,12"
  heads_per_scale: str = ""
  downsampler: str = "avg"
  upsampler: str = "transposed_conv"
  retina_windows: str = ""
  # Execution only (same function, same params): activation rematerialisation inside each scanned block, and how
  # many blocks one scan iteration holds (1 = one compiled block per stack; 0 = fully unrolled).
  remat_policy: str = "none"
  scan_unroll: int = 1

  def __post_init__(self):
    check_types(self, "model.")
    check_choice("model.kind", self.kind, KINDS)
    check_int("model.vocab_size", self.vocab_size, 2)
    check_layer_settings(self, "model.")
    check_choice("model.shorten", self.shorten, SHORTEN)
    check_choice("model.upsample", self.upsample, UPSAMPLE)
    check_choice("model.downsampler", self.downsampler, DOWNSAMPLERS)
    check_choice("model.upsampler", self.upsampler, UPSAMPLERS)
    hierarchy = parse_hierarchy(self.hierarchy)
    if self.kind in ("vanilla", "retina") and hierarchy.depth:
      raise ValueError(f"model.hierarchy={self.hierarchy!r}: kind={self.kind!r} takes a single full-resolution "
                       "level such as '8@1'.")
    if self.kind == "hourglass" and not hierarchy.depth:
      raise ValueError(f"model.hierarchy={self.hierarchy!r} has no shortened level; use kind='vanilla' or add one, "
                       "e.g. '2@1 4@3 2@1'.")
    if self.kind in MULTISCALE_KINDS:
      _ = self.parsed_scales  # raises on malformed multi-scale fields

  @property
  def parsed_scales(self) -> MultiScale:
    """The multi-scale fields `kind` uses, parsed (multi-scale kinds only)."""
    return parse_multiscale(self.kind, self.scales, self.layers_per_scale, self.heads_per_scale, self.retina_windows,
                            self.num_heads)

  @property
  def pad_multiple(self) -> int:
    """Sequences are padded (at the end) to a multiple of this: the total shortening or the coarsest scale."""
    if self.kind in MULTISCALE_KINDS:
      return self.parsed_scales.coarsest
    return self.parsed_hierarchy.total_factor

  @property
  def parsed_hierarchy(self) -> Hierarchy:
    return parse_hierarchy(self.hierarchy)

  @property
  def layer_config(self) -> LayerConfig:
    """The block settings, for the reusable modules (`layer_config.options()` are their keyword arguments)."""
    return LayerConfig(**{name: getattr(self, name) for name in LAYER_FIELDS})

  @classmethod
  def from_dict(cls, cfg: Mapping[str, Any]) -> "ModelConfig":
    """Builds from a mapping (e.g. ConfigDict); unknown keys raise, listing the known ones."""
    if not hasattr(cfg, "items"):
      raise ValueError(f"a model config must be a mapping (ConfigDict or dict) or a ModelConfig, got "
                       f"{type(cfg).__name__} {cfg!r:.60}; pass a `model` section, e.g. "
                       "build_model(get_config().model).")
    values = dict(cfg.items())
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      hint = " (this looks like a whole config: pass its `model` section)" if "model" in unknown else ""
      raise ValueError(f"model config has unknown field(s) {unknown}{hint}; known fields are {sorted(known)}.")
    return cls(**values)
