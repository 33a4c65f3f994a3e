"""Attention whose head groups read different scales: the bottom-up aggregation layer and retina attention.

Keys at cumulative scale s sit at positions js and summarise tokens js-s+1 .. js (see resampling.py).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import kv_cache
from hourglass_jax.model.kv_cache import KVCache
from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.layers import dense, head_attention, stream_positions
from hourglass_jax.model.multiscale.scales import MultiScale
from hourglass_jax.model.positions import apply_rope


def retina_visible(q_Tx1, last_1xS, scale: int, start: int, stop: int):
  """Query q sees the scale-s key ending at `last` iff last <= q and one of the tokens last-s+1 .. last is
  start..stop-1 back (NumPy or traced arrays)."""
  return (last_1xS <= q_Tx1) & (last_1xS - scale + 1 <= q_Tx1 - start) & (last_1xS >= q_Tx1 - stop + 1)


def retina_mask(length: int, scale: int, start: int, stop: int) -> np.ndarray:
  """[L, L/s]: `retina_visible` for every query and scale-s key of a length-L sequence."""
  return retina_visible(np.arange(length)[:, None], np.arange(length // scale)[None, :] * scale, scale, start, stop)


def _window(size: int, s: int, start: int, stop: int, q, num_queries: int = 1):
  """(first entry, count) of the scale-s keys the queries at positions q .. q+num_queries-1 can see: at most
  (stop-start+s-1)/s + 1 for one query, (num_queries - 1)/s + 1 more for each further one."""
  count = min(size, -(-(stop - start + s - 1) // s) + 1 + -(-(num_queries - 1) // s))
  return jnp.clip(-(-(q - stop + 1) // s), 0, size - count), count


class ScaleAttention(nn.Module):
  """Multi-head attention whose head group g (`scales.heads[g]` heads) attends to its own key/value stream kvs[g],
  the tokens of scale s = scales.factors[g] (at positions 0, s, 2s...), from the scale-1 queries x_q: every past
  key, or (retina) those within the group's window scales.windows[g]. Query rows a group sees nothing of get zero
  output from it. Parameters: exactly those of MultiHeadAttention.
  Cached (`caches`: the groups' K/V caches; `position` None for a prompt's rows at positions 0.., else that of the
  first row, one for every row or int [B]): kvs[g] are group g's tokens from its entry firsts[g], written into its
  cache; rows past a prompt attend over only the entries their windows can reach. Returns (out, the groups' K/V
  caches).
  """
  cfg: LayerConfig
  scales: MultiScale

  @nn.compact
  def __call__(self, x_q_BxTxD, kvs, deterministic: bool, caches=None, position=None, firsts=None):
    cfg, scales = self.cfg, self.scales
    axes = ("embed", "heads", "kv")
    length = x_q_BxTxD.shape[1]
    start = 0 if position is None else position
    positions_q_T = stream_positions(length, 1) if caches is None else kv_cache.entries(start, length)  # or [B, T]
    q_BxTxNxH = dense(cfg, (cfg.num_heads, cfg.head_dim), axes, "query")(x_q_BxTxD)
    if cfg.position == "rope":
      q_BxTxNxH = apply_rope(q_BxTxNxH, positions_q_T, cfg.rope_base)
    else:
      zeros = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads", "kv"))
      u_NxH = self.param("content_bias", zeros, (cfg.num_heads, cfg.head_dim))
      v_NxH = self.param("position_bias", zeros, (cfg.num_heads, cfg.head_dim))
    outs, written, first = [], [], 0
    for g, (n, s, kv_BxSxD) in enumerate(zip(scales.heads, scales.factors, kvs)):
      group = slice(first, first + n)
      first += n
      cache = None
      if caches is None:
        back_start, back_stop = scales.windows[g] if scales.windows else (0, length)
        mask_TxS = retina_mask(length, s, back_start, back_stop)
        positions_k_S = stream_positions(length // s, s)
      else:
        size, first_new = kv_cache.size(caches[g]), firsts[g]
        back_start, back_stop = scales.windows[g] if scales.windows else (0, size * s)
        window = None if position is None or not scales.windows else _window(size, s, back_start, back_stop, position,
                                                                             length)
        first_entry, count = (0, size) if window is None else window
        last_S = kv_cache.entries(first_entry, count) * s  # [S], or [B, S] per row
        cache = KVCache(caches[g], first_new, last_S, 1, size * s, window=window)
        mask_TxS = retina_visible(positions_q_T[..., :, None], last_S[..., None, :], s, back_start, back_stop)
        positions_k_S = kv_cache.entries(first_new, kv_BxSxD.shape[1]) * s
      k_BxSxnxH = dense(cfg, (n, cfg.head_dim), axes, f"key_{g}")(kv_BxSxD)
      v_BxSxnxH = dense(cfg, (n, cfg.head_dim), axes, f"value_{g}")(kv_BxSxD)
      relative = None
      if cfg.position == "rope":
        k_BxSxnxH = apply_rope(k_BxSxnxH, positions_k_S, cfg.rope_base)
      else:
        relative = u_NxH[group], v_NxH[group], dense(cfg, (n, cfg.head_dim), axes, f"position_{g}", use_bias=False)
      empty_T = ~mask_TxS.any(axis=-1)
      if cache is None and empty_T.any():  # any allowed key keeps the softmax finite; the output is then zeroed
        mask_TxS = mask_TxS | (empty_T[:, None] & (np.arange(mask_TxS.shape[1]) == 0)[None, :])
      out_BxTxnxH, kv = head_attention(self, cfg, q_BxTxNxH[:, :, group], k_BxSxnxH, v_BxSxnxH, positions_q_T,
                                       positions_k_S, mask_TxS, deterministic, relative, cache, f"table_{g}")
      if cache is not None or empty_T.any():  # a traced mask (cached) may leave rows empty too
        out_BxTxnxH = jnp.where(empty_T[..., None, None], 0.0, out_BxTxnxH).astype(out_BxTxnxH.dtype)
      outs.append(out_BxTxnxH)
      written.append(kv)
    out_BxTxNxH = jnp.concatenate(outs, axis=2)
    out_BxTxD = dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out", in_axes=(-2, -1))(out_BxTxNxH)
    return out_BxTxD if caches is None else (out_BxTxD, written)
