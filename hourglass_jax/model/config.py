"""Frozen model configuration, validated when built; modules read this, never the ConfigDict."""

import dataclasses
import numbers
from typing import Any, Mapping

import jax.numpy as jnp

from hourglass_jax.model.hierarchy import Hierarchy, parse_hierarchy
from hourglass_jax.model.scales import MultiScale, parse_multiscale

KINDS = ("hourglass", "vanilla", "topdown", "bottomup", "retina")
MULTISCALE_KINDS = ("topdown", "bottomup", "retina")
SHORTEN = ("avg", "linear", "attention_avg", "attention_linear")
UPSAMPLE = ("repeat", "linear", "attention_repeat", "attention_linear", "none")
POSITIONS = ("rope", "relative")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "block", "reference")
DOWNSAMPLERS = ("avg", "conv")
UPSAMPLERS = ("transposed_conv", "repeat")
# What a rematerialised block keeps for the backward pass: nothing (recompute the whole block) or its matmul outputs.
REMAT_POLICIES = ("none", "nothing_saveable", "dots_saveable")


def _choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"model.{field}={value!r} is not supported; choose one of {', '.join(allowed)}.")


def _check_types(cfg: "ModelConfig") -> None:
  """Strings and numbers of the right kind, so that a list or a quoted number fails here, not deep in a module."""
  for field in dataclasses.fields(cfg):
    value = getattr(cfg, field.name)
    example = f" such as {field.default!r}" if field.default not in ("", None) else ""
    if field.type is str and not isinstance(value, str):
      raise ValueError(f"model.{field.name}={value!r} is a {type(value).__name__}; it must be a string{example}.")
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    optional = field.type == (float | None)
    if field.type in (float, float | None) and not number and not (optional and value is None):
      raise ValueError(f"model.{field.name}={value!r} is a {type(value).__name__}; it must be a number{example} "
                       "(unquoted).")


def _positive_int(field: str, value: Any, minimum: int = 1) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"model.{field}={value!r} must be an integer >= {minimum}.")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
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
    _check_types(self)
    _choice("kind", self.kind, KINDS)
    _positive_int("vocab_size", self.vocab_size, 2)
    _positive_int("d_model", self.d_model)
    _positive_int("num_heads", self.num_heads)
    _positive_int("d_ff", self.d_ff)
    if self.d_model % self.num_heads:
      raise ValueError(f"model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}; "
                       "pick a d_model that is a multiple of num_heads.")
    _choice("shorten", self.shorten, SHORTEN)
    _choice("upsample", self.upsample, UPSAMPLE)
    _choice("position", self.position, POSITIONS)
    _choice("dtype", self.dtype, DTYPES)
    _choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
    _choice("downsampler", self.downsampler, DOWNSAMPLERS)
    _choice("upsampler", self.upsampler, UPSAMPLERS)
    _choice("remat_policy", self.remat_policy, REMAT_POLICIES)
    _positive_int("scan_unroll", self.scan_unroll, 0)
    if self.position == "rope" and self.head_dim % 2:
      raise ValueError(f"model.position='rope' needs an even head size, got d_model/num_heads={self.head_dim}.")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ValueError(f"model.dropout={self.dropout!r} must be in [0, 1).")
    if self.attention_dropout is not None and not 0.0 <= float(self.attention_dropout) < 1.0:
      raise ValueError(f"model.attention_dropout={self.attention_dropout!r} must be in [0, 1) (or None: the same "
                       "as model.dropout).")
    if self.attention_impl in ("cudnn", "splash") and self.attention_dropout_rate > 0:
      raise ValueError(f"model.attention_impl={self.attention_impl!r} is a fused kernel without attention-"
                       f"probability dropout, but the attention dropout is {self.attention_dropout_rate}; use "
                       "'auto', 'xla' or 'block', or model.attention_dropout=0.")
    if self.attention_impl in ("cudnn", "splash") and self.position == "relative":
      raise ValueError(f"model.attention_impl={self.attention_impl!r} cannot add Transformer-XL position biases; "
                       "use position='rope' or attention_impl='xla'.")
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
  def attention_dropout_rate(self) -> float:
    """Dropout on attention probabilities: `attention_dropout`, or `dropout` when that is None."""
    return float(self.dropout if self.attention_dropout is None else self.attention_dropout)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

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
