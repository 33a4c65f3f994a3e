"""'self': the model drafts for itself with its multi-byte prediction heads (model/draft_heads.py). The pass that
verifies one set of proposals computes, at each row's newest accepted position t, the state the heads read, and
gives byte t+1; the heads' chain turns them into the next proposals (bytes t+2 .. t+1+K, each head after the byte
drafted before it), so drafting needs no model of its own and no extra pass of the target."""

import dataclasses

import jax
import jax.numpy as jnp

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode.drafts.base import Draft, register
from hourglass_jax.model.decode.steps import draft_step


@register
@dataclasses.dataclass(frozen=True)
class SelfDraft(Draft):
  """The target's draft heads; `cfg` is the target's (set by `for_target`), its params the target's."""
  cfg: ModelConfig | None = None

  name = "self"
  reads_target = True

  def check(self, target_cfg, params) -> None:
    if not target_cfg.draft_heads:
      raise ValueError("draft='self' drafts with the model's draft heads, and this model has none "
                       "(model.draft_heads=0); train one with them (configs/default.py:self_draft) or use "
                       "draft='ngram'.")

  def for_target(self, target_cfg, num):
    self.check(target_cfg, None)
    if num > target_cfg.draft_heads:
      raise ValueError(f"draft_tokens={num}, but the model has {target_cfg.draft_heads} draft heads: draft='self' "
                       f"proposes at most one token per head; pass draft_tokens <= {target_cfg.draft_heads}.")
    return dataclasses.replace(self, cfg=target_cfg)

  def start(self, params, prompt_BxP, max_len):
    return jnp.zeros((prompt_BxP.shape[0], self.cfg.d_model), self.cfg.compute_dtype)

  def observe(self, params, state, tap_BxTxD, index_B, took_B):
    new_BxD = jnp.take_along_axis(tap_BxTxD, index_B[:, None, None], axis=1)[:, 0].astype(state.dtype)
    return jnp.where(took_B[:, None], new_BxD, state)

  def propose(self, params, state, seq_BxL, length_B, key, num, pick):
    """Head i drafts after head i-1's draft, head 0 after the row's newest byte (what the verifying pass gave)."""
    z_BxD, token_B = state, jnp.take_along_axis(seq_BxL, length_B[:, None] - 1, axis=1)[:, 0]
    tokens, probs = [], []
    for i, key_i in enumerate(jax.random.split(key, num)):
      logits_BxV, z_BxD = draft_step(params, self.cfg, z_BxD, token_B, i)
      token_B, probs_BxV = pick(key_i, logits_BxV)
      tokens.append(token_B)
      probs.append(probs_BxV)
    probs = None if probs[0] is None else jnp.stack(probs, axis=1)
    return state, jnp.stack(tokens, axis=1), probs

