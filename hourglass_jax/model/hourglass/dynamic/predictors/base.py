"""The boundary-predictor interface, its registry, and the losses and masks predictors share."""

import dataclasses
import functools
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
  when None; [B, L] in decoding rows at their own entries); `lengths_B`: the positions of each row its losses
  count (a nested level's filled slots); `state`: the decoding state before x's first position (None: a forward
  pass); `inputs`: what it reads besides x.

  A subclass declares its `key` (the name `boundaries` gives it; `parse` for names that carry settings) and the
  `examples` the conformance grid builds it with (tests/test_predictors.py; default: `key`), the `module_name` of
  its parameters, whether it can cut an `inner` level's stream of segments, the keyword `inputs` it reads
  (`from_tokens` makes them); its settings, fields made with `setting` (the level's settings and config keys derive
  from them; another's are taken with `module_fields`), and their `check`; what `describe` adds to a summary of its
  cuts; its per-row decoding `new_state`; its (params, forward FLOPs) at `length` positions (`cost`); `loss_weight`,
  the boundary_loss_weight the presets give its loss (None: no loss; `cpu_loss_weight`: the CPU preset's for one
  level, where it differs); and `segment_length`, where it fixes its segments' length."""
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

  # Without their own: nothing to add to a summary, no inputs, no decoding state, no cost, no fixed segment length.
  describe = classmethod(lambda cls, level: "")
  from_tokens = classmethod(lambda cls, cfg, tokens_BxL, targets: {})
  new_state = classmethod(lambda cls, batch, d_model, dtype: {})
  cost = classmethod(lambda cls, cfg, length: (0, 0))
  segment_length = classmethod(lambda cls: None)

  @classmethod
  def module(cls, cfg: LayerConfig, factor: int, level) -> "BoundaryPredictor":
    """Its module at a level of `factor`, its settings from the level's fields of their names."""
    return cls(cfg, factor, **{f.name: getattr(level, f.name) for f in cls.settings()}, name=cls.module_name)


def register(cls):
  """Adds `cls` to PREDICTORS; ValueError when one of its settings has the name of another predictor's with another
  type, default or meaning (the config keys are one namespace: it would silently replace that one)."""
  taken = {}  # setting name -> (the first predictor declaring it, its field)
  for other in (BoundaryPredictor, *PREDICTORS.values()):
    for f in other.settings():
      taken.setdefault(f.name, (other, f))
  for field in cls.settings():
    other, same = taken.get(field.name, (None, field))
    if (same.type, same.default, dict(same.metadata)) != (field.type, field.default, dict(field.metadata)):
      owner = getattr(other, "key", "every predictor")
      raise ValueError(f"predictor {cls.key!r}: its setting {field.name!r} clashes with {owner!r}'s setting of that "
                       f"name (type {same.type}, default {same.default!r}); give it another name, or borrow that one "
                       "with module_fields.")
  PREDICTORS[cls.key] = cls
  return cls


def resolve(name, owner: str = "boundaries") -> type[BoundaryPredictor]:
  """The predictor class `name` picks (a class passes through): for a name that carries settings ('every2'), a
  subclass keyed by the name with them as its defaults (one per name). ValueError naming the choices."""
  if isinstance(name, type):
    return name
  for cls in PREDICTORS.values():
    if (settings := cls.parse(name)) is not None:
      return _named(cls, name, tuple(settings.items())) if settings else cls
  raise ValueError(f"{owner}={name!r} is not supported; choose one of {', '.join(PREDICTORS)}.")


@functools.cache
def _named(cls, name: str, settings: tuple) -> type[BoundaryPredictor]:
  return type(cls.__name__, (cls,), {"__module__": cls.__module__, "__annotations__": {k: type(v) for k, v in settings},
                                     "key": name, **dict(settings)})


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
