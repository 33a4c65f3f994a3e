"""Fingerprints of checkpointed state: each array's bits summed with position weights, on the devices that hold its
shards (no gather, one pass over memory), so a byte changed on disk is noticed when the checkpoint is restored."""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hourglass_jax import sharding

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
_GOLDEN = np.uint32(0x9E3779B1)  # an odd multiplier that scatters positions for the second sum


def _words(x: jax.Array) -> jax.Array:
  """x's bits as uint32 words in x's own shape (8-byte types add a trailing axis of 2)."""
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize]).astype(jnp.uint32)


def _fingerprint(x: jax.Array) -> jax.Array:
  """Two uint32 sums of word_i * odd_i (mod 2**32): any single changed bit changes both, whatever its position.
  Integer sums are exact and order-free, so the value does not depend on the mesh the array is sharded over."""
  words = _words(x)
  index = jnp.zeros(words.shape, jnp.uint32)
  for axis, size in enumerate(words.shape):  # row-major position, built per axis so no reshape gathers shards
    stride = int(np.prod(words.shape[axis + 1:], dtype=np.uint64) % 2**32)
    index = index + lax.broadcasted_iota(jnp.uint32, words.shape, axis) * np.uint32(stride)
  plain = jnp.sum(words * (2 * index + 1), dtype=jnp.uint32)
  scattered = jnp.sum(words * ((index * _GOLDEN) | 1), dtype=jnp.uint32)
  return jnp.stack([plain, scattered])


_fingerprint_tree = jax.jit(lambda tree: jax.tree.map(_fingerprint, tree))


def array_fingerprints(tree) -> dict[str, str]:
  """{'params/.../kernel': 16 hex digits} for every array of `tree` (a train state, on any mesh)."""
  values = sharding.to_host(_fingerprint_tree(tree))
  return {jax.tree_util.keystr(path, simple=True, separator="/"): f"{int(v[0]):08x}{int(v[1]):08x}"
          for path, v in jax.tree_util.tree_leaves_with_path(values)}


def json_fingerprint(value) -> str:
  """sha256 of a JSON-able value (the data-iterator position), independent of key order."""
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def mismatches(saved: dict[str, str], now: dict[str, str]) -> list[str]:
  """Names of the arrays whose fingerprint differs from (or is missing in) the recorded one."""
  return sorted(name for name in saved.keys() | now.keys() if saved.get(name) != now.get(name))
