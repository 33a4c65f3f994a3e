"""The boundary-predictor interface, its registry (a name resolves to a `Predictor`), and the losses and masks
predictors share."""

import dataclasses
import math
from typing import ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from hourglass_jax.model.layer_config import LayerConfig, setting

DYNAMIC = "dynamic"  # shorten='dynamic', and the kind of function a dynamic level's settings change
PREDICTORS: dict[str, type["BoundaryPredictor"]] = {}  # key -> class, in the order registered


class Decision(NamedTuple):
  """A predictor's decisions on x's positions: b [B, L] (value 0/1, straight-through gradients where learned; b_t
  closes the segment holding t), the probabilities the level smooths its segment outputs by (H-Net; None: none),
  its weighted losses to sow by name (forward pass), its decoding state after each position [B, T, ...]."""
  boundaries_BxL: jax.Array
  probs_BxL: jax.Array | None = None
  losses: dict = {}
  state: dict = {}


class BoundaryPredictor(nn.Module):
  """A dynamic level's boundary predictor: `__call__(x [B, L, D], deterministic, positions_L, lengths_B, state,
  **inputs)` -> `Decision`, b_t decided from positions <= t. `positions_L`: x's entries in the level's stream (0..
  when None); `lengths_B`: the positions of each row its losses count (a nested level's filled slots); `state`: the
  decoding state before x's first position (None: a forward pass); `inputs`: what it reads besides x.

  A subclass declares its `key` (the name `boundaries` gives it; `parse` for names that carry settings) and the
  `examples` of its names the conformance grid builds it with (tests/test_predictors.py; default: `key`), the
  `module_name` of its parameters under the level, whether it can cut an `inner` level's stream of segments (not
  only bytes), the keyword `inputs` it reads (`from_tokens` makes them); its settings as fields made with `setting`
  (the dynamic level's settings and the config keys model.<name> derive from them; another predictor's, or the
  model's, are taken with `module_fields`), which the level fills, and their `check`; what `describe` adds to a
  summary of its cuts; its per-row decoding state (`new_state`); its (params, forward FLOPs) at a level of `length`
  positions (`cost`); `loss_weight`, the boundary_loss_weight the presets give its loss (None: it has none;
  `cpu_loss_weight`: the CPU preset's, for one level, where it differs); and `segment_length`, where it fixes its
  segments' length."""
  cfg: LayerConfig
  factor: int
  boundary_loss_weight: float = setting(1.0)  # the weight of its loss in training (a prior, H-Net's ratio loss)

  key: ClassVar[str]
  examples: ClassVar[tuple[str, ...]] = ()
  module_name: ClassVar[str]
  inner: ClassVar[bool] = True
  inputs: ClassVar[tuple[str, ...]] = ()
  loss_weight: ClassVar[float | None] = None
  cpu_loss_weight: ClassVar[float | None] = None

  @classmethod
  def parse(cls, name: str) -> dict | None:
    return {} if name == cls.key else None

  @classmethod
  def settings(cls) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if "function_of" in f.metadata)

  @classmethod
  def check(cls, level, prefix: str) -> None:
    if not 0 <= float(level.boundary_loss_weight) < math.inf:
      raise ValueError(f"{prefix}boundary_loss_weight={level.boundary_loss_weight!r} must be a finite number >= 0.")

  @classmethod
  def describe(cls, level) -> str:
    return ""

  @classmethod
  def from_tokens(cls, cfg, tokens_BxL, targets: bool) -> dict:
    return {}

  @classmethod
  def new_state(cls, batch: int, d_model: int, dtype) -> dict:
    return {}

  @classmethod
  def cost(cls, cfg, length: int) -> tuple[int, int]:
    return 0, 0

  @classmethod
  def segment_length(cls, **settings) -> int | None:
    return None


def register(cls):
  PREDICTORS[cls.key] = cls
  return cls


@dataclasses.dataclass(frozen=True)
class Predictor:
  """A level's predictor, resolved once from its name in `boundaries` and handed down: its class, whose attributes
  it reads through (`inner`, `inputs`, `cost`, `new_state`, `from_tokens`, ...), and the settings the name gives
  ('every2': count=2)."""
  name: str
  cls: type[BoundaryPredictor]
  named: tuple = ()  # (setting, value) pairs

  def __getattr__(self, attribute: str):
    if attribute.startswith("__"):  # copy and pickle probe before the fields exist
      raise AttributeError(attribute)
    return getattr(self.cls, attribute)

  def __str__(self) -> str:
    return self.name

  @property
  def segment_length(self) -> int | None:
    return self.cls.segment_length(**dict(self.named))

  def module(self, cfg: LayerConfig, factor: int, level) -> BoundaryPredictor:
    """Its module at a level of `factor`, the settings from the level's fields of their names."""
    settings = {f.name: getattr(level, f.name) for f in self.cls.settings()}
    return self.cls(cfg, factor, **dict(settings, **dict(self.named)), name=self.cls.module_name)


def resolve(name, owner: str = "boundaries") -> Predictor:
  """The predictor `name` picks (a resolved one passes through); ValueError naming the choices."""
  if isinstance(name, Predictor):
    return name
  for cls in PREDICTORS.values():
    if (settings := cls.parse(name)) is not None:
      return Predictor(name, cls, tuple(settings.items()))
  raise ValueError(f"{owner}={name!r} is not supported; choose one of {', '.join(PREDICTORS)}.")


def valid_positions(shape, lengths_B=None):
  """float32 [B, L]: 1 at each row's first `lengths_B` positions (all of them when None)."""
  if lengths_B is None:
    return jnp.ones(shape, jnp.float32)
  return (jnp.arange(shape[1])[None, :] < lengths_B[:, None]).astype(jnp.float32)


def masked_mean(values_BxL, valid_BxL):
  return jnp.sum(values_BxL.astype(jnp.float32) * valid_BxL) / jnp.maximum(valid_BxL.sum(), 1.0)


def binomial_prior_loss(boundaries_BxL, rate: float, lengths_B=None):
  """-log Binomial(sum_t b_t; n, rate) / n, averaged over rows, n each row's `lengths_B` (default L): Nawrot et
  al.'s prior toward `rate` over the positions that exist (b may carry straight-through gradients; the log-pmf is
  smooth in its count)."""
  valid_BxL = valid_positions(boundaries_BxL.shape, lengths_B)
  n_B = valid_BxL.sum(axis=1)
  count_B = (boundaries_BxL.astype(jnp.float32) * valid_BxL).sum(axis=1)
  log_pmf_B = (gammaln(n_B + 1.0) - gammaln(count_B + 1.0) - gammaln(n_B - count_B + 1.0)
               + count_B * math.log(rate) + (n_B - count_B) * math.log1p(-rate))
  return jnp.mean(-log_pmf_B / jnp.maximum(n_B, 1.0))


def previous_rows(values_BxL, previous_B=None, has_previous_B=None):
  """values one row later (row t gets row t-1, along axis 1); row 0 gets `previous_B` (decoding: the row before
  x's first) where `has_previous_B`, else its own value."""
  first_B = values_BxL[:, 0] if previous_B is None else jnp.where(
      has_previous_B.reshape(has_previous_B.shape + (1,) * (values_BxL.ndim - 2)), previous_B.astype(values_BxL.dtype),
      values_BxL[:, 0])
  return jnp.concatenate([first_B[:, None], values_BxL[:, :-1]], axis=1)
