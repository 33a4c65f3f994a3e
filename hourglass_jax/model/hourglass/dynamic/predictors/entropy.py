"""'entropy' (BLT, Pagnoni et al. 2024): cuts where the next-token entropy of the level's own head rises."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hourglass_jax.model.hourglass.dynamic.predictors.base import (BoundaryPredictor, Decision, binomial_prior_loss,
                                                                   previous_rows, register)
from hourglass_jax.model.hourglass.dynamic.predictors.gumbel import Gumbel, check_temperature
from hourglass_jax.model.layer_config import VocabSettings, module_fields


@register
class Entropy(module_fields(Gumbel, "gumbel_temperature"), module_fields(VocabSettings), BoundaryPredictor):
  """BLT's entropy rule on the level's stream: a head (Dense d -> vocab) on stop_gradient(x) predicts the next token;
  e_t is the entropy (bits) of its prediction at t, and b_t = 1 where e_t - e_{t-1} > theta (BLT's "approximate
  monotonicity" rule: a segment ends where the next byte gets harder to predict). theta, a learned scalar, is
  trained by the binomial prior toward rate 1/factor through a straight-through sigmoid((e_t - e_{t-1} - theta) /
  gumbel_temperature); the entropies carry no gradient, so the head learns from its own next-token loss alone
  ('entropy_head', given `next_tokens_BxL`, -1 where there is none). The parameter 'threshold' is
  theta / log2(vocab), theta in units of the largest entropy: an optimizer's steps of about the learning rate then
  move theta across the entropies' range within tens of steps (in bits, 800 steps left the rate at 0.31 against a
  target of 0.25). Decoding keeps the last token's entropy ('entropy'; e_{-1} = e_0 at position 0, so nothing
  closes there) and whether there was one ('seen'). Its settings are gumbel's temperature and the model's vocab_size."""
  key = "entropy"
  module_name = "entropy"
  inner = False  # its head predicts the next byte
  inputs = ("next_tokens_BxL",)
  loss_weight = 1.0
  check = classmethod(lambda cls, level, prefix: check_temperature(level, prefix))

  @classmethod
  def from_tokens(cls, cfg, tokens_BxL, targets: bool) -> dict:
    return {"next_tokens_BxL": jnp.pad(tokens_BxL[:, 1:], ((0, 0), (0, 1)), constant_values=-1)} if targets else {}

  new_state = classmethod(lambda cls, batch, d_model, dtype: {"entropy": jnp.zeros((batch,), jnp.float32),
                                                                "seen": jnp.zeros((batch,), bool)})

  @classmethod
  def cost(cls, cfg, length: int) -> tuple[int, int]:
    d, v = cfg.d_model, cfg.vocab_size
    return d * v + v + 1, 2 * length * d * v

  @nn.compact
  def __call__(self, x_BxLxD, deterministic=True, positions_L=None, lengths_B=None, state=None,
               next_tokens_BxL=None):
    logits_BxLxV = nn.Dense(self.vocab_size, dtype=jnp.float32, name="head",
                            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                     ("embed", "vocab")),
                            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)))(
                                jax.lax.stop_gradient(x_BxLxD))
    log_p = jax.nn.log_softmax(jax.lax.stop_gradient(logits_BxLxV), axis=-1)
    e_BxL = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1) / math.log(2)
    theta = math.log2(self.vocab_size) * self.param(
        "threshold", nn.with_logical_partitioning(nn.initializers.zeros_init(), ()), ())
    previous_B, seen_B = (None, None) if state is None else (state["entropy"], state["seen"])
    rise_BxL = e_BxL - previous_rows(e_BxL, previous_B, seen_B) - theta
    hard_BxL = (rise_BxL > 0).astype(jnp.float32)
    if state is not None:
      return Decision(hard_BxL, state={"entropy": e_BxL, "seen": jnp.ones(x_BxLxD.shape[:2], bool)})
    soft_BxL = nn.sigmoid(rise_BxL / self.gumbel_temperature)
    b_BxL = hard_BxL + soft_BxL - jax.lax.stop_gradient(soft_BxL)
    losses = {"boundary_prior": self.boundary_loss_weight * binomial_prior_loss(b_BxL, 1 / self.factor, lengths_B)}
    if next_tokens_BxL is not None:  # the head's next-token loss; -1 marks a position with no next token
      valid_BxL = next_tokens_BxL >= 0
      losses_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, jnp.maximum(next_tokens_BxL, 0))
      losses["entropy_head"] = jnp.sum(losses_BxL * valid_BxL) / jnp.maximum(valid_BxL.sum(), 1)
    return Decision(b_BxL, losses=losses)
