"""Multi-byte prediction heads (Gloeckle et al. 2024; Medusa, Cai et al. 2024; chained as Hydra's, Ankner et al.
2024): from the state at position t and the bytes after it, head i predicts byte t+1+i (i = 1..m) through the
model's own output layer, so the model drafts for itself in speculative decoding (model/decode/drafts/heads.py)
with no second model and no extra pass of it.

The heads form a chain of residual MLP blocks: z_0 = h_t, z_i = z_(i-1) + W2_i GELU(W1_i LN(z_(i-1) + e(x_(t+i))))
with e the model's own byte embedding, and head i's logits are the output layer's of LN_i(z_i). So head 1 knows
byte t+1, which decoding has when it drafts (the byte the verifying pass gave), and head i the bytes drafted before
its own. W2 starts at zero. The chain reads the last layer's output (`draft_heads_from='last'`, what the output
layer reads) or the shortened level's output (`'short'`: the outermost shortened level's up-sampled stream plus
its residual, what the post layers read). It trains with the model in the same step on the true bytes: the mean
over heads of their cross-entropy, times `draft_loss_weight`, sown into 'losses' (train/compiled/step.py adds every sown
loss), with each head's accuracy sown into 'metrics'."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hourglass_jax.model.layer_config import LayerConfig, check_choice, check_int, setting

DRAFT_TAPS = ("last", "short")
MAX_DRAFT_HEADS = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftHeadSettings:
  """The multi-byte prediction heads' settings, declared once; `ModelConfig` inherits them."""
  draft_heads: int = 0  # heads predicting bytes t+2 .. t+1+draft_heads from position t (0: none)
  draft_heads_from: str = setting("last", function_of=("hourglass",))  # DRAFT_TAPS: what the heads read
  draft_loss_weight: float = 0.0  # training only: weight of the heads' mean cross-entropy (0: off, no heads)


DRAFT_HEAD_FIELDS = tuple(f.name for f in dataclasses.fields(DraftHeadSettings))


def check_draft_head_settings(cfg, prefix: str = "model.") -> None:
  """Raises ValueError naming the setting at fault: heads without a loss weight (never trained), a weight or a tap
  without heads (ignored), or 'short' on a model with no shortened level."""
  check_int(f"{prefix}draft_heads", cfg.draft_heads, 0)
  if cfg.draft_heads > MAX_DRAFT_HEADS:
    raise ValueError(f"{prefix}draft_heads={cfg.draft_heads} is more than {MAX_DRAFT_HEADS}; a head predicting "
                     "that far ahead is almost never right (4 is the usual count).")
  check_choice(f"{prefix}draft_heads_from", cfg.draft_heads_from, DRAFT_TAPS)
  weight = float(cfg.draft_loss_weight)
  if not weight >= 0 or weight == float("inf"):
    raise ValueError(f"{prefix}draft_loss_weight={cfg.draft_loss_weight!r} must be a finite number >= 0.")
  if cfg.draft_heads and not weight:
    raise ValueError(f"{prefix}draft_heads={cfg.draft_heads} needs {prefix}draft_loss_weight > 0, or the heads are "
                     f"never trained; set it (e.g. 0.3, as configs/default.py:self_draft does).")
  if not cfg.draft_heads and (weight or cfg.draft_heads_from != "last"):
    changed = [f"{prefix}{name}={getattr(cfg, name)!r}" for name in ("draft_loss_weight", "draft_heads_from")
               if getattr(cfg, name) != DraftHeadSettings.__dataclass_fields__[name].default]
    raise ValueError(f"{', '.join(changed)} only apply to draft heads; set {prefix}draft_heads (e.g. 4) or leave "
                     f"{'them' if len(changed) > 1 else 'it'} at the default.")
  if cfg.draft_heads and cfg.draft_heads_from == "short" and (cfg.kind != "hourglass" or cfg.upsample == "none"):
    raise ValueError(f"{prefix}draft_heads_from='short' reads the shortened level's up-sampled output, but "
                     f"{'kind=' + repr(cfg.kind) if cfg.kind != 'hourglass' else 'upsample=' + repr('none')} has "
                     f"none; use {prefix}draft_heads_from='last'.")


def _norm_params(module: nn.Module, name: str, num: int, d: int):
  scale = module.param(f"{name}_scale", nn.with_logical_partitioning(nn.initializers.ones_init(), (None, "embed")),
                       (num, d))
  bias = module.param(f"{name}_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "embed")),
                      (num, d))
  return scale, bias


def _layer_norm(x_xMxD, scale_MxD, bias_MxD, eps: float):
  x = x_xMxD.astype(jnp.float32)
  mean = x.mean(axis=-1, keepdims=True)
  var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
  return ((x - mean) * jax.lax.rsqrt(var + eps) * scale_MxD + bias_MxD).astype(x_xMxD.dtype)


class DraftHeads(nn.Module):
  """The chain: (z_(first-1) [..., D], e [..., N, D] the embeddings of the N bytes heads first..first+N-1 take) ->
  (their states [..., N, D], which the model's output layer turns into logits; z_(first+N-1) [..., D], to go on
  from). Training runs all heads at once (first 0, N = num), decoding one at a time."""
  cfg: LayerConfig
  num: int

  @nn.compact
  def __call__(self, z_xD, e_xNxD, first: int = 0):
    cfg, num, d = self.cfg, self.num, z_xD.shape[-1]
    dtype = cfg.compute_dtype
    w1_MxDxD = self.param("w1", nn.with_logical_partitioning(nn.initializers.lecun_normal(batch_axis=(0,)),
                                                             (None, "embed", "mlp")), (num, d, d))
    b1_MxD = self.param("b1", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "mlp")), (num, d))
    w2_MxDxD = self.param("w2", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "mlp", "embed")),
                          (num, d, d))
    b2_MxD = self.param("b2", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None, "embed")), (num, d))
    norm_in, norm_out = _norm_params(self, "input_norm", num, d), _norm_params(self, "output_norm", num, d)
    z_xD, states = z_xD.astype(dtype), []
    for n in range(e_xNxD.shape[-2]):
      i = first + n
      a_xD = _layer_norm(z_xD + e_xNxD[..., n, :].astype(dtype), norm_in[0][i], norm_in[1][i], cfg.layer_norm_eps)
      u_xD = nn.gelu(a_xD @ w1_MxDxD[i].astype(dtype) + b1_MxD[i].astype(dtype), approximate=True)
      z_xD = z_xD + u_xD @ w2_MxDxD[i].astype(dtype) + b2_MxD[i].astype(dtype)
      states.append(_layer_norm(z_xD, norm_out[0][i], norm_out[1][i], cfg.layer_norm_eps))
    return jnp.stack(states, axis=-2), z_xD


def sow_draft_losses(module: nn.Module, logits_BxLxMxV, tokens_BxL, length: int, weight: float) -> None:
  """Sows into 'losses' `weight` times the mean over heads of head i's cross-entropy against byte t+1+i (positions
  whose target is among the first `length` tokens), and into 'metrics' each head's accuracy ('draft_accuracy_i')."""
  num = logits_BxLxMxV.shape[2]
  losses, position_L = [], jnp.arange(tokens_BxL.shape[1])
  for i in range(1, num + 1):
    targets_BxL = jnp.roll(tokens_BxL, -(i + 1), axis=1)
    valid_L = (position_L + i + 1 < length).astype(jnp.float32)
    logits_BxLxV = logits_BxLxMxV[:, :, i - 1].astype(jnp.float32)
    ce_BxL = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, targets_BxL)
    denominator = jnp.maximum(valid_L.sum(), 1.0) * tokens_BxL.shape[0]
    losses.append((ce_BxL * valid_L).sum() / denominator)
    right_BxL = (jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL).astype(jnp.float32)
    module.sow("metrics", f"draft_accuracy_{i}", (right_BxL * valid_L).sum() / denominator)
  module.sow("losses", "draft_loss", weight * sum(losses) / num)
