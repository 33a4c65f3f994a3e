"""The decode loop: one state (`State`), one loop, plain decoding being the loop without a draft.

`start` prefills the prompts and draws each row's first token; `advance` runs the loop's iterations, each a plain
step (one token per row, every row at one position) or, with a draft, a speculative pass: the draft proposes K tokens
per row (drafts/), the target checks them in one `extend` pass with each row at its own position, and the acceptance
rule (speculative.py) keeps what the target itself would have produced. `finish` gives the tokens and the stats.
Which of the two an iteration is: `State.speculating`, set by the fallback rule (fallback.py): in the loop, on the
tokens per pass against a threshold, or between timed windows on the host.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode import fallback
from hourglass_jax.model.decode.options import Sampling
from hourglass_jax.model.decode.speculative import Stats, accept
from hourglass_jax.model.decode.steps import extend, max_len_for, prefill, row_positions

UNLIMITED = 2 ** 31 - 1


@dataclasses.dataclass
class State:
  """The loop's state: the cache and the draft's state; per row the prompt and the tokens so far (`seq`, the first
  `length` of each row), whether it is done, the proposals it kept, the tokens speculative passes gave it and the
  passes it took part in; the passes and plain steps so far; the mode of the next iteration and the fallback rule's
  counters (the current window's passes, row-passes and tokens; plain steps left before the draft is tried again;
  the pass after which it first fell back, -1 none; the times the draft came back)."""
  cache: dict
  draft: Any
  seq_BxS: jax.Array
  length_B: jax.Array
  done_B: jax.Array
  rng: jax.Array
  kept_B: jax.Array
  drafted_B: jax.Array
  passes_B: jax.Array
  passes: jax.Array
  steps: jax.Array
  speculating: jax.Array
  window_passes: jax.Array
  window_rows: jax.Array
  window_tokens: jax.Array
  plain_left: jax.Array
  fell_back_at: jax.Array
  returns: jax.Array


jax.tree_util.register_dataclass(State, data_fields=[f.name for f in dataclasses.fields(State)], meta_fields=[])


def limit(prompt_len: int, options: Sampling) -> int:
  """The sequence length a row stops at: prompt + max_new_tokens."""
  return prompt_len + options.max_new_tokens


def cache_len(cfg: ModelConfig, prompt_len: int, options: Sampling) -> int:
  """Positions the loop's cache holds: a row feeds positions up to limit - 2, and a pass `proposals` more."""
  return max_len_for(cfg, limit(prompt_len, options) - 1 + options.proposals)


def start(params, draft_params, prompt_BxP, rng, end_token, cfg: ModelConfig, options: Sampling) -> State:
  """The prefill, each row's first token, and the draft's state after the prompt; `end_token` < 0: none."""
  batch, length = prompt_BxP.shape
  draft, num = options.draft, options.proposals
  taps = draft is not None and draft.reads_target
  cache, logits_BxV, *tap = prefill(params, cfg, prompt_BxP, cache_len(cfg, length, options), tap=taps)
  rng, key = jax.random.split(rng)
  first_B = options.pick(key, logits_BxV)[0]
  size = limit(length, options) + num + 1
  seq_BxS = jnp.zeros((batch, size), jnp.int32).at[:, :length].set(prompt_BxP).at[:, length].set(first_B)
  state = () if draft is None else draft.start(draft_params, prompt_BxP, limit(length, options) + num)
  if taps:
    state = draft.observe(draft_params, state, tap[0], jnp.full((batch,), length - 1), jnp.ones((batch,), bool))
  zero_B, zero = jnp.zeros((batch,), jnp.int32), jnp.int32(0)
  return State(cache=cache, draft=state, seq_BxS=seq_BxS, length_B=jnp.full((batch,), length + 1, jnp.int32),
               done_B=(first_B == end_token) | (options.max_new_tokens == 1), rng=rng, kept_B=zero_B,
               drafted_B=zero_B, passes_B=zero_B, passes=zero, steps=zero, speculating=jnp.asarray(draft is not None),
               window_passes=zero, window_rows=zero, window_tokens=zero, plain_left=zero, fell_back_at=jnp.int32(-1),
               returns=zero)


def _commit(s: State, new_BxN, count_B, end_token, stop: int) -> tuple[State, jax.Array]:
  """(`s` once each active row takes its first count_B of new_BxN, cut after an end token and at `stop` tokens;
  the counts taken)."""
  active_B = ~s.done_B
  count_B = jnp.minimum(jnp.where(active_B, count_B, 0), stop - s.length_B)
  hits_BxN = (new_BxN == end_token) & (jnp.arange(new_BxN.shape[1])[None] < count_B[:, None])
  ended_B = hits_BxN.any(axis=1)
  count_B = jnp.where(ended_B, jnp.argmax(hits_BxN, axis=1) + 1, count_B)
  index_BxN = s.length_B[:, None] + jnp.arange(new_BxN.shape[1])[None]
  seq_BxS = s.seq_BxS.at[jnp.arange(new_BxN.shape[0])[:, None], index_BxN].set(new_BxN, mode="drop")
  length_B = s.length_B + count_B
  return dataclasses.replace(s, seq_BxS=seq_BxS, length_B=length_B,
                             done_B=s.done_B | ended_B | (length_B >= stop)), count_B


def plain_step(params, draft_params, s: State, end_token, cfg: ModelConfig, options: Sampling, stop: int,
               threshold) -> State:
  """One token per active row at one position, the earliest an active row is at: rows ahead (after speculative
  passes) feed a token they hold again (the same cache entries) and take nothing, so rows line up and the step
  runs every row at one position."""
  draft = options.draft
  taps = draft is not None and draft.reads_target
  rng, key = jax.random.split(s.rng)
  at_B = s.length_B - 1
  position = jnp.min(jnp.where(s.done_B, UNLIMITED, at_B))
  tokens_Bx1 = jnp.take_along_axis(s.seq_BxS, jnp.minimum(position, at_B)[:, None], axis=1)
  cache, logits_Bx1xV, *tap = extend(params, cfg, s.cache, tokens_Bx1, position, tap=taps)
  took_B = (at_B == position) & ~s.done_B
  s, _ = _commit(dataclasses.replace(s, cache=cache, rng=rng), options.pick(key, logits_Bx1xV[:, 0])[0][:, None],
                 took_B.astype(jnp.int32), end_token, stop)
  if taps:
    s = dataclasses.replace(s, draft=draft.observe(draft_params, s.draft, tap[0], jnp.zeros_like(at_B), took_B))
  s = dataclasses.replace(s, steps=s.steps + 1, plain_left=s.plain_left - 1)
  if draft is None:
    return s
  back = (threshold > 0) & (s.plain_left <= 0)  # the fallback rule's re-check (fallback.py)
  return dataclasses.replace(s, speculating=back, returns=s.returns + back)


def speculative_pass(params, draft_params, s: State, end_token, cfg: ModelConfig, options: Sampling, stop: int,
                     threshold) -> State:
  """The draft's K proposals per row checked in one pass, each row at its own position; then the fallback rule."""
  draft, num, pick = options.draft, options.draft_tokens, options.pick
  batch = s.length_B.shape[0]
  rng, key_draft, key_accept = jax.random.split(s.rng, 3)
  state, draft_BxK, draft_probs = draft.propose(draft_params, s.draft, s.seq_BxS, s.length_B, key_draft, num, pick)
  last_Bx1 = jnp.take_along_axis(s.seq_BxS, s.length_B[:, None] - 1, axis=1)
  cache, logits_BxNxV, *tap = extend(params, cfg, s.cache, jnp.concatenate([last_Bx1, draft_BxK], axis=1),
                                     row_positions(s.length_B - 1), tap=draft.reads_target)
  kept_B, next_B = accept(key_accept, logits_BxNxV, draft_BxK, draft_probs, pick)
  new_BxN = jnp.concatenate([draft_BxK, draft_BxK[:, :1]], axis=1).at[jnp.arange(batch), kept_B].set(next_B)
  active_B = ~s.done_B
  s, count_B = _commit(dataclasses.replace(s, cache=cache, rng=rng), new_BxN, kept_B + 1, end_token, stop)
  if draft.reads_target:
    state = draft.observe(draft_params, state, tap[0], kept_B, active_B)
  rows = active_B.sum()
  s = dataclasses.replace(
      s, draft=state, passes=s.passes + 1, kept_B=s.kept_B + jnp.where(active_B, kept_B, 0),
      drafted_B=s.drafted_B + count_B, passes_B=s.passes_B + active_B, window_passes=s.window_passes + 1,
      window_rows=s.window_rows + rows, window_tokens=s.window_tokens + count_B.sum())
  judged = s.window_passes >= fallback.WINDOW
  slow = judged & (s.window_tokens < threshold * s.window_rows)
  wait = jnp.minimum(fallback.RECHECK * 2 ** jnp.minimum(s.returns, 4), fallback.RECHECK_MAX)
  zero = jnp.int32(0)
  return dataclasses.replace(
      s, speculating=~slow, plain_left=jnp.where(slow, wait, s.plain_left),
      fell_back_at=jnp.where(slow & (s.fell_back_at < 0), s.passes, s.fell_back_at),
      window_passes=jnp.where(judged, zero, s.window_passes), window_rows=jnp.where(judged, zero, s.window_rows),
      window_tokens=jnp.where(judged, zero, s.window_tokens))


def advance(params, draft_params, s: State, end_token, threshold, iterations, cfg: ModelConfig,
            options: Sampling, only: bool | None = None) -> State:
  """Up to `iterations` iterations of the loop, fewer once every row is done. `threshold`: the fallback rule's
  tokens per pass (0: the mode stays as `s.speculating` says). `only` True / False: every iteration a pass / a
  plain step, a program of that mode alone (the timed windows, whose mode the host sets); None: each as
  `s.speculating` says."""
  stop = s.seq_BxS.shape[1] - options.proposals - 1  # limit(prompt length, options): see `start`
  step = functools.partial(plain_step, params, draft_params, end_token=end_token, cfg=cfg, options=options,
                           stop=stop, threshold=threshold)
  spec = functools.partial(speculative_pass, params, draft_params, end_token=end_token, cfg=cfg, options=options,
                           stop=stop, threshold=threshold)
  if options.draft is None or only is False:
    body = step
  elif only:
    body = spec
  else:
    body = lambda s: lax.cond(s.speculating, spec, step, s)
  begin = s.passes + s.steps
  running = lambda s: ~jnp.all(s.done_B) & (s.passes + s.steps - begin < iterations)
  return lax.while_loop(running, body, s)


def progress(s: State) -> tuple:
  """(whether every row is done, the tokens of all rows so far, the rows still generating, the iterations so far):
  scalars, so that a host reads them from any process."""
  return jnp.all(s.done_B), jnp.sum(s.length_B), jnp.sum(~s.done_B), s.passes + s.steps


def finish(s: State, prompt_BxP, end_token, cfg: ModelConfig, options: Sampling, pass_cost: float = 1.0,
           measured: bool = False, seconds_per_step: float = 0.0) -> tuple[jax.Array, Stats]:
  """(the new tokens [B, max_new_tokens], later entries of a finished row `end_token`; a row whose prompt held an id
  outside the vocabulary, possible only under an outer jit, -1 everywhere; the Stats)."""
  length = prompt_BxP.shape[1]
  out_BxN = lax.dynamic_slice_in_dim(s.seq_BxS, length, options.max_new_tokens, axis=1)
  out_BxN = jnp.where(jnp.arange(options.max_new_tokens)[None] < (s.length_B - length)[:, None], out_BxN,
                      jnp.maximum(end_token, 0))
  bad_Bx1 = jnp.any((prompt_BxP < 0) | (prompt_BxP >= cfg.vocab_size), axis=1, keepdims=True)
  stats = Stats(s.passes, s.steps, s.length_B - length, s.kept_B, s.drafted_B, s.passes_B, s.fell_back_at, s.returns,
                pass_cost=pass_cost, measured=measured, seconds_per_step=seconds_per_step)
  return jnp.where(bad_Bx1, -1, out_BxN), stats
