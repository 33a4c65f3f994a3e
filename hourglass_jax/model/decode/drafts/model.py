"""'model': a smaller hourglass_jax model with the target's vocabulary drafts with its own cache, K cached steps
(the first of them also feeding the last two accepted tokens, which its cache may not hold yet)."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp

from hourglass_jax.model import counting
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode.drafts.base import Draft, register
from hourglass_jax.model.decode.steps import check_params, extend, max_len_for, prefill, row_positions

MAX_FRACTION = 0.1  # of the target's parameters: configs/draft.py sizes drafts under it, larger ones are warned about


def size_warning(draft_cfg: ModelConfig, target_cfg: ModelConfig) -> str | None:
  """One line when a draft model cannot pay: the target itself, or more than MAX_FRACTION of its parameters (a
  decode step reads every weight, so each proposal costs about that fraction of a target step)."""
  if draft_cfg == target_cfg:
    return ("the draft model is the target model itself (the same settings): each pass checks proposals the target "
            "computed at its own full cost, so it decodes slower than plain decoding; use a smaller draft "
            "(configs/draft.py) or draft='ngram'.")
  draft, target = counting.total_params(draft_cfg), counting.total_params(target_cfg)
  if draft <= MAX_FRACTION * target:
    return None
  return (f"the draft model has {draft:,} parameters, {draft / target:.0%} of the target's {target:,}: each proposal "
          f"costs about that share of a target step, more than speculation gains back above {MAX_FRACTION:.0%} "
          "(docs/generation.md); configs/draft.py sizes a draft for a target.")


@register
@dataclasses.dataclass(frozen=True)
class Model(Draft):
  """A draft model: `cfg` its ModelConfig (hashable), its params passed as the draft's `params`."""
  cfg: ModelConfig

  name = "model"

  def __post_init__(self):
    if not isinstance(self.cfg, ModelConfig):
      raise ValueError(f"drafts.Model(cfg=...) takes the draft model's ModelConfig, got a {type(self.cfg).__name__}; "
                       "pass drafts.Model(ModelConfig.from_dict(section)) for a config section or dict.")

  def check(self, target_cfg, params) -> None:
    if self.cfg.vocab_size != target_cfg.vocab_size:
      raise ValueError(f"the draft model's vocab_size={self.cfg.vocab_size} differs from the target's "
                       f"{target_cfg.vocab_size}; a draft must propose tokens of the target's vocabulary.")
    if params is None:
      raise ValueError("a draft model needs its params (the `draft_params` of generate).")
    if warning := size_warning(self.cfg, target_cfg):
      warnings.warn(warning)  # once per process: load_draft and generate both check
    check_params(params, self.cfg, "draft_params")

  def start(self, params, prompt_BxP, max_len):
    return prefill(params, self.cfg, prompt_BxP, max_len_for(self.cfg, max_len))[0]

  def propose(self, params, cache, seq_BxL, length_B, key, num, pick):
    two_Bx2 = jnp.take_along_axis(seq_BxL, length_B[:, None] - 2 + jnp.arange(2)[None], axis=1)
    cache, logits_Bx2xV = extend(params, self.cfg, cache, two_Bx2, row_positions(length_B - 2))
    keys = jax.random.split(key, num)
    token_B, probs_BxV = pick(keys[0], logits_Bx2xV[:, 1])

    def step(carry, key_i):
      cache, token_B, i = carry
      cache, logits_Bx1xV = extend(params, self.cfg, cache, token_B[:, None],
                                   row_positions(length_B + i))
      new_B, probs_BxV = pick(key_i, logits_Bx1xV[:, 0])
      return (cache, new_B, i + 1), (new_B, probs_BxV)

    (cache, _, _), (rest_KxB, rest_probs) = jax.lax.scan(step, (cache, token_B, jnp.int32(0)), keys[1:])
    tokens_BxK = jnp.concatenate([token_B[:, None], rest_KxB.T], axis=1)
    probs = None if probs_BxV is None else jnp.concatenate([probs_BxV[:, None], jnp.swapaxes(rest_probs, 0, 1)], 1)
    return cache, tokens_BxK, probs
