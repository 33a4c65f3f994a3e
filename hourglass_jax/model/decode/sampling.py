"""Sampling: pure temperature / top-k / top-p (nucleus) filters and draws, and `generate`, the cached decode loop."""

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model.checks import check_tokens
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode.steps import decode_step, prefill, unbox_params


def check_sampling(temperature, top_k, top_p) -> None:
  """Raises ValueError naming the first setting out of range (what hourglass-sample refuses too)."""
  if not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) or temperature < 0:
    raise ValueError(f"temperature={temperature!r} must be a finite number >= 0 (0 = greedy).")
  if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
    raise ValueError(f"top_k={top_k!r} must be an integer >= 0 (0 = all tokens).")
  if not isinstance(top_p, numbers.Real) or not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p!r} must be in (0, 1] (1 = all tokens).")


def apply_temperature(logits_BxV, temperature: float):
  """Logits divided by `temperature` (> 0)."""
  if not temperature > 0 or not math.isfinite(temperature):
    raise ValueError(f"temperature={temperature!r} must be finite and > 0 here; temperature 0 means greedy (argmax).")
  return logits_BxV.astype(jnp.float32) / temperature


def top_k_filter(logits_BxV, top_k: int):
  """Keeps the `top_k` largest logits of each row (ties with the k-th are kept too); the rest become -inf.

  top_k 0 or >= vocab keeps everything; a negative top_k raises ValueError.
  """
  if top_k < 0:
    raise ValueError(f"top_k={top_k!r} must be >= 0 (0 = all tokens).")
  if top_k == 0 or top_k >= logits_BxV.shape[-1]:
    return logits_BxV
  kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][..., -1:]
  return jnp.where(logits_BxV < kth_Bx1, -jnp.inf, logits_BxV)


def top_p_filter(logits_BxV, top_p: float):
  """Nucleus filtering: keeps the smallest set of most likely tokens whose probability mass reaches `top_p`.

  A token is kept when the mass of the tokens more likely than it is < top_p (the most likely token always is).
  top_p >= 1 keeps everything.
  """
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p!r} must be in (0, 1].")
  if top_p >= 1.0:
    return logits_BxV
  sorted_BxV = jnp.sort(logits_BxV, axis=-1)[..., ::-1]
  probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
  before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
  keep_BxV = before_BxV < top_p
  threshold_Bx1 = jnp.min(jnp.where(keep_BxV, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits_BxV < threshold_Bx1, -jnp.inf, logits_BxV)


def filter_logits(logits_BxV, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
  """Temperature, then top-k, then top-p; returns float32 logits with filtered-out entries at -inf."""
  logits_BxV = apply_temperature(logits_BxV, temperature)
  return top_p_filter(top_k_filter(logits_BxV, top_k), top_p)


def sample_logits(rng, logits_BxV, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
  """One token per row [B] (int32): argmax when temperature == 0, else a draw from the filtered distribution."""
  if temperature == 0:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  filtered_BxV = filter_logits(logits_BxV, temperature=temperature, top_k=top_k, top_p=top_p)
  return jax.random.categorical(rng, filtered_BxV, axis=-1).astype(jnp.int32)


def cache_length(cfg: ModelConfig, needed: int) -> int:
  """The max_len `generate` gives its cache for `needed` positions: `needed`, raised for a retina model whose
  widest window starts at or beyond it (the heads of such a window would never see a token, which init_cache
  refuses; the positions past `needed` are never fed)."""
  if cfg.kind == "retina":
    needed = max([needed] + [start + 1 for start, _ in cfg.parsed_scales.windows])
  return needed


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "temperature", "top_k", "top_p"))
def _generate(params, prompt_BxP, rng, end_token, cfg, max_new_tokens, temperature, top_k, top_p):
  """`end_token` < 0: no end token. Traced, so stopping rules share one compiled program."""
  batch, length = prompt_BxP.shape
  cache, logits_BxV = prefill(params, cfg, prompt_BxP, cache_length(cfg, length + max_new_tokens - 1))
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


def generate(params, cfg: ModelConfig, prompt_BxP, *, max_new_tokens: int, rng, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, end_token: int | None = None):
  """Samples `max_new_tokens` tokens after each prompt row with the cache; returns them, int32 [B, max_new_tokens].

  One jit-compiled program: a parallel prefill, then a lax.while_loop of decode steps that stops once every row
  has produced `end_token` (later entries of a finished row are `end_token`) or after `max_new_tokens`. The cache
  holds `cache_length(cfg, P + max_new_tokens - 1)` positions.
  temperature 0 is greedy; top_k 0 and top_p 1 disable those filters; a temperature that is negative or not finite,
  a negative top_k or a top_p outside (0, 1] raises ValueError (`check_sampling`). `rng` is a PRNG key or an int seed;
  the prompt needs >= 1 token (no BOS convention). A prompt id outside [0, vocab) raises ValueError; when the
  prompt is traced (generate under your own jit), that row comes back as -1 everywhere.
  """
  prompt_BxP = jnp.asarray(check_tokens(prompt_BxP, cfg.vocab_size, "prompt"), jnp.int32)
  if prompt_BxP.shape[1] < 1:
    raise ValueError(f"generate needs prompts [batch, length >= 1], got shape {prompt_BxP.shape}: this model has "
                     "no BOS convention, so start from at least one real token (e.g. a newline byte).")
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an integer >= 1.")
  check_sampling(temperature, top_k, top_p)
  if end_token is not None and not 0 <= end_token < cfg.vocab_size:
    raise ValueError(f"end_token={end_token!r} is outside the vocabulary [0, {cfg.vocab_size}).")
  rng = rng if isinstance(rng, jax.Array) else jax.random.key(int(rng))
  end = jnp.int32(-1 if end_token is None else end_token)
  return _generate(unbox_params(params), prompt_BxP, rng, end, cfg, max_new_tokens, float(temperature), int(top_k),
                   float(top_p))
