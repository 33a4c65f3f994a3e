"""Positions in original-token units: rotary embeddings and Transformer-XL relative-position tables."""

import jax.numpy as jnp
import numpy as np


def apply_rope(x_BxTxNxH, positions_T, base: float = 10_000.0):
  """Rotates channel pairs (first half, second half) of every head by angle position * base^(-2i/H); positions [T],
  or [B, T] per row."""
  half = x_BxTxNxH.shape[-1] // 2
  inv_freq_F = base ** (-np.arange(half, dtype=np.float32) / half)
  angle_TxF = jnp.asarray(positions_T, jnp.float32)[..., None] * inv_freq_F  # or [B, T, F]: rows' own positions
  # Angles in float32 (positions reach thousands); the rotation itself in x's dtype, as the matmuls around it.
  sin, cos = (f(angle_TxF).astype(x_BxTxNxH.dtype)[..., None, :] for f in (jnp.sin, jnp.cos))
  x1, x2 = jnp.split(x_BxTxNxH, 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def sinusoid_table(distances_R, d_model: int):
  """Transformer-XL sinusoids [R, d_model] = [sin(d * f), cos(d * f)], f = 10000^(-2i/d_model)."""
  inv_freq_F = 1.0 / (10_000.0 ** (np.arange(0, d_model, 2, dtype=np.float32) / d_model))
  angle_RxF = jnp.asarray(distances_R, jnp.float32)[:, None] * inv_freq_F[None, :]
  return jnp.concatenate([jnp.sin(angle_RxF), jnp.cos(angle_RxF)], axis=-1)


def relative_distance_index(positions_q_T, positions_k_S, mask_TxS):
  """Static table of query-key distances: (distinct distances [R], index [T, S] into them).

  Only allowed (mask True) pairs need a distance; masked pairs point at the nearest valid row.
  """
  dist_TxS = np.asarray(positions_q_T)[:, None] - np.asarray(positions_k_S)[None, :]
  allowed = dist_TxS[mask_TxS] if mask_TxS is not None else dist_TxS.ravel()
  unit = int(np.gcd.reduce(np.abs(allowed))) or 1
  lo, hi = int(allowed.min()) // unit, int(allowed.max()) // unit
  distances_R = np.arange(lo, hi + 1) * unit
  index_TxS = np.clip(dist_TxS // unit - lo, 0, hi - lo)
  return distances_R, index_TxS
