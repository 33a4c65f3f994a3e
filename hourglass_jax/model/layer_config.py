"""The settings every transformer block reads (width, heads, dropout, dtype, attention, positions), declared once
(`BlockSettings`) and validated once.

`ModelConfig` and `LayerConfig` inherit the declaration; `LayerOptions`, the base of the reusable modules
(`hourglass_jax.nn`), takes the same fields as keyword arguments (`module_fields`) and turns them into a `LayerConfig`
for the blocks inside.
"""

import dataclasses
import numbers
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hourglass_jax.ops.attention import IMPLEMENTATIONS as ATTENTION_IMPLS

POSITIONS = ("rope", "relative")
DTYPES = ("float32", "bfloat16", "float16")
# What a rematerialised block keeps for the backward pass: nothing (recompute the whole block) or its matmul outputs.
REMAT_POLICIES = ("none", "nothing_saveable", "dots_saveable")


def check_choice(field: str, value: Any, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"{field}={value!r} is not supported; choose one of {', '.join(allowed)}.")


def check_int(field: str, value: Any, minimum: int = 1) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise ValueError(f"{field}={value!r} must be an integer >= {minimum}.")


def check_types(settings: Any, prefix: str) -> None:
  """Strings and numbers of the right kind, so that a list or a quoted number fails here, not deep in a module."""
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    example = f" such as {field.default!r}" if field.default not in ("", None, dataclasses.MISSING) else ""
    if field.type is str and not isinstance(value, str):
      raise ValueError(f"{prefix}{field.name}={value!r} is a {type(value).__name__}; it must be a string{example}.")
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    optional = field.type == (float | None)
    if field.type in (float, float | None) and not number and not (optional and value is None):
      raise ValueError(f"{prefix}{field.name}={value!r} is a {type(value).__name__}; it must be a number{example} "
                       "(unquoted).")


def check_dtype_runs_here(dtype: str, prefix: str = "") -> None:
  """Raises ValueError for dtype='float16' where JAX runs on the CPU: XLA:CPU has no float16 matmul that
  accumulates in float32, and fails deep in compilation ("F16_F16_F32 not supported")."""
  if dtype == "float16" and jax.default_backend() == "cpu":
    raise ValueError(f"{prefix}dtype='float16' does not run on the CPU (XLA:CPU has no float16 matmul with float32 "
                     f"accumulation); use {prefix}dtype='bfloat16' or 'float32' here, float16 on a GPU.")


def check_layer_settings(s: Any, prefix: str = "") -> None:
  """Validates the block settings of `s` (a LayerConfig or a ModelConfig: both derive head_dim and
  attention_dropout_rate from them); `prefix` names their section."""
  check_int(f"{prefix}d_model", s.d_model)
  check_int(f"{prefix}num_heads", s.num_heads)
  check_int(f"{prefix}d_ff", s.d_ff)
  if s.d_model % s.num_heads:
    raise ValueError(f"{prefix}d_model={s.d_model} is not divisible by {prefix}num_heads={s.num_heads}; "
                     "pick a d_model that is a multiple of num_heads.")
  check_choice(f"{prefix}position", s.position, POSITIONS)
  check_choice(f"{prefix}dtype", s.dtype, DTYPES)
  check_choice(f"{prefix}attention_impl", s.attention_impl, ATTENTION_IMPLS)
  check_choice(f"{prefix}remat_policy", s.remat_policy, REMAT_POLICIES)
  check_int(f"{prefix}scan_unroll", s.scan_unroll, 0)
  if s.position == "rope" and s.head_dim % 2:
    raise ValueError(f"{prefix}position='rope' needs an even head size, got d_model/num_heads={s.head_dim}.")
  if not 0.0 <= float(s.dropout) < 1.0:
    raise ValueError(f"{prefix}dropout={s.dropout!r} must be in [0, 1).")
  if s.attention_dropout is not None and not 0.0 <= float(s.attention_dropout) < 1.0:
    raise ValueError(f"{prefix}attention_dropout={s.attention_dropout!r} must be in [0, 1) (or None: the same "
                     f"as {prefix}dropout).")
  if not float(s.rope_base) > 1.0:
    raise ValueError(f"{prefix}rope_base={s.rope_base!r} must be > 1 (10000 is the usual value).")
  if not 0.0 < float(s.layer_norm_eps) < 1.0:
    raise ValueError(f"{prefix}layer_norm_eps={s.layer_norm_eps!r} must be in (0, 1) (1e-6 is the default).")
  if s.attention_impl in ("cudnn", "splash") and s.attention_dropout_rate > 0:
    raise ValueError(f"{prefix}attention_impl={s.attention_impl!r} is a fused kernel without attention-"
                     f"probability dropout, but the attention dropout is {s.attention_dropout_rate}; use "
                     f"'auto', 'xla' or 'block', or {prefix}attention_dropout=0.")
  if s.attention_impl in ("cudnn", "splash", "flash") and s.position == "relative":
    raise ValueError(f"{prefix}attention_impl={s.attention_impl!r} cannot add Transformer-XL position biases; "
                     "use position='rope' or attention_impl='xla'.")


EVERY_KIND = "every kind"  # `setting(function_of=EVERY_KIND)`: the field changes every kind's function


def setting(default, *, function_of=()):
  """A config field. `function_of`: the model kinds whose function it changes while every parameter shape stays
  (a factor in `hierarchy`, 'avg' vs 'repeat', rope_base...; EVERY_KIND for all): checkpoints record it and a
  resume, evaluation or sample compares it, since the shape check cannot see it."""
  return dataclasses.field(default=default, metadata={"function_of": function_of})


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSettings:
  """The block settings, declared once with the defaults of `ModelConfig` (which inherits them, as `LayerConfig`
  does); the modules of `hourglass_jax.nn` take them as keyword arguments (`LayerOptions`)."""
  d_model: int = 512  # the width of the residual stream
  num_heads: int = 8  # attention heads, d_model / num_heads wide each
  d_ff: int = 2048  # the feed-forward's hidden width
  dropout: float = 0.0  # on the residual branches and the embedding, in training
  attention_dropout: float | None = None  # attention-probability dropout; None = dropout (as the paper)
  dtype: str = "float32"  # DTYPES: the compute dtype (parameters stay float32)
  attention_impl: str = "auto"  # ATTENTION_IMPLS: the attention kernel (ops/attention.py)
  position: str = setting("rope", function_of=EVERY_KIND)  # POSITIONS: rotary, or Transformer-XL relative biases
  rope_base: float = setting(10_000.0, function_of=EVERY_KIND)  # the rotary frequencies' base
  layer_norm_eps: float = setting(1e-6, function_of=EVERY_KIND)  # added to the variance in every LayerNorm
  # REMAT_POLICIES: what each block keeps for the backward pass (execution only: same function, same params):
  # everything ('none'), nothing ('nothing_saveable': least memory, the block is recomputed) or its matmul outputs
  # ('dots_saveable': less recomputation, more memory)
  remat_policy: str = "none"
  scan_unroll: int = 1  # blocks one scan iteration holds (1 = one compiled block per stack; 0 = fully unrolled)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def attention_dropout_rate(self) -> float:
    """Dropout on attention probabilities: `attention_dropout`, or `dropout` when that is None."""
    return float(self.dropout if self.attention_dropout is None else self.attention_dropout)


LAYER_FIELDS = tuple(f.name for f in dataclasses.fields(BlockSettings))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerConfig(BlockSettings):
  """What a block reads: the model width, heads, feed-forward width, dropout, dtype, attention kernel, positions,
  and how its stack executes (remat policy, scan unroll). Validated when built."""

  def __post_init__(self):
    check_types(self, "")
    check_layer_settings(self)

  def options(self) -> dict[str, Any]:
    """These settings as the keyword arguments of a `LayerOptions` module."""
    return {name: getattr(self, name) for name in LAYER_FIELDS}


@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabSettings:
  """The token vocabulary: the LM's embedding and head read it, and a predictor that predicts tokens ('entropy')."""
  vocab_size: int = setting(256)  # token ids 0..vocab_size-1 (256: bytes)


def settings_class(name: str, fields, frozen: bool = False, **defaults) -> type:
  """A keyword-only dataclass of `fields` (other classes' declarations: names, types, defaults, metadata); `defaults`
  replaces some defaults, which it records as its `settings_overrides` (None makes the field optional)."""
  made = dataclasses.make_dataclass(name, [
      (f.name, f.type | None if f.name in defaults and defaults[f.name] is None else f.type,
       dataclasses.field(default=defaults.get(f.name, f.default), metadata=f.metadata, kw_only=True))
      for f in fields], frozen=frozen, repr=False, eq=False)
  made.settings_overrides = defaults
  return made


def module_fields(settings: type, *names: str, **defaults) -> type:
  """The fields of the dataclass `settings` (those of `names`, when given) for a Linen module to inherit (it cannot
  inherit a frozen dataclass), `defaults` its overrides."""
  fields = dataclasses.fields(settings)
  return settings_class(f"{settings.__name__}Fields", [f for f in fields if f.name in names or not names], **defaults)


class LayerOptions(module_fields(BlockSettings, d_model=None, d_ff=None), nn.Module):
  """Keyword-only block settings shared by the reusable modules: `BlockSettings`' fields and defaults, except that
  a module adapts to its input, so `d_model=None` takes the input's width and `d_ff=None` four times it (a config
  describes a whole model, so there they are numbers)."""

  def check_cache_length(self, length: int, multiple: int) -> None:
    """Raises unless a decoding cache of `length` positions is a positive multiple of `multiple` (the body's
    total shortening or coarsest scale)."""
    if not isinstance(length, int) or length < 1 or length % multiple:
      raise ValueError(f"{type(self).__name__}.new_cache: length={length!r} must be a positive multiple of "
                       f"{multiple} (the body's total shortening); round the longest sequence you will decode up.")

  def layer_config(self, width: int) -> LayerConfig:
    """The validated settings for an input of `width` channels (which must equal d_model when that is given)."""
    if self.d_model is not None and self.d_model != width:
      raise ValueError(f"{type(self).__name__}: the input has {width} channels but d_model={self.d_model}; pass "
                       f"inputs [B, L, {self.d_model}] or leave d_model=None to take the input's width.")
    check_dtype_runs_here(self.dtype, f"{type(self).__name__}.")
    values = {name: getattr(self, name) for name in LAYER_FIELDS}
    values["d_model"] = width
    values["d_ff"] = 4 * width if self.d_ff is None else self.d_ff
    try:
      return LayerConfig(**values)
    except ValueError as error:
      raise ValueError(f"{type(self).__name__}: {error}") from None
