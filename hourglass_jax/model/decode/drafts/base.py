"""The draft interface of speculative decoding (the decode loop, loop.py) and its registry.

A draft proposes the next K tokens of every row; the target model checks them all in one pass. The draft only
decides how fast decoding goes, never what is sampled: the acceptance rule makes the output follow the target.
"""

import dataclasses
from typing import Any, Callable, ClassVar

import jax

DRAFTS: dict[str, type["Draft"]] = {}  # name -> class, in the order registered


@dataclasses.dataclass(frozen=True)
class Draft:
  """A draft source: a frozen (hashable, jit-static) description; the arrays it needs (a draft model's params) are
  passed beside it as `params`.

  `start(params, prompt_BxP, max_len)` -> its state after the prompt (traced, inside generate's program; the
  sequences grow to `max_len` tokens).
  `propose(params, state, seq_BxL, length_B, key, num, pick)` -> (state, tokens [B, num], probs [B, num, V] of the
  distribution each token was drawn from, or None for a deterministic proposal): the next `num` tokens after each
  row's first length_B tokens of seq (the prompt and what was accepted so far). `pick(key, logits_BxV)` -> (tokens
  [B], probs [B, V] or None) draws as the target does (greedy, or the same temperature and filters); a draft that
  samples must use it, so that its probabilities are those of the acceptance rule.

  A draft that `reads_target` drafts from the target itself: its `params` are the target's, and after every pass of
  the target `observe(params, state, tap_BxTxD, index_B, took_B)` gives it what the target's draft heads read at
  each fed position (`tap`, model/draft_heads.py) and, per row, the index of its newest accepted position there
  (rows with took_B False keep their state).
  """
  name: ClassVar[str]
  reads_target: ClassVar[bool] = False

  def start(self, params, prompt_BxP, max_len: int):
    return ()

  def propose(self, params, state, seq_BxL, length_B, key, num: int, pick: Callable) -> tuple[Any, jax.Array, Any]:
    raise NotImplementedError

  def observe(self, params, state, tap_BxTxD, index_B, took_B):
    return state

  def check(self, target_cfg, params) -> None:
    """Raises ValueError, naming the fix, when this draft cannot draft for `target_cfg` (`params`: generate's
    `draft_params`)."""

  def for_target(self, target_cfg, num: int) -> "Draft":
    """This draft set up to propose `num` tokens per pass for `target_cfg` (checked: ValueError naming the fix)."""
    return self


def register(cls):
  DRAFTS[cls.name] = cls
  return cls
