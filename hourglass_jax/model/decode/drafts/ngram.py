"""'ngram': proposes what followed the latest earlier occurrence of each row's last bytes (prompt lookup). No model
and no training: strong where text repeats itself (code, logs, markup), useless on fresh prose."""

import dataclasses

import jax.numpy as jnp

from hourglass_jax.model.decode.drafts.base import Draft, register


def continuation(seq_BxL, length_B, max_ngram: int, num: int):
  """int32 [B, num]: for each row of seq (its first length_B tokens), the tokens that followed the latest earlier
  occurrence of its longest suffix of at most `max_ngram` tokens that occurred before, continued periodically past
  the row's end (a repeating pattern goes on repeating); with no earlier occurrence, its last token repeated."""
  batch, size = seq_BxL.shape
  index_L = jnp.arange(size)
  start_B = length_B - 1  # where the proposal is read from: no match yet
  found_B = jnp.zeros((batch,), bool)
  for n in range(max_ngram, 0, -1):  # the longest suffix first
    suffix_Bxn = jnp.take_along_axis(seq_BxL, jnp.clip(length_B[:, None] - n + jnp.arange(n)[None], 0, size - 1), 1)
    match_BxL = jnp.ones((batch, size), bool)
    for t in range(n):
      match_BxL &= jnp.take(seq_BxL, jnp.clip(index_L + t, 0, size - 1), axis=1) == suffix_Bxn[:, t:t + 1]
    match_BxL &= (index_L[None] + n <= length_B[:, None] - 1) & (length_B[:, None] >= n + 1)
    latest_B = jnp.max(jnp.where(match_BxL, index_L[None], -1), axis=1)
    use_B = ~found_B & (latest_B >= 0)
    start_B = jnp.where(use_B, latest_B + n, start_B)
    found_B |= use_B
  period_B = length_B - start_B
  source_BxK = start_B[:, None] + jnp.arange(num)[None] % period_B[:, None]
  return jnp.take_along_axis(seq_BxL, source_BxK, axis=1).astype(jnp.int32)


@register
@dataclasses.dataclass(frozen=True)
class NGram(Draft):
  """Looks the last `max_ngram` .. 1 bytes up in the prompt and the text generated so far (`continuation`)."""
  max_ngram: int = 8

  name = "ngram"

  def propose(self, params, state, seq_BxL, length_B, key, num, pick):
    return state, continuation(seq_BxL, length_B, self.max_ngram, num), None
