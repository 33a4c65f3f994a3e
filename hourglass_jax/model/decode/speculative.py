"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023)'s acceptance rule, shared by every draft, and what
speculation did (`Stats`). The decode loop that runs it is loop.py.

Greedy (temperature 0): a proposed token is kept while it equals the target's argmax; the target's argmax at the
first mismatch (or after the last proposal) comes free, so a pass yields 1 to K+1 tokens, the tokens plain greedy
decoding yields (up to float round-off between a K-token pass and K single steps).
Sampling: proposal d_i, drawn from the draft's q_i, is kept with probability min(1, p_i(d) / q_i(d)), p the target's
distribution after temperature, top-k and top-p; at the first rejection the token is drawn from the normalised
max(0, p_i - q_i), after K acceptances from p_{K+1}. A deterministic draft (n-gram) has q = a point mass.
"""

import dataclasses

import jax
import jax.numpy as jnp


def accept(key, logits_BxKxV, draft_BxK, draft_probs, pick):
  """(the count m [B] of leading proposals kept, the token after them [B]) for target logits at the last accepted
  token and at each proposal (K+1 rows) and K proposals drawn from `draft_probs` [B, K, V] (None: deterministic)."""
  batch, num = draft_BxK.shape
  vocab = logits_BxKxV.shape[-1]
  key_accept, key_next = jax.random.split(key)
  _, p_BxKxV = pick(key_next, logits_BxKxV.reshape(-1, vocab))
  if p_BxKxV is None:  # greedy
    best_BxK = jnp.argmax(logits_BxKxV, axis=-1).astype(jnp.int32)
    kept_B = jnp.sum(jnp.cumprod(draft_BxK == best_BxK[:, :num], axis=1), axis=1)
    return kept_B, jnp.take_along_axis(best_BxK, kept_B[:, None], axis=1)[:, 0]
  p_BxKxV = p_BxKxV.reshape(batch, num + 1, vocab)
  q_BxKxV = jax.nn.one_hot(draft_BxK, vocab) if draft_probs is None else draft_probs.astype(jnp.float32)
  at_draft = lambda probs: jnp.take_along_axis(probs[:, :num], draft_BxK[..., None], axis=2)[..., 0]
  keep_BxK = jax.random.uniform(key_accept, (batch, num)) * at_draft(q_BxKxV) < at_draft(p_BxKxV)
  kept_B = jnp.sum(jnp.cumprod(keep_BxK, axis=1), axis=1)
  row = lambda probs: jnp.take_along_axis(probs, jnp.minimum(kept_B, probs.shape[1] - 1)[:, None, None], axis=1)[:, 0]
  p_BxV = row(p_BxKxV)
  residual_BxV = jnp.maximum(p_BxV - row(q_BxKxV), 0.0)
  residual_BxV = jnp.where(residual_BxV.sum(axis=-1, keepdims=True) > 0, residual_BxV, p_BxV)
  next_BxV = jnp.where((kept_B < num)[:, None], residual_BxV, p_BxV)
  return kept_B, jax.random.categorical(key_next, jnp.log(next_BxV)).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Stats:
  """What speculation did. Arrays: speculative passes of the target after the prefill (`passes`) and plain steps
  (`steps`); per row the tokens generated, the proposals kept, the tokens speculative passes gave and the passes the
  row took part in; the pass after which decoding first fell back to plain steps (-1: never) and how often the draft
  came back after a fallback. `pass_cost`: what a pass cost in plain steps, `measured` (timed) or estimated
  (fallback.pass_cost); `seconds_per_step`: a plain step's measured seconds (0 when not measured)."""
  passes: jax.Array
  steps: jax.Array
  generated_B: jax.Array
  kept_B: jax.Array
  drafted_B: jax.Array
  passes_B: jax.Array
  fell_back_at: jax.Array
  returns: jax.Array
  pass_cost: float = 1.0
  measured: bool = False
  seconds_per_step: float = 0.0

  @property
  def tokens_per_pass(self) -> float:
    """Tokens a row gained per speculative pass it took part in (1 + the proposals it kept), over all rows; 1 when
    no pass ran."""
    row_passes = int(jnp.sum(self.passes_B))
    return float(jnp.sum(self.drafted_B)) / row_passes if row_passes else 1.0

  @property
  def speedup(self) -> float:
    """Plain decoding's cost over this decoding's, in plain steps after the prefill: the longest row's tokens after
    its first, against passes x pass_cost + steps."""
    cost = int(self.passes) * self.pass_cost + int(self.steps)
    return (int(jnp.max(self.generated_B)) - 1) / cost if cost else 1.0

  def describe(self, draft: str, proposals: int) -> str:
    """One line: passes, tokens per pass, plain steps, fallbacks, and the speed-up against plain decoding."""
    how = "measured" if self.measured else "estimated"
    line = (f"speculative decoding ({draft}, {proposals} proposals per pass): {int(self.passes):,} passes of "
            f"{self.tokens_per_pass:.2f} tokens, {int(self.steps):,} plain steps")
    if int(self.fell_back_at) >= 0:
      line += (f" (plain decoding from pass {int(self.fell_back_at)}" + (
          f", the draft back {int(self.returns)} time{'s' if int(self.returns) != 1 else ''})" if int(self.returns)
          else ")"))
    return (f"{line}; a pass costs {self.pass_cost:.2f} plain steps ({how}): {self.speedup:.2f}x plain decoding "
            f"({how})")


jax.tree_util.register_dataclass(
    Stats, data_fields=["passes", "steps", "generated_B", "kept_B", "drafted_B", "passes_B", "fell_back_at",
                        "returns"], meta_fields=["pass_cost", "measured", "seconds_per_step"])
