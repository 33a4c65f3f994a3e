"""Helpers for checking models, shared by this project's tests and usable in yours."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


# What modules sow during a call (auxiliary losses, metrics): outputs, not variables to draw.
SOWN_COLLECTIONS = ("losses", "metrics", "intermediates")


@functools.lru_cache(maxsize=64)
def variable_shapes(module, shape: tuple, dtype) -> dict:
  """The shapes of `module`'s variables for inputs of `shape` and `dtype` (traced once per module and input)."""
  shapes = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct(shape, dtype))
  return {name: tree for name, tree in shapes.items() if name not in SOWN_COLLECTIONS}


def random_variables(module, tokens_BxL, seed: int = 0, scale: float = 0.3):
  """Variables of `module` filled with N(0, scale^2) draws, without compiling its init (fast for small tests)."""
  key = (module, tuple(tokens_BxL.shape), jnp.dtype(tokens_BxL.dtype))
  try:
    shapes = variable_shapes(*key)
  except TypeError:  # a module with unhashable fields cannot key the cache: traced on each call
    shapes = variable_shapes.__wrapped__(*key)
  rng = np.random.default_rng(seed)

  def draw(leaf):
    value = rng.normal(size=leaf.shape).astype(np.float32) * scale
    return jnp.asarray(value, leaf.dtype)

  return jax.tree.map(draw, shapes)


def perturbation_logits(apply_fn, length: int, vocab_size: int, seed: int = 0, batch_size: int | None = None):
  """Logits for a random sequence (row 0) and for copies with token p changed (row p + 1), for every p.

  `batch_size` (>= length + 1) pads the batch with copies of row 0, so calls at several lengths share shapes.
  """
  rng = np.random.default_rng(seed)
  base_L = rng.integers(0, vocab_size, size=length)
  tokens = np.tile(base_L, (max(batch_size or 0, length + 1), 1))
  for p in range(length):
    tokens[p + 1, p] = (base_L[p] + rng.integers(1, vocab_size)) % vocab_size
  return np.asarray(apply_fn(jnp.asarray(tokens, jnp.int32)), np.float64)


def causality_violations(apply_fn, length: int, vocab_size: int, atol: float = 1e-5, seed: int = 0,
                         batch_size: int | None = None):
  """Checks logits[t] depend only on tokens[:t+1] by perturbing every position p in turn.

  Returns a list of messages: positions p whose change moved logits before p by more than `atol`, or moved
  no logits at or after p at all. An empty list means the model is exactly causal on this input.
  """
  logits = perturbation_logits(apply_fn, length, vocab_size, seed, batch_size)
  problems = []
  for p in range(length):
    delta_LxV = np.abs(logits[p + 1] - logits[0])
    past = delta_LxV[:p].max() if p else 0.0
    if past > atol:
      first = int(np.argmax(delta_LxV[:p].max(axis=-1) > atol))
      problems.append(f"changing token {p} moved logits at position {first} by {past:.3g} (future leak)")
    if delta_LxV[p:].max() <= atol:
      problems.append(f"changing token {p} changed no logits at positions >= {p} (input ignored)")
  return problems
