"""The draft interface of speculative decoding (speculative.py) and its registry.

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
  """
  name: ClassVar[str]

  def start(self, params, prompt_BxP, max_len: int):
    return ()

  def propose(self, params, state, seq_BxL, length_B, key, num: int, pick: Callable) -> tuple[Any, jax.Array, Any]:
    raise NotImplementedError

  def check(self, target_cfg, params) -> None:
    """Raises ValueError, naming the fix, when this draft cannot draft for `target_cfg`."""


def register(cls):
  DRAFTS[cls.name] = cls
  return cls
