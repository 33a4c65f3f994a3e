"""Fingerprints of checkpointed state: each array's bits summed with position weights, on the devices that hold its
shards (no gather, one pass over memory), so a byte changed on disk is noticed when the checkpoint is restored."""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hourglass_jax.runtime import sharding

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}


def _words(x: jax.Array) -> jax.Array:
  """x's bits as uint32 words in x's own shape (8-byte types add a trailing axis of 2)."""
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]).astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
  """The uint32 sum of word_i * (2i + 1) (mod 2**32) over row-major positions i: a changed bit changes it
  wherever it is (odd weights), swapped words almost always do, and random damage goes unnoticed with odds of
  2**-32, as with a CRC32. Integer sums are exact and order-free: the value does not depend on the mesh."""
  words = _words(x)
  index = jnp.zeros(words.shape, jnp.uint32)
  for axis in range(words.ndim):  # row-major position, built per axis so no reshape gathers shards
    stride = int(np.prod(words.shape[axis + 1:], dtype=np.uint64) % 2**32)
    index = index + lax.broadcasted_iota(jnp.uint32, words.shape, axis) * np.uint32(stride)
  return jnp.sum(words * (2 * index + 1), dtype=jnp.uint32)


_fingerprint_tree = jax.jit(lambda tree: jax.tree.map(_fingerprint, tree))


def array_fingerprints(tree) -> dict[str, str]:
  """{'params/.../kernel': 8 hex digits} for every array of `tree` (a train state, on any mesh)."""
  values = sharding.to_host(_fingerprint_tree(tree))
  return {jax.tree_util.keystr(path, simple=True, separator="/"): f"{int(v):08x}"
          for path, v in jax.tree_util.tree_leaves_with_path(values)}


def json_fingerprint(value) -> str:
  """sha256 of a JSON-able value (the data-iterator position), independent of key order."""
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def mismatches(saved: dict[str, str], now: dict[str, str]) -> list[str]:
  """Names of the arrays whose fingerprint differs from (or is missing in) the recorded one."""
  return sorted(name for name in saved.keys() | now.keys() if saved.get(name) != now.get(name))
