"""'routing' (H-Net, Hwang et al. 2025): cuts where a position differs from the one before, with a ratio loss."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic.predictors.base import (BoundaryPredictor, Decision, masked_mean,
                                                                   previous_rows, register, valid_positions)


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


@register
class Routing(BoundaryPredictor):
  """Start probabilities p_t = (1 - cos(W_q x_t, W_k x_{t-1})) / 2 and p_0 = 1: a segment starts where the stream
  changes direction, and b_t = 1 where p_t >= 1/2 (t >= 1): H-Net's cut, with the new position ending the old
  segment, so that t reads a segment that has seen it. W_q and W_k start at the identity, as in H-Net. The level
  smooths its segment outputs by p; loss 'ratio_loss' times `boundary_loss_weight`. Decoding keeps the key of the
  last token ('key') and whether there was one ('seen')."""
  key = "routing"
  module_name = "router"
  loss_weight = 0.03  # H-Net's alpha for its ratio loss
  # One level of the CPU preset (configs/dynamic.py) at 0.03 cut 0.341 of the bytes after 800 steps, at 0.3 0.247
  # (target 0.25); a nested level held 0.248 at 0.03 (benchmarks/results/dynamic_predictors_800_steps.json).
  cpu_loss_weight = 0.3

  new_state = classmethod(lambda cls, batch, d_model, dtype: {"key": jnp.zeros((batch, d_model), dtype),
                                                                "seen": jnp.zeros((batch,), bool)})
  cost = classmethod(lambda cls, cfg, length: (2 * cfg.d_model ** 2, 4 * length * cfg.d_model ** 2))

  @nn.compact
  def __call__(self, x_BxLxD, deterministic=True, positions_L=None, lengths_B=None, state=None):
    d = x_BxLxD.shape[-1]
    project = lambda name: nn.Dense(d, use_bias=False, dtype=self.cfg.compute_dtype, name=name,
                                    kernel_init=nn.with_logical_partitioning(_identity, ("embed", "mlp")))
    q_BxLxD, k_BxLxD = project("query")(x_BxLxD), project("key")(x_BxLxD)
    unit = lambda v: v.astype(jnp.float32) * jax.lax.rsqrt(jnp.sum(jnp.square(v.astype(jnp.float32)), -1,
                                                                   keepdims=True) + 1e-12)
    previous_key_BxD, seen_B = (None, None) if state is None else (state["key"], state["seen"])
    before_BxLxD = previous_rows(k_BxLxD, previous_key_BxD, seen_B)
    p_BxL = (1.0 - jnp.sum(unit(q_BxLxD) * unit(before_BxLxD), axis=-1)) / 2
    has_before_B = jnp.zeros(x_BxLxD.shape[:1], bool) if state is None else seen_B
    p_BxL = p_BxL.at[:, 0].set(jnp.where(has_before_B, p_BxL[:, 0], 1.0))
    starts_BxL = (p_BxL >= 0.5).astype(jnp.float32)
    if state is not None:
      b_BxL = starts_BxL.at[:, 0].set(starts_BxL[:, 0] * seen_B)
      return Decision(b_BxL, p_BxL, state={"key": k_BxLxD.astype(state["key"].dtype),
                                           "seen": jnp.ones(x_BxLxD.shape[:2], bool)})
    b_BxL = (starts_BxL + p_BxL - jax.lax.stop_gradient(p_BxL)).at[:, 0].set(0.0)  # p_0 = 1 closes nothing
    return Decision(b_BxL, p_BxL, {"ratio_loss": self.boundary_loss_weight * ratio_loss(starts_BxL, p_BxL,
                                                                                          self.factor, lengths_B)})
