"""Checks of token and position inputs, shared by the forward pass and cached decoding.

Shapes and dtypes are static, so they are always checked. Values are checked on the host where they are concrete
(NumPy, lists, jax arrays outside jit): an id outside [0, vocab) raises ValueError. Under jit the values are
unknown, so the model marks the damage instead: a row holding such an id gets NaN logits in every position (a
gather would otherwise read NaN for ids >= vocab and wrap negative ids around). A train step is always traced and
pays only an elementwise compare and select, fused into the embedding.
"""

import jax
import jax.numpy as jnp
import numpy as np


def is_checkable(x) -> bool:
  """Whether x's values can be read on this host: not traced, and (for a jax array) all shards are local."""
  return not isinstance(x, jax.core.Tracer) and getattr(x, "is_fully_addressable", True)


def check_tokens(tokens, vocab_size: int, name: str, layout: str = "[batch, length]"):
  """Returns tokens as an array after checking rank, integer dtype and (when concrete) the range [0, vocab)."""
  if not isinstance(tokens, jax.Array):
    tokens = np.asarray(tokens)
  ndim = layout.count(",") + 1
  if tokens.ndim != ndim:
    fix = "add a batch axis, e.g. tokens[None]" if tokens.ndim == ndim - 1 else "pass one integer id per position"
    raise ValueError(f"{name} must be a {ndim}-D array {layout} of token ids, got shape {tuple(tokens.shape)}; {fix}.")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}; convert with "
                     f".astype('int32').")
  if is_checkable(tokens) and tokens.size:
    values = np.asarray(tokens)
    low, high = values.min(), values.max()
    if low < 0 or high >= vocab_size:
      raise ValueError(f"{name} holds token id {low if low < 0 else high}, outside the vocabulary [0, {vocab_size}); "
                       "map ids into range or build the model with a larger model.vocab_size.")
  return tokens


def nan_rows_with_bad_ids(x_BxTxD, tokens_BxT, vocab_size: int):
  """x with every row that holds an id outside [0, vocab) set to NaN, where the ids could not be checked."""
  if is_checkable(tokens_BxT):
    return x_BxTxD  # check_tokens has already seen these values
  bad_Bx1x1 = jnp.any((tokens_BxT < 0) | (tokens_BxT >= vocab_size), axis=1)[:, None, None]
  return jnp.where(bad_Bx1x1, jnp.nan, x_BxTxD)
