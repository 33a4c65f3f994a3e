"""A dynamically shortened Hourglass level's resampling (dynamic token pooling, Nawrot et al. 2023): boundary
decisions -> segments -> their means (`DynamicShorten`), and each position's last completed segment back
(`DynamicUpsample`). The segment ops and their causality argument are in segments.py; the boundary predictors
('boundaries') in predictors/, one module each.
"""

import dataclasses
import functools
import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic.segments import (completed_segments, pool_segments, positions_in_segments,
                                                            segment_boundary_probs, segment_ids, smooth_segments,
                                                            straight_through_weights, upsample_segments)
from hourglass_jax.model.hourglass.dynamic.predictors import (DYNAMIC, INNER_PREDICTORS, PREDICTORS, SETTINGS,
                                                              BoundaryPredictor, resolve)
from hourglass_jax.model.hourglass.dynamic.predictors.base import masked_mean, valid_positions
from hourglass_jax.model.layer_config import (LayerConfig, LayerOptions, check_choice, check_int, module_fields,
                                              setting, settings_class)
from hourglass_jax.model.layers import layer_norm

SEGMENT_POOLINGS = ("mean", "linear")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LevelSettings:
  """A dynamic level's own settings; `DynamicSettings` adds those its predictors declare."""
  # 'gumbel', not 'whitespace' (which the study ranks first on bytes, and configs/dynamic.py picks): the same default
  # serves hnn.Hourglass / DynamicShorten over embeddings, which have no bytes to read, every level of a nested
  # hierarchy (only the outermost level sees bytes), and vocabularies that are not bytes; 'gumbel' works for all.
  boundaries: str = setting("gumbel", function_of=(DYNAMIC,))  # a predictor, or one per level outermost first
  segment_capacity: float = setting(1.5, function_of=(DYNAMIC,))  # a row keeps capacity x L/k segments (+ a tail)
  segment_pooling: str = setting("mean", function_of=(DYNAMIC,))  # 'mean', or 'linear': the mean of W_s x + b


# A dynamic level's settings, its own and those its registered predictors declare with `setting`: `ModelConfig`
# inherits them (config keys model.<name>), `Hourglass` and `DynamicShorten` take them as keyword arguments.
DynamicSettings = settings_class("DynamicSettings", dataclasses.fields(LevelSettings) + SETTINGS, frozen=True)
DynamicSettings.settings_sources = (LevelSettings, BoundaryPredictor, *PREDICTORS.values())  # their field docs
DYNAMIC_FIELDS = tuple(f.name for f in dataclasses.fields(DynamicSettings))


def dynamic_options(settings) -> dict:
  """`settings`' dynamic-level settings as keyword arguments."""
  return {name: getattr(settings, name) for name in DYNAMIC_FIELDS}


def max_segments(length: int, factor: int, capacity: float) -> int:
  """Segments a row of `length` keeps: room for `capacity` times the target count length/factor (never more than
  one per position), plus the merged tail that takes every position past them."""
  return min(length, math.ceil(capacity * length / factor)) + 1


class PositionProjection(nn.Module):
  """'linear' segment pooling: x [B, L, D] and each position's index in its segment [B, L] -> W_s x + b, one D x D
  matrix per index s < `slots` (later positions share the last). The segment's mean of these is the dynamic
  analogue of fixed linear shortening, which projects the concatenated window of k positions (one block of the
  matrix per position). Every W_s starts at the identity, so the pooling starts as the plain mean."""
  cfg: LayerConfig
  slots: int

  @nn.compact
  def __call__(self, x_BxLxD, positions_BxL):
    d = x_BxLxD.shape[-1]
    kernel_SxDxD = self.param("kernel", nn.with_logical_partitioning(
        lambda key, shape: jnp.broadcast_to(jnp.eye(d), shape), (None, "embed", "mlp")), (self.slots, d, d))
    bias_D = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)), (d,))
    dtype = self.cfg.compute_dtype
    onehot_BxLxS = jax.nn.one_hot(jnp.minimum(positions_BxL, self.slots - 1), self.slots, dtype=dtype)
    y_BxLxD = jnp.einsum("bld,sde,bls->ble", x_BxLxD.astype(dtype), kernel_SxDxD.astype(dtype), onehot_BxLxS,
                         preferred_element_type=jnp.float32)
    return (y_BxLxD + bias_D).astype(x_BxLxD.dtype)


class Segments(NamedTuple):
  """What up-sampling needs of a shortening: each position's segment id, the segments completed at or before it
  (`completed_segments`, what it reads) and its straight-through up-sampling weight, and each segment's boundary
  probability where the predictor smooths the outputs ('routing'; None otherwise)."""
  ids_BxL: jax.Array
  completed_BxL: jax.Array
  weights_BxL: jax.Array | None
  boundary_probs_BxM: jax.Array | None = None


def check_dynamic_settings(s, prefix: str) -> None:
  """The settings of `s` (DynamicShorten or ModelConfig) besides `boundaries`, the predictors' by their own `check`;
  `prefix` names their owner."""
  check_choice(f"{prefix}segment_pooling", s.segment_pooling, SEGMENT_POOLINGS)
  if not 0 < float(s.segment_capacity) < math.inf:
    raise ValueError(f"{prefix}segment_capacity={s.segment_capacity!r} must be a finite number > 0.")
  selected = [resolve(s.boundaries)] if hasattr(s, "factor") else [predictor for predictor, _ in _levels(s)]
  for cls in dict.fromkeys(c for predictor in selected for c in reversed(predictor.__mro__)):
    if "check" in vars(cls):  # the checks of the selected predictors and of the classes they derive from
      cls.check(s, prefix)
  check_segments_fit(s, prefix)


def check_segments_fit(s, prefix: str) -> None:
  """Refuses a level whose predictor fixes its segments' length N (every<N>) shorter than the level's factor k
  allows: its segment_capacity x L/k slots cannot hold L/N segments, and the positions past them would all share
  the merged tail. `s`: a DynamicShorten (one level, its `factor`) or a ModelConfig (each level of its hierarchy)."""
  levels = [(resolve(s.boundaries), s.factor)] if hasattr(s, "factor") else _levels(s)
  for level, (predictor, factor) in enumerate(levels, start=1):
    length = predictor.segment_length()
    if length and isinstance(factor, int) and length * s.segment_capacity < factor:
      where = f"level {level}" if len(levels) > 1 else "its level"
      given = getattr(s.boundaries, "key", s.boundaries)  # a DynamicShorten's may be its resolved predictor
      raise ValueError(f"{prefix}boundaries={given!r}: {predictor.key!r} closes a segment every {length} positions, "
                       f"but {where} shortens by {factor}, so its {prefix}segment_capacity={s.segment_capacity!r} x "
                       f"L/{factor} slots cannot hold the L/{length} segments (the rest would share one merged "
                       f"segment). Give that level the factor {length}, or raise segment_capacity to "
                       f">= {factor / length:.3g}.")


def check_segments_in_window(cfg, seq_len: int) -> None:
  """Refuses a dynamic model (ModelConfig) whose segments are longer than the window of `seq_len` positions, so
  that they never close in it: at each level the length its predictor fixes (every<N>) or else its factor, in all;
  and one that shortens by more than the window (padded to that many positions)."""
  levels = _levels(cfg)
  span = math.prod(predictor.segment_length() or factor for predictor, factor in levels)
  needed = max(span, cfg.pad_multiple)
  if needed > seq_len:
    what = f"segments of {span:,} positions" if span >= cfg.pad_multiple else f"a shortening by {needed:,}"
    raise ValueError(f"model.boundaries={cfg.boundaries!r} with model.hierarchy={cfg.hierarchy!r} needs {what}, "
                     f"longer than a window of data.seq_len={seq_len}: its segments would never close in it. Raise "
                     f"data.seq_len to >= {needed:,}, or make the segments shorter (a smaller N in every<N>, or "
                     "smaller factors).")


def _levels(cfg) -> list[tuple[type[BoundaryPredictor], int]]:
  """(predictor, factor) of each shortened level of a ModelConfig, outermost first."""
  return [(predictor, cfg.parsed_hierarchy.relative_factor(i)) for i, predictor in enumerate(cfg.level_predictors)]


@functools.cache
def level_predictors(hierarchy, upsample: str, boundaries, prefix: str = "model.") -> tuple:
  """The boundary predictor of each shortened level of `hierarchy`, outermost first, resolved once (cached) from
  `boundaries`: a name for every level, a name per level ('whitespace,gumbel'), or those a body hands inward.
  Raises unless every level can be dynamic: up-sampled by 'repeat', and past the first level (which reads segments,
  not bytes) cut by one of INNER_PREDICTORS; `prefix` names the fields' owner ('model.', 'Hourglass.')."""
  if not hierarchy.depth or upsample != "repeat":
    raise ValueError(f"{prefix}shorten='dynamic' takes shortened levels and upsample='repeat' (each position reads "
                     f"its last completed segment); got hierarchy={str(hierarchy)!r}, upsample={upsample!r}. Use "
                     "e.g. hierarchy='2@1 8@4 2@1', upsample='repeat'.")
  depth, owner = hierarchy.depth, f"{prefix}boundaries"
  names = tuple(name.strip() for name in boundaries.split(",")) if isinstance(boundaries, str) else boundaries
  given = ",".join(getattr(name, "key", name) for name in names)
  if len(names) not in (1, depth):
    raise ValueError(f"{owner}={given!r} names {len(names)} predictors for {depth} shortened levels; give one "
                     f"for every level or one per level, outermost first (e.g. "
                     f"{','.join([INNER_PREDICTORS[0]] * depth)!r}).")
  predictors = tuple(resolve(name, owner) for name in names) * (depth if len(names) == 1 else 1)
  for level, predictor in enumerate(predictors[1:], start=2):
    if not predictor.inner:
      raise ValueError(f"{owner}={given!r}: level {level} reads the segments of the level above, not bytes, so "
                       f"{predictor.key!r} cannot cut it; use one of {', '.join(INNER_PREDICTORS)} there (e.g. "
                       f"'{predictors[0].key}{(',' + INNER_PREDICTORS[0]) * (depth - 1)}').")
  return predictors


class DynamicShorten(module_fields(DynamicSettings), LayerOptions):
  """x [B, L, D] -> (z [B, M, D] the mean of each segment, Segments): segments close at the boundaries of the
  predictor `boundaries` names (or is: a body hands its levels their resolved predictors), learned from x or given
  as `inputs` ('whitespace' takes `boundaries_BxL`, bool [B, L], and `runs_BxL`), b_t from positions <= t. `factor`
  is the target average segment length; M = `max_segments(L, factor, segment_capacity)`, positions past segment M-2
  share the merged tail M-1, which no position reads. `segment_pooling` 'mean' averages each segment's vectors;
  'linear' averages W_s x_t + b, s the position's index in its segment (`PositionProjection`).

  Sows into 'losses' the predictor's (weighted) losses, into 'intermediates' the 'boundaries', and into 'metrics'
  the realised 'shortening_rate' (positions per boundary), 'boundary_rate' and 'segment_overflow' (the fraction of
  positions in the merged tail: raise segment_capacity when it is not ~0), counting each row's first `lengths_B`
  positions (a nested level's filled slots). Apply with mutable=['losses', 'metrics'] to read them.

  Cached decoding passes `previous` (the segment state of dynamic/cache.py) and `positions_L` (x's entries) and
  gets (boundaries b [B, T]; the probabilities to smooth by [B, T] or None; the predictor's state after each of x's
  tokens [B, T, ...]; the vectors [B, T, D] that segments sum: x, or its projection for 'linear').
  """
  factor: int = 4

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, previous=None, positions_L=None, lengths_B=None,
               **inputs):
    predictor = resolve(self.boundaries, "DynamicShorten.boundaries")
    check_dynamic_settings(self, "DynamicShorten.")
    check_int("DynamicShorten.factor", self.factor, 2)
    for given in set(inputs) - set(predictor.inputs):
      readers = " or ".join(repr(key) for key, c in PREDICTORS.items() if given in c.inputs) or "no predictor"
      raise ValueError(f"DynamicShorten(boundaries={predictor.key!r}) got {given}, which only {readers} reads; "
                       f"drop it, or pick a predictor that reads it.")
    cfg, length = self.layer_config(x_BxLxD.shape[-1]), x_BxLxD.shape[1]
    decision = predictor.module(cfg, self.factor, self)(x_BxLxD, deterministic, positions_L, lengths_B, previous,
                                                        **inputs)
    b_BxL = decision.boundaries_BxL
    hard_BxL = b_BxL > 0.5
    if self.segment_pooling == "linear":  # decoding counts on from the open segment's size (0 after a boundary)
      starts_BxL = jnp.concatenate([jnp.zeros_like(hard_BxL[:, :1]), hard_BxL[:, :-1]], axis=1)
      positions_BxL = positions_in_segments(starts_BxL, None if previous is None else previous["size"])
      x_BxLxD = PositionProjection(cfg, self.factor, name="pool")(x_BxLxD, positions_BxL)
    if previous is not None:
      return hard_BxL, decision.probs_BxL, decision.state, x_BxLxD
    for name, loss in decision.losses.items():
      self.sow("losses", name, loss)
    self.sow("intermediates", "boundaries", hard_BxL)
    num_segments = max_segments(length, self.factor, self.segment_capacity)
    ids_BxL = segment_ids(hard_BxL, num_segments)
    z_BxMxD, _ = pool_segments(x_BxLxD, ids_BxL, num_segments, straight_through_weights(b_BxL))
    valid_BxL = valid_positions(hard_BxL.shape, lengths_B)
    boundary_rate = masked_mean(hard_BxL, valid_BxL)
    self.sow("metrics", "boundary_rate", boundary_rate)
    self.sow("metrics", "shortening_rate", 1.0 / jnp.maximum(boundary_rate, 1.0 / length))
    self.sow("metrics", "segment_overflow", masked_mean(ids_BxL == num_segments - 1, valid_BxL))
    probs_BxL = decision.probs_BxL
    boundary_probs_BxM = None if probs_BxL is None else segment_boundary_probs(probs_BxL, hard_BxL, ids_BxL,
                                                                               num_segments)
    return z_BxMxD, Segments(ids_BxL, completed_segments(hard_BxL, num_segments),
                             straight_through_weights(b_BxL, inclusive=True), boundary_probs_BxM)


class DynamicUpsample(LayerOptions):
  """Segment outputs y [B, M, D], `Segments` and the residual r [B, L, D] -> LayerNorm(u) + r, where u[t] is the
  output of the newest segment completed at or before t (zeros before the first boundary), smoothed over the
  segments first where `Segments` has boundary probabilities ('routing', `smooth_segments`)."""

  @nn.compact
  def __call__(self, y_BxMxD, segments: Segments, r_BxLxD):
    cfg = self.layer_config(r_BxLxD.shape[-1])
    if segments.boundary_probs_BxM is not None:
      y_BxMxD = smooth_segments(y_BxMxD, segments.boundary_probs_BxM)
    u_BxLxD = upsample_segments(y_BxMxD, segments.completed_BxL, segments.weights_BxL)
    return layer_norm(cfg, "output_norm")(u_BxLxD) + r_BxLxD
