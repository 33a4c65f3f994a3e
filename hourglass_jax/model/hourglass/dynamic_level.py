"""A dynamically shortened Hourglass level's resampling (dynamic token pooling, Nawrot et al. 2023): boundary
decisions -> segments -> their means (`DynamicShorten`), and each position's last completed segment back
(`DynamicUpsample`). The segment ops and their causality argument are in dynamic.py.

Predictors ('boundaries'): 'whitespace' takes the decisions from outside (`whitespace_boundaries` of the bytes);
'gumbel' learns them from the level's stream with a binomial prior toward the target rate 1/factor; 'routing'
(H-Net, Hwang et al. 2025) closes a segment where a position differs from the one before (cosine routing), with
H-Net's ratio loss and its smoothing of the segment outputs; 'entropy' (BLT, Pagnoni et al. 2024) closes one where
the next-byte entropy of the level's own prediction head rises by more than a learned threshold.
"""

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.scipy.special import gammaln

from hourglass_jax.model.hourglass.dynamic import (completed_segments, merge_runs, pool_segments,
                                                   positions_in_segments, segment_boundary_probs, segment_ids,
                                                   smooth_segments, starts_from_boundaries, straight_through_weights,
                                                   upsample_segments)
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice, check_int
from hourglass_jax.model.layers import dense, layer_norm

BOUNDARY_PREDICTORS = ("whitespace", "gumbel", "routing", "entropy")
INNER_PREDICTORS = ("gumbel", "routing")  # a segment stream has no bytes: the byte rules fit the first level only
SEGMENT_POOLINGS = ("mean", "linear")
GUMBEL_EVALUATIONS = ("threshold", "sample")
_GOLDEN_RATIO_32 = 2654435769  # round(2^32 / phi): 'sample' evaluation's noise sequence (evaluation_noise)


def max_segments(length: int, factor: int, capacity: float) -> int:
  """Segments a row of `length` keeps: room for `capacity` times the target count length/factor (never more than
  one per position), plus the merged tail that takes every position past them."""
  return min(length, math.ceil(capacity * length / factor)) + 1


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


def evaluation_noise(positions_L):
  """float32 [L]: logistic noise log(u / (1 - u)) for each absolute position, a fixed function of the position, so
  'sample' evaluation draws the same noise in a forward pass and in decoding. u_t is the golden-ratio (Weyl)
  sequence frac(1/2 + t / phi), computed exactly in uint32: any run of n consecutive positions spreads its u over
  (0, 1) within about 1/n of uniform, so a window cuts at the rate training's independent draws do on average. An
  independent draw per position (as before) gave the 256 positions of a window a rate of 0.227 for logits at 1/4."""
  bits_L = positions_L.astype(jnp.uint32) * jnp.uint32(_GOLDEN_RATIO_32) + jnp.uint32(2 ** 31)
  u_L = ((bits_L >> 8).astype(jnp.float32) + 0.5) * 2.0 ** -24
  return jnp.log(u_L) - jnp.log1p(-u_L)


class GumbelBoundaries(nn.Module):
  """x [B, L, D] -> straight-through boundaries [B, L] (value 0/1): an MLP's logit at each position; in training a
  relaxed Bernoulli (Gumbel-sigmoid) sample at `temperature` thresholded at 1/2 (rng 'dropout'). The hard decision
  of that sample is logit + logistic noise > 0, a Bernoulli(sigmoid(logit)) draw. In evaluation, `evaluation`
  'threshold' cuts where sigmoid(logit) > 1/2 (Nawrot et al.); 'sample' makes the training draw with noise fixed
  per absolute position (`evaluation_noise` of `positions_L`, default 0..L-1), so evaluation cuts at the rate
  training did, deterministically. The logit's bias starts at log-odds(1/factor): training starts at the target
  rate."""
  cfg: LayerConfig
  factor: int
  temperature: float
  evaluation: str = "threshold"

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool, positions_L=None):
    hidden_BxLxD = nn.relu(dense(self.cfg, x_BxLxD.shape[-1], ("embed", "mlp"), "hidden")(x_BxLxD))
    rate = 1.0 / self.factor
    logit_BxL = nn.Dense(1, dtype=jnp.float32, name="logit",
                         kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", None)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.constant(math.log(rate / (1 - rate))),
                                                                (None,)))(hidden_BxLxD)[..., 0]
    if deterministic and self.evaluation == "sample":
      positions_L = jnp.arange(logit_BxL.shape[1]) if positions_L is None else positions_L
      return (logit_BxL + evaluation_noise(positions_L)[None, :] > 0).astype(jnp.float32)
    if deterministic:
      return (logit_BxL > 0).astype(jnp.float32)
    uniform_BxL = jax.random.uniform(self.make_rng("dropout"), logit_BxL.shape, minval=1e-6, maxval=1 - 1e-6)
    soft_BxL = nn.sigmoid((logit_BxL + jnp.log(uniform_BxL) - jnp.log1p(-uniform_BxL)) / self.temperature)
    hard_BxL = (soft_BxL > 0.5).astype(jnp.float32)
    return hard_BxL + soft_BxL - jax.lax.stop_gradient(soft_BxL)


def ratio_loss(starts_BxL, start_probs_BxL, factor: int, lengths_B=None):
  """H-Net's ratio loss N/(N-1) ((N-1) F G + (1-F)(1-G)), N = factor, F the fraction of hard starts, G the mean
  start probability (over each row's first `lengths_B` positions, default all); 1 at F = G = 1/N. Its gradient
  reaches the router through G, N/(N-1) (N F - 1): it lowers the probabilities while more than 1/N positions start
  a segment and raises them while fewer do."""
  valid_BxL = valid_positions(starts_BxL.shape, lengths_B)
  f = masked_mean(starts_BxL, valid_BxL)
  g = masked_mean(start_probs_BxL, valid_BxL)
  return factor / (factor - 1) * ((factor - 1) * f * g + (1 - f) * (1 - g))


def _identity(key, shape, dtype=jnp.float32):
  del key
  return jnp.eye(*shape, dtype=dtype)


def _previous_rows(values_BxL, previous_B=None, has_previous_B=None):
  """values one row later (row t gets row t-1, along axis 1); row 0 gets `previous_B` (decoding: the row before
  x's first) where `has_previous_B`, else its own value."""
  first_B = values_BxL[:, 0] if previous_B is None else jnp.where(
      has_previous_B.reshape(has_previous_B.shape + (1,) * (values_BxL.ndim - 2)), previous_B.astype(values_BxL.dtype),
      values_BxL[:, 0])
  return jnp.concatenate([first_B[:, None], values_BxL[:, :-1]], axis=1)


class RoutingBoundaries(nn.Module):
  """H-Net's routing: x [B, L, D] -> start probabilities p [B, L], p_t = (1 - cos(W_q x_t, W_k x_{t-1})) / 2 and
  p_0 = 1: a segment starts where the stream changes direction. W_q and W_k start at the identity, as in H-Net.

  Decoding passes `previous_key_BxD`, the key of the row before x's first (zeros and `has_previous_B` False at
  position 0), and gets (p, the keys [B, L, D] of x's rows) back."""
  cfg: LayerConfig

  @nn.compact
  def __call__(self, x_BxLxD, previous_key_BxD=None, has_previous_B=None):
    d = x_BxLxD.shape[-1]
    project = lambda name: nn.Dense(d, use_bias=False, dtype=self.cfg.compute_dtype, name=name,
                                    kernel_init=nn.with_logical_partitioning(_identity, ("embed", "mlp")))
    q_BxLxD, k_BxLxD = project("query")(x_BxLxD), project("key")(x_BxLxD)
    unit = lambda v: v.astype(jnp.float32) * jax.lax.rsqrt(jnp.sum(jnp.square(v.astype(jnp.float32)), -1,
                                                                   keepdims=True) + 1e-12)
    before_BxLxD = _previous_rows(k_BxLxD, previous_key_BxD, has_previous_B)
    p_BxL = (1.0 - jnp.sum(unit(q_BxLxD) * unit(before_BxLxD), axis=-1)) / 2
    decoding = previous_key_BxD is not None
    has_before_B = has_previous_B if decoding else jnp.zeros(x_BxLxD.shape[:1], bool)
    p_BxL = p_BxL.at[:, 0].set(jnp.where(has_before_B, p_BxL[:, 0], 1.0))
    return (p_BxL, k_BxLxD) if decoding else p_BxL


class EntropyBoundaries(nn.Module):
  """BLT's entropy rule on the level's stream: a head (Dense d -> vocab) on stop_gradient(x) predicts the next token;
  e_t is the entropy (bits) of its prediction at t, and b_t = 1 where e_t - e_{t-1} > theta (BLT's "approximate
  monotonicity" rule: a segment ends where the next byte gets harder to predict). theta, a learned scalar, is
  trained by the binomial prior toward rate 1/factor through a straight-through sigmoid((e_t - e_{t-1} - theta) /
  temperature); the entropies carry no gradient, so the head learns from its own next-token loss alone. The
  parameter 'threshold' is theta / log2(vocab), theta in units of the largest entropy: an optimizer's steps of about
  the learning rate then move theta across the entropies' range within tens of steps (in bits, 800 steps left the
  rate at 0.31 against a target of 0.25).

  Returns (b [B, L] straight-through, e [B, L], head logits [B, L, vocab]). Decoding passes `previous_entropy_B`,
  the entropy of the row before x's first (e_{-1} = e_0 at position 0, so nothing closes there)."""
  cfg: LayerConfig
  vocab_size: int
  temperature: float

  @nn.compact
  def __call__(self, x_BxLxD, previous_entropy_B=None, has_previous_B=None):
    logits_BxLxV = nn.Dense(self.vocab_size, dtype=jnp.float32, name="head",
                            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                     ("embed", "vocab")),
                            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)))(
                                jax.lax.stop_gradient(x_BxLxD))
    log_p = jax.nn.log_softmax(jax.lax.stop_gradient(logits_BxLxV), axis=-1)
    e_BxL = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1) / math.log(2)
    theta = math.log2(self.vocab_size) * self.param(
        "threshold", nn.with_logical_partitioning(nn.initializers.zeros_init(), ()), ())
    rise_BxL = e_BxL - _previous_rows(e_BxL, previous_entropy_B, has_previous_B) - theta
    hard_BxL = (rise_BxL > 0).astype(jnp.float32)
    soft_BxL = nn.sigmoid(rise_BxL / self.temperature)
    return hard_BxL + soft_BxL - jax.lax.stop_gradient(soft_BxL), e_BxL, logits_BxLxV


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
  (`completed_segments`, what it reads) and its straight-through up-sampling weight, and for 'routing' each
  segment's boundary probability (the smoothing weights; None otherwise)."""
  ids_BxL: jax.Array
  completed_BxL: jax.Array
  weights_BxL: jax.Array | None
  boundary_probs_BxM: jax.Array | None = None


def check_dynamic_settings(s, prefix: str) -> None:
  """The predictor settings of `s` (DynamicShorten, Hourglass or ModelConfig); `prefix` names their owner."""
  for predictor in s.boundaries.split(","):
    check_choice(f"{prefix}boundaries", predictor.strip(), BOUNDARY_PREDICTORS)
  check_choice(f"{prefix}segment_pooling", s.segment_pooling, SEGMENT_POOLINGS)
  check_choice(f"{prefix}gumbel_evaluation", s.gumbel_evaluation, GUMBEL_EVALUATIONS)
  for field in ("segment_capacity", "gumbel_temperature"):
    if not 0 < float(getattr(s, field)) < math.inf:
      raise ValueError(f"{prefix}{field}={getattr(s, field)!r} must be a finite number > 0.")
  if not 0 <= float(s.boundary_loss_weight) < math.inf:
    raise ValueError(f"{prefix}boundary_loss_weight={s.boundary_loss_weight!r} must be a finite number >= 0.")


def level_predictors(boundaries: str, depth: int, owner: str = "model.boundaries") -> tuple[str, ...]:
  """The boundary predictor of each of `depth` dynamic levels, outermost first, from `boundaries`: one name for
  every level, or a comma-separated name per level ('whitespace,gumbel'). Levels past the first read a segment
  stream, not bytes, so they take only INNER_PREDICTORS."""
  names = tuple(name.strip() for name in boundaries.split(","))
  if len(names) not in (1, depth):
    raise ValueError(f"{owner}={boundaries!r} names {len(names)} predictors for {depth} shortened levels; give one "
                     f"for every level or one per level, outermost first (e.g. {','.join(['gumbel'] * depth)!r}).")
  for name in names:
    check_choice(owner, name, BOUNDARY_PREDICTORS)
  names = names * depth if len(names) == 1 else names
  for level, name in enumerate(names[1:], start=2):
    if name not in INNER_PREDICTORS:
      raise ValueError(f"{owner}={boundaries!r}: level {level} reads the segments of the level above, not bytes, so "
                       f"{name!r} cannot cut it; use one of {', '.join(INNER_PREDICTORS)} there (e.g. "
                       f"'{names[0]}{',gumbel' * (depth - 1)}').")
  return names


def check_dynamic_level(hierarchy, upsample: str, boundaries: str, prefix: str) -> tuple[str, ...]:
  """Every shortened level of `hierarchy` is dynamic and up-sampled by 'repeat'; `prefix` names the fields' owner
  ('model.', 'Hourglass.'). Returns `level_predictors`."""
  if not hierarchy.depth or upsample != "repeat":
    raise ValueError(f"{prefix}shorten='dynamic' takes shortened levels and upsample='repeat' (each position reads "
                     f"its last completed segment); got hierarchy={str(hierarchy)!r}, upsample={upsample!r}. Use "
                     "e.g. hierarchy='2@1 8@4 2@1', upsample='repeat'.")
  return level_predictors(boundaries, hierarchy.depth, f"{prefix}boundaries")


class DynamicShorten(LayerOptions):
  """x [B, L, D] -> (z [B, M, D] the mean of each segment, Segments): segments close at boundaries predicted by
  `boundaries` ('gumbel', 'routing', 'entropy'), or given as `boundaries_BxL` (bool [B, L]; 'whitespace'), less
  those `merge_runs` drops when `runs_BxL` marks the positions of run bytes (cached decoding needs them to carry
  the last token's mark across steps).
  `factor` is the target average segment length; M = `max_segments(L, factor, segment_capacity)`, positions past
  segment M-2 share the merged tail M-1, which no position reads. Every predictor decides b_t from positions
  <= t; 'routing' closes a segment at t where t differs from t-1 (H-Net's cut, with the new position ending the
  old segment, so that t reads a segment that has seen it; b_0 = 0).

  Sows into 'losses' the boundary prior ('gumbel', 'entropy') or the ratio loss ('routing') times
  `boundary_loss_weight` ('entropy' adds its head's next-token loss when given `next_tokens_BxL`, -1 where there is
  none), and
  into 'metrics' the realised 'shortening_rate' (positions per boundary), 'boundary_rate' and 'segment_overflow'
  (the fraction of positions in the merged tail: raise segment_capacity when it is not ~0). Apply with
  mutable=['losses', 'metrics'] to read them.

  `segment_pooling` 'mean' averages each segment's vectors; 'linear' averages W_s x_t + b, s the position's index
  in its segment (`PositionProjection`, k matrices, later positions share the last; starts as the mean).

  Cached decoding passes `previous` (the segment state of model/hourglass/dynamic_cache.py) and gets, per row of x,
  (boundaries b [B, T]; the router's probabilities [B, T] (ones for other predictors); the state's 'key',
  'entropy', 'seen' and 'run' after each of x's tokens [B, T, ...], as far as the predictor keeps them; the vectors
  [B, T, D] that segments sum: x, or its projection for 'linear').

  `lengths_B` (a level inside another dynamic one, whose stream has empty segment slots at the end of each row)
  counts only each row's first lengths_B positions in the losses and metrics.
  """
  factor: int = 4
  boundaries: str = "gumbel"
  segment_capacity: float = 1.5
  gumbel_temperature: float = 0.5
  boundary_loss_weight: float = 1.0
  vocab_size: int = 256  # 'entropy': the tokens its head predicts
  segment_pooling: str = "mean"
  gumbel_evaluation: str = "threshold"

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, boundaries_BxL=None, previous=None, next_tokens_BxL=None,
               positions_L=None, lengths_B=None, runs_BxL=None):
    check_dynamic_settings(self, "DynamicShorten.")
    check_choice("DynamicShorten.boundaries", self.boundaries, BOUNDARY_PREDICTORS)
    check_int("DynamicShorten.factor", self.factor, 2)
    if runs_BxL is not None and self.boundaries != "whitespace":
      raise ValueError(f"DynamicShorten(boundaries={self.boundaries!r}) got runs_BxL, which only 'whitespace' "
                       "reads; drop it, or set boundaries='whitespace'.")
    cfg, length = self.layer_config(x_BxLxD.shape[-1]), x_BxLxD.shape[1]
    if previous is not None:
      return self._decode_boundaries(cfg, x_BxLxD, boundaries_BxL, previous, positions_L, runs_BxL)
    probs_BxL = None
    if self.boundaries == "routing":
      probs_BxL = RoutingBoundaries(cfg, name="router")(x_BxLxD)
      starts_BxL = (probs_BxL >= 0.5).astype(jnp.float32)
      soft_BxL = starts_BxL + probs_BxL - jax.lax.stop_gradient(probs_BxL)  # straight-through
      b_BxL = soft_BxL.at[:, 0].set(0.0)  # p_0 = 1 marks the row's start, which closes nothing
      self.sow("losses", "ratio_loss", self.boundary_loss_weight * ratio_loss(starts_BxL, probs_BxL,
                                                                              self.factor, lengths_B))
    elif self.boundaries == "gumbel":
      b_BxL = self._gumbel(cfg)(x_BxLxD, deterministic)
      self.sow("losses", "boundary_prior", self.boundary_loss_weight * binomial_prior_loss(b_BxL, 1 / self.factor,
                                                                                           lengths_B))
    elif self.boundaries == "entropy":
      b_BxL, _, logits_BxLxV = self._entropy(cfg)(x_BxLxD)
      self.sow("losses", "boundary_prior", self.boundary_loss_weight * binomial_prior_loss(b_BxL, 1 / self.factor,
                                                                                           lengths_B))
      if next_tokens_BxL is not None:  # the head's next-token loss; -1 marks a position with no next token
        valid_BxL = next_tokens_BxL >= 0
        losses_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, jnp.maximum(next_tokens_BxL, 0))
        self.sow("losses", "entropy_head", jnp.sum(losses_BxL * valid_BxL) / jnp.maximum(valid_BxL.sum(), 1))
    else:
      b_BxL = self._given(x_BxLxD, boundaries_BxL, runs_BxL).astype(jnp.float32)
    hard_BxL = b_BxL > 0.5
    self.sow("intermediates", "boundaries", hard_BxL)
    num_segments = max_segments(length, self.factor, self.segment_capacity)
    ids_BxL = segment_ids(hard_BxL, num_segments)
    if self.segment_pooling == "linear":
      x_BxLxD = self._project(cfg)(x_BxLxD, positions_in_segments(starts_from_boundaries(hard_BxL)))
    z_BxMxD, _ = pool_segments(x_BxLxD, ids_BxL, num_segments, straight_through_weights(b_BxL))
    valid_BxL = valid_positions(hard_BxL.shape, lengths_B)
    boundary_rate = masked_mean(hard_BxL, valid_BxL)
    self.sow("metrics", "boundary_rate", boundary_rate)
    self.sow("metrics", "shortening_rate", 1.0 / jnp.maximum(boundary_rate, 1.0 / length))
    self.sow("metrics", "segment_overflow", masked_mean(ids_BxL == num_segments - 1, valid_BxL))
    boundary_probs_BxM = None if probs_BxL is None else segment_boundary_probs(probs_BxL, hard_BxL, ids_BxL,
                                                                               num_segments)
    return z_BxMxD, Segments(ids_BxL, completed_segments(hard_BxL, num_segments),
                             straight_through_weights(b_BxL, inclusive=True), boundary_probs_BxM)

  def _given(self, x_BxLxD, boundaries_BxL, runs_BxL, run_before_B=None):
    if boundaries_BxL is None or boundaries_BxL.shape != x_BxLxD.shape[:2]:
      raise ValueError(f"DynamicShorten(boundaries='whitespace') needs boundaries_BxL of shape "
                       f"{x_BxLxD.shape[:2]} (got {None if boundaries_BxL is None else boundaries_BxL.shape}); "
                       "pass whitespace_boundaries(tokens), or use boundaries='gumbel' to learn them.")
    if runs_BxL is None:
      return boundaries_BxL.astype(bool)
    if runs_BxL.shape != boundaries_BxL.shape:
      raise ValueError(f"DynamicShorten: runs_BxL has shape {runs_BxL.shape}, boundaries_BxL "
                       f"{boundaries_BxL.shape}; pass byte_mask(tokens, run_bytes) of the same tokens.")
    return merge_runs(boundaries_BxL.astype(bool), runs_BxL.astype(bool), run_before_B)

  def _gumbel(self, cfg):
    return GumbelBoundaries(cfg, self.factor, self.gumbel_temperature, self.gumbel_evaluation, name="predictor")

  def _project(self, cfg):
    return PositionProjection(cfg, self.factor, name="pool")

  def _pooled(self, cfg, x_BxTxD, b_BxT, previous):
    """What cached decoding sums into segments: x, or for 'linear' pooling its projection by segment position (the
    count goes on from the open segment's size: a segment closed before x leaves size 0)."""
    if self.segment_pooling != "linear":
      return x_BxTxD
    starts_BxT = jnp.concatenate([jnp.zeros_like(b_BxT[:, :1]), b_BxT[:, :-1]], axis=1)
    return self._project(cfg)(x_BxTxD, positions_in_segments(starts_BxT, previous["size"]))

  def _entropy(self, cfg):
    return EntropyBoundaries(cfg, self.vocab_size, self.gumbel_temperature, name="entropy")

  def _decode_boundaries(self, cfg, x_BxTxD, boundaries_BxT, previous, positions_T, runs_BxT):
    """Cached decoding (see the class doc): the boundaries among x's rows, given the rows before."""
    seen_BxT = jnp.ones(x_BxTxD.shape[:2], bool)
    if self.boundaries == "routing":
      p_BxT, key_BxTxD = RoutingBoundaries(cfg, name="router")(x_BxTxD, previous["key"], previous["seen"])
      b_BxT = (p_BxT >= 0.5).at[:, 0].set((p_BxT[:, 0] >= 0.5) & previous["seen"])
      return (b_BxT, p_BxT, dict(key=key_BxTxD.astype(previous["key"].dtype), seen=seen_BxT),
              self._pooled(cfg, x_BxTxD, b_BxT, previous))
    updates = {}
    if self.boundaries == "gumbel":
      b_BxT = self._gumbel(cfg)(x_BxTxD, True, positions_T) > 0.5
    elif self.boundaries == "entropy":
      b_BxT, e_BxT, _ = self._entropy(cfg)(x_BxTxD, previous["entropy"], previous["seen"])
      b_BxT = b_BxT > 0.5
      updates = dict(entropy=e_BxT, seen=seen_BxT)
    else:
      b_BxT = self._given(x_BxTxD, boundaries_BxT, runs_BxT, previous["run"])
      if runs_BxT is not None:
        updates = dict(run=runs_BxT.astype(bool))
    return b_BxT, jnp.ones(b_BxT.shape, jnp.float32), updates, self._pooled(cfg, x_BxTxD, b_BxT, previous)


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
