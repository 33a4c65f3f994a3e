"""What shapes a generation besides the arrays, checked once: `Sampling` (the filters, the length, the draft and its
settings), a frozen object that `generate` makes and the decode loop (loop.py) takes as a static argument."""

import dataclasses
import math
import numbers

from hourglass_jax.model.decode.drafts.base import DRAFTS, Draft
from hourglass_jax.model.decode.filters import check_sampling, picker

MAX_DRAFT_TOKENS = 64  # proposals per pass: beyond a few dozen bytes almost none are kept
MAX_TOKENS = 2 ** 31 - 1  # positions are int32


def count(name: str, value, low: int, high: int) -> int:
  """`value` as an int, or ValueError naming `name` unless it is an integer in [low, high]."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
    raise ValueError(f"{name}={value!r} must be an integer in [{low}, {high}].")
  return int(value)


def check_draft(draft) -> None:
  """ValueError naming the fix unless `draft` is None or a drafts.Draft (a name is turned into one by draft_for)."""
  if draft is not None and not isinstance(draft, Draft):
    names = ", ".join(name for name in DRAFTS if name != "model")
    raise ValueError(f"draft={draft!r} must be None, a draft name ({names}) or a drafts.Draft "
                     "(drafts.Model(cfg) for a draft model).")


@dataclasses.dataclass(frozen=True)
class Sampling:
  """The options of one generation. temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off. With a
  `draft` (drafts/), it proposes `draft_tokens` tokens per pass; `fallback_below` is the tokens per pass under which
  the loop decodes plainly for a while (0: never; None: `generate`'s default, measured time or the backend's pass
  cost, fallback.py). Made once and checked then: each bad value raises ValueError naming it."""
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  draft: Draft | None = None
  draft_tokens: int = 4
  fallback_below: float | None = None

  def __post_init__(self):
    check_sampling(self.temperature, self.top_k, self.top_p)
    count("max_new_tokens", self.max_new_tokens, 1, MAX_TOKENS - MAX_DRAFT_TOKENS)
    check_draft(self.draft)
    count("draft_tokens", self.draft_tokens, 1, MAX_DRAFT_TOKENS)
    below = self.fallback_below
    if below is not None:
      if self.draft is None:
        raise ValueError(f"fallback_below={below!r} applies to speculative decoding; pass a draft (e.g. "
                         "draft='ngram').")
      if isinstance(below, bool) or not isinstance(below, numbers.Real) or not (
          math.isfinite(below) and 0 <= below <= self.draft_tokens + 1):
        raise ValueError(f"fallback_below={below!r} must be None or a number in [0, draft_tokens + 1 = "
                         f"{self.draft_tokens + 1}] (tokens per pass; 0 never falls back).")
    # Python numbers, so that equal options are one static argument (one compiled program).
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
    object.__setattr__(self, "draft_tokens", int(self.draft_tokens))
    object.__setattr__(self, "fallback_below", None if below is None else float(below))

  @property
  def pick(self):
    """pick(key, logits [B, V]) -> (tokens [B], the probabilities drawn from, None when greedy): filters.picker."""
    return picker(self.temperature, self.top_k, self.top_p)

  @property
  def proposals(self) -> int:
    """Tokens a pass proposes: draft_tokens with a draft, 0 without (a plain step)."""
    return 0 if self.draft is None else self.draft_tokens
