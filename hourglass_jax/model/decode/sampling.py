"""`generate`: sampling with the cache, one jit-compiled decode loop, plain or speculative (speculative.py); the
filters (temperature, top-k, top-p) are in filters.py."""

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hourglass_jax.model.checks import check_tokens
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode import speculative
from hourglass_jax.model.decode.drafts import DRAFTS, Draft
from hourglass_jax.model.decode.filters import check_sampling, sample_logits
from hourglass_jax.model.decode.steps import check_cache_fits, decode_step, max_len_for, prefill, unbox_params

MAX_DRAFT_TOKENS = 64  # proposals per pass: beyond a few dozen bytes almost none are kept
# What a pass of the model costs in plain steps, measured on 2 CPU cores (BENCHMARKS.md, speculative decoding): 1.6
# to 2.0 at batch 1, 6 to 8.6 at batch 16, where a CPU step is bound by arithmetic and a pass does K + 1 tokens of it
# per row. Speculation stops below FALLBACK_BELOW tokens per pass, the cheapest batch-1 pass; where a pass costs
# less (a GPU at batch 1, bound by reading the weights), pass a lower fallback_below.
FALLBACK_BELOW = 1.6
FALLBACK_WARMUP = 8  # passes before that is judged


def speculation_pays(batch: int) -> bool:
  """Whether speculation can beat plain decoding by default: not for batches > 1 on a CPU, where a pass costs more
  plain steps than the K + 1 tokens it can give."""
  return batch == 1 or jax.default_backend() != "cpu"


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "temperature", "top_k", "top_p"))
def _generate(params, prompt_BxP, rng, end_token, cfg, max_new_tokens, temperature, top_k, top_p):
  """`end_token` < 0: no end token. Traced, so stopping rules share one compiled program."""
  batch, length = prompt_BxP.shape
  cache, logits_BxV = prefill(params, cfg, prompt_BxP, max_len_for(cfg, length + max_new_tokens - 1))
  tables = cache["tables"]
  sample = lambda key, logits: sample_logits(key, logits, temperature=temperature, top_k=top_k, top_p=top_p)
  fill = jnp.maximum(end_token, 0)
  rng, key = jax.random.split(rng)
  token_B = sample(key, logits_BxV)
  out_BxN = jnp.full((batch, max_new_tokens), fill, jnp.int32).at[:, 0].set(token_B)

  def running(carry):
    _, step, done_B, _, _ = carry
    return (step < max_new_tokens) & ~jnp.all(done_B)

  def body(carry):
    state, step, done_B, out_BxN, rng = carry
    cache, logits_BxV = decode_step(params, cfg, {"state": state, "tables": tables}, out_BxN[:, step - 1],
                                    length + step - 1)
    rng, key = jax.random.split(rng)
    token_B = jnp.where(done_B, fill, sample(key, logits_BxV))
    return cache["state"], step + 1, done_B | (token_B == end_token), out_BxN.at[:, step].set(token_B), rng

  carry = (cache["state"], jnp.int32(1), token_B == end_token, out_BxN, rng)
  out_BxN = lax.while_loop(running, body, carry)[3]
  # Only an outer jit lets such a prompt through (concrete ones are checked on the host): its row's logits were NaN.
  bad_Bx1 = jnp.any((prompt_BxP < 0) | (prompt_BxP >= cfg.vocab_size), axis=1, keepdims=True)
  return jnp.where(bad_Bx1, -1, out_BxN)


def _seed_key(rng):
  """A PRNG key from `rng` (a key, or an integer seed in [0, 2**63))."""
  if isinstance(rng, jax.Array) and (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) or rng.dtype == jnp.uint32):
    return rng
  if isinstance(rng, numbers.Integral) and not isinstance(rng, bool) and 0 <= rng < 2 ** 63:
    return jax.random.key(int(rng))
  raise ValueError(f"rng={rng!r} must be a PRNG key (e.g. jax.random.key(0)) or an integer seed in [0, 2**63).")


def _count(name: str, value, low: int, high: int) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
    raise ValueError(f"{name}={value!r} must be an integer in [{low}, {high}].")
  return int(value)


def _draft(draft, draft_params, cfg: ModelConfig) -> Draft | None:
  """The Draft that `draft` names (None, a registered name such as 'ngram', or a Draft), checked against cfg."""
  if draft is None:
    return None
  if isinstance(draft, str):
    if draft not in DRAFTS or draft == "model":
      raise ValueError(f"draft={draft!r} is not a draft name; use one of {', '.join(n for n in DRAFTS if n != 'model')}"
                       ", or drafts.Model(cfg) with draft_params for a draft model.")
    draft = DRAFTS[draft]()
  if not isinstance(draft, Draft):
    raise ValueError(f"draft={draft!r} must be None, a draft name ('ngram') or a drafts.Draft (drafts.Model(cfg)).")
  draft.check(cfg, draft_params)
  return draft


def generate(params, cfg: ModelConfig, prompt_BxP, *, max_new_tokens: int, rng, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, end_token: int | None = None, draft=None, draft_params=None,
             draft_tokens: int = 4, fallback_below: float | None = None, return_stats: bool = False):
  """Samples `max_new_tokens` tokens after each prompt row with the cache; returns them, int32 [B, max_new_tokens].

  One jit-compiled program: a parallel prefill, then a lax.while_loop that stops once every row has produced
  `end_token` (later entries of a finished row are `end_token`) or after `max_new_tokens`. The cache holds
  `decode.max_len_for(cfg, P + max_new_tokens - 1)` positions (plus draft_tokens + 1 when speculating).
  temperature 0 is greedy; top_k 0 and top_p 1 disable those filters; a temperature that is negative or not finite,
  a negative top_k or a top_p outside (0, 1] raises ValueError (`check_sampling`). `rng` is a PRNG key or an integer
  seed; the prompt needs >= 1 token (no BOS convention). A prompt id outside [0, vocab) raises ValueError; when the
  prompt is traced (generate under your own jit), that row comes back as -1 everywhere.

  Speculative decoding (speculative.py): `draft` 'ngram' (prompt lookup) or `drafts.Model(draft_cfg)` with its
  `draft_params` proposes `draft_tokens` tokens per pass, which the model checks in one pass; the output follows
  this model's distribution exactly (greedy: its greedy tokens). Below `fallback_below` tokens per pass (after
  FALLBACK_WARMUP passes) the rest is plain decoding (0: never). None: FALLBACK_BELOW, and plain decoding from the
  start where speculation cannot pay (`speculation_pays`: batches > 1 on a CPU; the stats say so, fell_back_at 0
  with no pass). `return_stats` returns (tokens, speculative.Stats) instead.
  """
  if params is None:
    raise ValueError("params is None; pass the model's params (from module.init, weights.load_params or a "
                     "checkpoint).")
  prompt_BxP = jnp.asarray(check_tokens(prompt_BxP, cfg.vocab_size, "prompt"), jnp.int32)
  if prompt_BxP.shape[1] < 1:
    raise ValueError(f"generate needs prompts [batch, length >= 1], got shape {prompt_BxP.shape}: this model has "
                     "no BOS convention, so start from at least one real token (e.g. a newline byte).")
  max_new_tokens = _count("max_new_tokens", max_new_tokens, 1, 2 ** 31 - 1 - prompt_BxP.shape[1] - MAX_DRAFT_TOKENS)
  check_sampling(temperature, top_k, top_p)
  if end_token is not None:
    end_token = _count("end_token", end_token, 0, cfg.vocab_size - 1)
  key = _seed_key(rng)
  draft = _draft(draft, draft_params, cfg)
  end = jnp.int32(-1 if end_token is None else end_token)
  batch, length = prompt_BxP.shape
  options = dict(cfg=cfg, max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=int(top_k),
                 top_p=float(top_p))
  if draft is None and (return_stats or fallback_below is not None):
    what = "return_stats=True reports" if return_stats else f"fallback_below={fallback_below!r} applies to"
    raise ValueError(f"{what} speculative decoding; pass a draft (e.g. draft='ngram').")
  if draft is not None:
    draft_tokens = _count("draft_tokens", draft_tokens, 1, MAX_DRAFT_TOKENS)
    if fallback_below is not None and (isinstance(fallback_below, bool) or not isinstance(
        fallback_below, numbers.Real) or not 0 <= fallback_below <= draft_tokens + 1):
      raise ValueError(f"fallback_below={fallback_below!r} must be None or a number in [0, draft_tokens + 1 = "
                       f"{draft_tokens + 1}] (tokens per pass; 0 never falls back).")
  if draft is None or (fallback_below is None and not speculation_pays(batch)):
    check_cache_fits(cfg, batch, max_len_for(cfg, length + max_new_tokens - 1), "max_new_tokens")
    tokens = _generate(unbox_params(params), prompt_BxP, key, end, **options)
    return (tokens, speculative.Stats.plain(tokens, end)) if return_stats else tokens
  fallback_below = FALLBACK_BELOW if fallback_below is None else fallback_below
  check_cache_fits(cfg, batch, max_len_for(cfg, length + max_new_tokens + draft_tokens), "max_new_tokens")
  tokens, stats = speculative.speculate(
      unbox_params(params), None if draft_params is None else unbox_params(draft_params), prompt_BxP, key, end,
      draft=draft, num_draft=draft_tokens, fallback_below=float(fallback_below), warmup=FALLBACK_WARMUP, **options)
  return (tokens, stats) if return_stats else tokens
