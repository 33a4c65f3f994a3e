"""Frozen model configuration, validated when built; modules read this, never the ConfigDict."""

import dataclasses
from typing import Any, Mapping

from hourglass_jax.model.draft_heads import DraftHeadSettings, check_draft_head_settings
from hourglass_jax.model.hourglass.hierarchy import Hierarchy, HourglassSettings, parse_hierarchy
from hourglass_jax.model.layer_config import (ATTENTION_IMPLS, DTYPES, EVERY_KIND, LAYER_FIELDS, POSITIONS,
                                              REMAT_POLICIES, BlockSettings, LayerConfig, VocabSettings, check_choice,
                                              check_int, check_layer_settings, check_types, setting)
from hourglass_jax.model.hourglass.dynamic.level import (DYNAMIC, DYNAMIC_FIELDS, DynamicSettings, BoundaryPredictor,
                                                         check_dynamic_settings, level_predictors)
from hourglass_jax.model.resampling import (DOWNSAMPLERS, SHORTEN_METHODS, SHORTENINGS, UPSAMPLE_METHODS, UPSAMPLERS,
                                           UPSAMPLINGS)
from hourglass_jax.model.multiscale.scales import MULTISCALE_KINDS, MultiScale, MultiScaleSettings, parse_multiscale

KINDS = ("hourglass", "vanilla", "topdown", "bottomup", "retina")
MAX_VOCAB_SIZE = 2**31 - 1  # token ids are int32
SHORTEN = SHORTEN_METHODS  # fixed-factor methods; shorten may also be 'dynamic' (learned or given boundaries)
UPSAMPLE = UPSAMPLE_METHODS
__all__ = ["ATTENTION_IMPLS", "DOWNSAMPLERS", "DTYPES", "POSITIONS", "REMAT_POLICIES", "UPSAMPLERS", "ModelConfig",
           "function_fields", "config_section_fields"]


@dataclasses.dataclass(frozen=True)
class ModelConfig(DraftHeadSettings, DynamicSettings, MultiScaleSettings, HourglassSettings, VocabSettings,
                  BlockSettings):
  """Everything a model module needs. Build from a ConfigDict with `ModelConfig.from_dict(cfg.model)`.

  Every field but `kind` is declared once in the settings class of the modules that read it: the block settings
  (d_model, num_heads, ..., `BlockSettings`, layer_config.py), `vocab_size` (`VocabSettings`), the Hourglass body's
  (`HourglassSettings`, hourglass/hierarchy.py), the multi-scale fields (`MultiScaleSettings`, multiscale/scales.py),
  for shorten='dynamic' the dynamic level's and its predictors' (`DynamicSettings`, hourglass/dynamic/), and the
  multi-byte draft heads' (`DraftHeadSettings`, draft_heads.py).
  hourglass and vanilla take their depth from `hierarchy`; retina (one stack) from a single-level `hierarchy` such
  as '12@1'; topdown and bottomup from `layers_per_scale`. The defaults describe the papers' models (configs/enwik8.py,
  '64,16,4,1'); the `hourglass_jax.nn` modules override some with small bodies to build on ('2@1 4@3 2@1', '16,4,1')
  and take d_model and d_ff from their input.
  """
  kind: str = setting("hourglass", function_of=KINDS)  # KINDS: the body

  def __post_init__(self):
    check_types(self, "model.")
    check_choice("model.kind", self.kind, KINDS)
    check_int("model.vocab_size", self.vocab_size, 2)
    if self.vocab_size > MAX_VOCAB_SIZE:
      raise ValueError(f"model.vocab_size={self.vocab_size:,} is more than int32 token ids can name (at most "
                       f"{MAX_VOCAB_SIZE:,}); byte-level models use 256.")
    check_layer_settings(self, "model.")
    check_choice("model.shorten", self.shorten, (*SHORTENINGS, DYNAMIC))  # the registry as it is now
    check_choice("model.upsample", self.upsample, tuple(UPSAMPLINGS))
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
    if self.dynamic:
      check_dynamic_settings(self, "model.")  # with every level's predictor (`level_predictors`)
    else:
      _check_no_dynamic_settings(self)
    check_draft_head_settings(self, "model.")

  @property
  def dynamic(self) -> bool:
    """An Hourglass with a learned (or given) segment level: shorten='dynamic'."""
    return self.kind == "hourglass" and self.shorten == DYNAMIC

  @property
  def level_predictors(self) -> tuple[type[BoundaryPredictor], ...]:
    """The boundary predictor of each shortened level, outermost first, resolved (dynamic models only)."""
    return level_predictors(self.parsed_hierarchy, self.upsample, self.boundaries)

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


# Read only by a dynamic level (not vocab_size, 'entropy' reads the model's): elsewhere they would be ignored unsaid.
DYNAMIC_ONLY_FIELDS = tuple(name for name in DYNAMIC_FIELDS if name not in VocabSettings.__dataclass_fields__)


def without_dynamic_settings(fields: dict) -> dict:
  """`fields` (a model section) with every dynamic-only setting at its default: a learned level's fixed twin."""
  defaults = ModelConfig.__dataclass_fields__
  return {**fields, **{name: defaults[name].default for name in DYNAMIC_ONLY_FIELDS}}


def _check_no_dynamic_settings(cfg: ModelConfig) -> None:
  changed = [f"model.{name}={getattr(cfg, name)!r}" for name, default in without_dynamic_settings({}).items()
             if getattr(cfg, name) != default]
  if changed:
    owner = f"kind={cfg.kind!r}" if cfg.kind != "hourglass" else f"shorten={cfg.shorten!r}"
    raise ValueError(f"{', '.join(changed)} only apply to learned shortening (shorten='dynamic'), but this model has "
                     f"{owner}: set model.shorten='dynamic' (and upsample='repeat'), or leave "
                     f"{'them' if len(changed) > 1 else 'it'} at the default.")


def function_fields(kind: str) -> tuple[str, ...]:
  """The fields that change a `kind` model's function without changing a parameter shape (see `_field`); kind
  'dynamic': those that do so only with shorten='dynamic', beside the hourglass ones."""
  return tuple(f.name for f in dataclasses.fields(ModelConfig)
               if kind in (KINDS if f.metadata.get("function_of") == EVERY_KIND else f.metadata.get("function_of", ())))


def config_section_fields() -> dict[str, Any]:
  """The `model` config section: every ModelConfig field and its default."""
  return {f.name: getattr(ModelConfig(), f.name) for f in dataclasses.fields(ModelConfig)}


def function_changes(saved: dict, model: dict, saved_as: str = "checkpoint", model_as: str = "config") -> list[str]:
  """'model.F: checkpoint A, config B' for each field that changes the function of either side's kind without
  changing a parameter shape (`function_fields`; the shape check cannot see them) and differs.
  `saved_as` and `model_as` name the two sides."""
  kinds = [kind for kind in (saved.get("kind"), model.get("kind")) if kind in KINDS]
  kinds += [DYNAMIC for side in (saved, model) if side.get("kind") == "hourglass" and side.get("shorten") == DYNAMIC]
  fields = [field for kind in kinds for field in function_fields(kind)]
  return [f"model.{k}: {saved_as} {saved[k]!r}, {model_as} {model.get(k)!r}" for k in dict.fromkeys(fields)
          if k in saved and saved[k] != model.get(k, saved[k])]
