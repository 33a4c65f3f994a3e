"""Sampling filters: pure temperature / top-k / top-p (nucleus) filters and draws, shared by plain and speculative
decoding (loop.py) and the drafts that sample (drafts/)."""

import math
import numbers

import jax
import jax.numpy as jnp


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
  return picker(temperature, top_k, top_p)(rng, logits_BxV)[0]


def picker(temperature: float, top_k: int, top_p: float):
  """pick(key, logits [B, V]) -> (tokens [B], the probabilities they were drawn from [B, V]; None when greedy)."""
  if temperature == 0:
    return lambda key, logits_BxV: (jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32), None)

  def pick(key, logits_BxV):
    filtered_BxV = filter_logits(logits_BxV, temperature=temperature, top_k=top_k, top_p=top_p)
    return jax.random.categorical(key, filtered_BxV, axis=-1).astype(jnp.int32), jax.nn.softmax(filtered_BxV, -1)
  return pick
