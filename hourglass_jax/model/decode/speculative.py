"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) for every model kind: a draft (drafts/) proposes
K tokens per row, the target checks all of them in one `extend` pass, and the acceptance rule keeps exactly what
the target would have produced, so the output follows the target's distribution whatever the draft.

Greedy (temperature 0): a proposed token is kept while it equals the target's argmax; the target's argmax at the
first mismatch (or after the last proposal) comes free, so a pass yields 1 to K+1 tokens, the tokens plain greedy
decoding yields (up to float round-off between a K-token pass and K single steps).
Sampling: proposal d_i, drawn from the draft's q_i, is kept with probability min(1, p_i(d) / q_i(d)), p the target's
distribution after temperature, top-k and top-p; at the first rejection the token is drawn from the normalised
max(0, p_i - q_i), after K acceptances from p_{K+1}. A deterministic draft (n-gram) has q = a point mass.

Rows accept different counts, so every row goes on from its own position (`extend` maps the pass over rows). When
the tokens per pass stay below `fallback_below` after `warmup` rounds, the rest is plain cached decoding, the rows
lined up again at one position.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode.drafts.base import Draft
from hourglass_jax.model.decode.filters import picker
from hourglass_jax.model.decode.steps import extend, max_len_for, prefill, row_positions


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
  """What speculation did: target passes after the prefill, per row the tokens generated and the proposals kept,
  and the pass after which decoding fell back to plain steps (-1: it did not)."""
  passes: jax.Array
  generated_B: jax.Array
  kept_B: jax.Array
  fell_back_at: jax.Array

  @property
  def tokens_per_pass(self) -> float:
    """Mean over rows of tokens generated per target pass (the prefill's first token excluded); 1 when no pass
    speculated."""
    if int(self.passes) == 0:
      return 1.0
    return float(jnp.mean(self.generated_B - 1) / self.passes)

  @classmethod
  def plain(cls, tokens_BxN, end_token) -> "Stats":
    """The stats of plain decoding from the start (speculation could not pay): no pass, fell back at 0."""
    ended_BxN = tokens_BxN == end_token
    generated_B = jnp.where(jnp.any(ended_BxN, axis=1), jnp.argmax(ended_BxN, axis=1) + 1, tokens_BxN.shape[1])
    return cls(jnp.int32(0), generated_B.astype(jnp.int32), jnp.zeros_like(generated_B, jnp.int32), jnp.int32(0))


jax.tree_util.register_dataclass(Stats, data_fields=["passes", "generated_B", "kept_B", "fell_back_at"],
                                 meta_fields=[])


@functools.partial(jax.jit, static_argnames=("cfg", "draft", "num_draft", "max_new_tokens", "temperature", "top_k",
                                             "top_p", "fallback_below", "warmup"))
def speculate(params, draft_params, prompt_BxP, rng, end_token, cfg: ModelConfig, draft: Draft, num_draft: int,
              max_new_tokens: int, temperature: float, top_k: int, top_p: float, fallback_below: float, warmup: int):
  """Speculative `generate` (see the module docstring): (tokens [B, max_new_tokens], Stats). `end_token` < 0:
  none."""
  batch, length = prompt_BxP.shape
  num = num_draft
  limit = length + max_new_tokens
  cache, logits_BxV = prefill(params, cfg, prompt_BxP, max_len_for(cfg, limit + num))
  pick = picker(temperature, top_k, top_p)
  rng, key = jax.random.split(rng)
  first_B = pick(key, logits_BxV)[0]
  seq_BxS = jnp.zeros((batch, limit + num + 1), jnp.int32).at[:, :length].set(prompt_BxP).at[:, length].set(first_B)
  state = draft.start(draft_params, prompt_BxP, limit + num)
  zero_B = jnp.zeros((batch,), jnp.int32)
  carry = dict(cache=cache, state=state, seq=seq_BxS, length=jnp.full((batch,), length + 1, jnp.int32),
               done=(first_B == end_token) | (max_new_tokens == 1), rng=rng, passes=jnp.int32(0), kept=zero_B,
               row_rounds=jnp.int32(0), row_tokens=jnp.int32(0), fell_back_at=jnp.int32(-1))

  commit = functools.partial(_commit, end_token=end_token, limit=limit)

  def last_tokens(c):
    return jnp.take_along_axis(c["seq"], c["length"][:, None] - 1, axis=1)

  def speculative(c):
    rng, key_draft, key_accept = jax.random.split(c["rng"], 3)
    state, draft_BxK, draft_probs = draft.propose(draft_params, c["state"], c["seq"], c["length"], key_draft, num,
                                                  pick)
    tokens_BxN = jnp.concatenate([last_tokens(c), draft_BxK], axis=1)
    cache, logits_BxNxV = extend(params, cfg, c["cache"], tokens_BxN, row_positions(c["length"] - 1))
    kept_B, next_B = accept(key_accept, logits_BxNxV, draft_BxK, draft_probs, pick)
    new_BxN = jnp.concatenate([draft_BxK, draft_BxK[:, :1]], axis=1).at[jnp.arange(batch), kept_B].set(next_B)
    c = commit(dict(c, cache=cache, state=state, rng=rng), new_BxN, kept_B + 1, kept_B)
    slow = (c["passes"] >= warmup) & (c["row_tokens"] < fallback_below * c["row_rounds"])
    return dict(c, fell_back_at=jnp.where(slow, c["passes"], c["fell_back_at"]))

  def plain(c):
    """A plain step at one position for every row, the earliest an active row is at: rows ahead feed a token they
    hold again (the same cache entries) and take nothing, so rows line up and the step needs no map over rows."""
    rng, key = jax.random.split(c["rng"])
    at_B = c["length"] - 1
    position = jnp.min(jnp.where(c["done"], jnp.iinfo(jnp.int32).max, at_B))
    tokens_Bx1 = jnp.take_along_axis(c["seq"], jnp.minimum(position, at_B)[:, None], axis=1)
    cache, logits_Bx1xV = extend(params, cfg, c["cache"], tokens_Bx1, position)
    return commit(dict(c, cache=cache, rng=rng), pick(key, logits_Bx1xV[:, 0])[0][:, None],
                  (at_B == position).astype(jnp.int32), zero_B)

  def body(c):
    return lax.cond(c["fell_back_at"] >= 0, plain, speculative, c)

  c = lax.while_loop(lambda c: ~jnp.all(c["done"]), body, carry)
  out_BxN = lax.dynamic_slice_in_dim(c["seq"], length, max_new_tokens, axis=1)
  out_BxN = jnp.where(jnp.arange(max_new_tokens)[None] < (c["length"] - length)[:, None], out_BxN,
                      jnp.maximum(end_token, 0))
  bad_Bx1 = jnp.any((prompt_BxP < 0) | (prompt_BxP >= cfg.vocab_size), axis=1, keepdims=True)
  return jnp.where(bad_Bx1, -1, out_BxN), Stats(c["passes"], c["length"] - length, c["kept"], c["fell_back_at"])


def _commit(c, new_BxN, count_B, kept_B, end_token, limit):
  """The loop's state `c` once each active row takes its first count_B of new_BxN (cut after an end token and at
  the limit of prompt + max_new_tokens)."""
  active_B = ~c["done"]
  count_B = jnp.minimum(jnp.where(active_B, count_B, 0), limit - c["length"])
  hits_BxN = (new_BxN == end_token) & (jnp.arange(new_BxN.shape[1])[None] < count_B[:, None])
  ended_B = hits_BxN.any(axis=1)
  count_B = jnp.where(ended_B, jnp.argmax(hits_BxN, axis=1) + 1, count_B)
  index_BxN = c["length"][:, None] + jnp.arange(new_BxN.shape[1])[None]
  seq_BxS = c["seq"].at[jnp.arange(new_BxN.shape[0])[:, None], index_BxN].set(new_BxN, mode="drop")
  length_B = c["length"] + count_B
  return dict(c, seq=seq_BxS, length=length_B, done=c["done"] | ended_B | (length_B >= limit),
              passes=c["passes"] + 1, kept=c["kept"] + jnp.where(active_B, kept_B, 0),
              row_rounds=c["row_rounds"] + active_B.sum(), row_tokens=c["row_tokens"] + count_B.sum())
