"""'gumbel' (Nawrot et al. 2023): a small MLP's sampled cut, held near the rate 1/factor by a binomial prior."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic.predictors.base import (BoundaryPredictor, Decision, binomial_prior_loss,
                                                                   register)
from hourglass_jax.model.layer_config import check_choice, setting
from hourglass_jax.model.layers import dense

GUMBEL_EVALUATIONS = ("threshold", "sample")
_GOLDEN_RATIO_32 = 2654435769  # round(2^32 / phi): 'sample' evaluation's noise sequence (evaluation_noise)


def evaluation_noise(positions_L):
  """float32 [L]: logistic noise log(u / (1 - u)) for each absolute position, a fixed function of the position, so
  'sample' evaluation draws the same noise in a forward pass and in decoding. u_t is the golden-ratio (Weyl)
  sequence frac(1/2 + t / phi), computed exactly in uint32: any run of n consecutive positions spreads its u over
  (0, 1) within about 1/n of uniform, so a window cuts at the rate training's independent draws do on average (an
  independent draw per position gave the 256 positions of a window a rate of 0.227 for logits at 1/4)."""
  bits_L = positions_L.astype(jnp.uint32) * jnp.uint32(_GOLDEN_RATIO_32) + jnp.uint32(2 ** 31)
  u_L = ((bits_L >> 8).astype(jnp.float32) + 0.5) * 2.0 ** -24
  return jnp.log(u_L) - jnp.log1p(-u_L)


def check_temperature(level, prefix: str) -> None:
  """The check of `gumbel_temperature`, for the predictors that take it (gumbel, entropy)."""
  if not 0 < float(level.gumbel_temperature) < math.inf:
    raise ValueError(f"{prefix}gumbel_temperature={level.gumbel_temperature!r} must be a finite number > 0.")


@register
class Gumbel(BoundaryPredictor):
  """x [B, L, D] -> straight-through boundaries: an MLP's logit at each position; in training a relaxed Bernoulli
  (Gumbel-sigmoid) sample at `gumbel_temperature` thresholded at 1/2 (rng 'dropout'). The hard decision of that
  sample is logit + logistic noise > 0, a Bernoulli(sigmoid(logit)) draw. In evaluation, `gumbel_evaluation`
  'threshold' cuts where sigmoid(logit) > 1/2 (Nawrot et al.); 'sample' makes the training draw with noise fixed
  per absolute position (`evaluation_noise` of `positions_L`), so evaluation cuts at the rate training did,
  deterministically. The logit's bias starts at log-odds(1/factor): training starts at the target rate. Loss:
  'boundary_prior' (`binomial_prior_loss`) times `boundary_loss_weight`."""
  gumbel_temperature: float = setting(0.5)  # training's relaxed Bernoulli ('entropy': its straight-through sigmoid)
  gumbel_evaluation: str = setting("threshold")  # GUMBEL_EVALUATIONS: how evaluation decides

  key = "gumbel"
  module_name = "predictor"
  loss_weight = 1.0

  @classmethod
  def check(cls, level, prefix: str) -> None:
    check_choice(f"{prefix}gumbel_evaluation", level.gumbel_evaluation, GUMBEL_EVALUATIONS)
    check_temperature(level, prefix)

  describe = classmethod(lambda cls, level: f", evaluation '{level.gumbel_evaluation}'")

  @classmethod
  def cost(cls, cfg, length: int) -> tuple[int, int]:
    d = cfg.d_model
    return d * d + d + d + 1, 2 * length * (d * d + d)

  @nn.compact
  def __call__(self, x_BxLxD, deterministic=True, positions_L=None, lengths_B=None, state=None):
    hidden_BxLxD = nn.relu(dense(self.cfg, x_BxLxD.shape[-1], ("embed", "mlp"), "hidden")(x_BxLxD))
    rate = 1.0 / self.factor
    logit_BxL = nn.Dense(1, dtype=jnp.float32, name="logit",
                         kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", None)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.constant(math.log(rate / (1 - rate))),
                                                                (None,)))(hidden_BxLxD)[..., 0]
    if state is not None:
      deterministic = True
    if deterministic and self.gumbel_evaluation == "sample":
      positions_L = jnp.arange(logit_BxL.shape[1]) if positions_L is None else positions_L
      b_BxL = (logit_BxL + evaluation_noise(positions_L) > 0).astype(jnp.float32)  # positions [L] or [B, L]
    elif deterministic:
      b_BxL = (logit_BxL > 0).astype(jnp.float32)
    else:
      uniform_BxL = jax.random.uniform(self.make_rng("dropout"), logit_BxL.shape, minval=1e-6, maxval=1 - 1e-6)
      soft_BxL = nn.sigmoid((logit_BxL + jnp.log(uniform_BxL) - jnp.log1p(-uniform_BxL)) / self.gumbel_temperature)
      b_BxL = (soft_BxL > 0.5).astype(jnp.float32) + soft_BxL - jax.lax.stop_gradient(soft_BxL)
    if state is not None:
      return Decision(b_BxL)
    return Decision(b_BxL, losses={"boundary_prior": self.boundary_loss_weight * binomial_prior_loss(
        b_BxL, 1 / self.factor, lengths_B)})
