"""'every<N>' (AU-Net's nested splits, Videau et al. 2025): a segment closes after every N positions of the stream."""

import re

import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic.predictors.base import BoundaryPredictor, Decision, register


MAX_COUNT = 2**20  # positions a segment may span: beyond any window this library trains on


@register
class Every(BoundaryPredictor):
  """b_t = 1 where (t + 1) % N == 0, t the position's absolute entry in the level's stream (`positions_L`, so
  decoding cuts where the forward pass does). A nested level's stream is the segments of the level above, so
  'whitespace,every2,every2' cuts bytes into words, words into pairs and pairs into groups of four words; at the
  first level it cuts every N bytes. No parameters, no loss, exactly causal. The level's segment slots are counted
  from its factor: give it the factor N (the presets do, from `segment_length`)."""
  count: int = 2

  key = "every<N>"
  examples = ("every2", "every3")
  module_name = "every"

  @classmethod
  def parse(cls, name: str) -> dict | None:
    match = re.fullmatch(r"every([0-9]+)", name)
    if match and not 2 <= int(match.group(1)) <= MAX_COUNT:
      raise ValueError(f"boundaries {name!r}: every<N> closes a segment after N positions, 2 <= N <= {MAX_COUNT:,} "
                       f"(a segment longer than the window never closes), got N={int(match.group(1)):,}; e.g. "
                       "'every2'.")
    return {"count": int(match.group(1))} if match else None

  segment_length = classmethod(lambda cls: cls.count)

  def __call__(self, x_BxLxD, deterministic=True, positions_L=None, lengths_B=None, state=None):
    positions_L = jnp.arange(x_BxLxD.shape[1]) if positions_L is None else positions_L
    b_L = ((positions_L + 1) % self.count == 0).astype(jnp.float32)  # or [B, L]: rows at their own entries
    return Decision(jnp.broadcast_to(b_L, x_BxLxD.shape[:2]))
