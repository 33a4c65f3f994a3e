"""Attention whose head groups read different scales: the bottom-up aggregation layer and retina attention.

Keys at cumulative scale s sit at positions js and summarise tokens js-s+1 .. js (see resampling.py).
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.layers import dense, head_attention
from hourglass_jax.model.positions import apply_rope


def retina_visible(q_Tx1, last_1xS, scale: int, start: int, stop: int):
  """Query q sees the scale-s key ending at `last` iff last <= q and one of the tokens last-s+1 .. last is
  start..stop-1 back (NumPy or traced arrays)."""
  return (last_1xS <= q_Tx1) & (last_1xS - scale + 1 <= q_Tx1 - start) & (last_1xS >= q_Tx1 - stop + 1)


def retina_mask(length: int, scale: int, start: int, stop: int) -> np.ndarray:
  """[L, L/s]: `retina_visible` for every query and scale-s key of a length-L sequence."""
  return retina_visible(np.arange(length)[:, None], np.arange(length // scale)[None, :] * scale, scale, start, stop)


class ScaleAttention(nn.Module):
  """Multi-head attention whose head group g (`heads[g]` heads) attends to its own key/value stream.

  Group g reads kv[g] at positions positions_k[g] under the static mask masks[g] [T, S_g]; query rows that a mask
  leaves empty get zero output from that group. Parameters: exactly those of MultiHeadAttention.
  Cached (`caches`: a `kv_cache.KVCache` per group): kvs[g] are group g's new key rows, written into its cache;
  masks[g] [T, cache entries read] may be traced; returns (out, the groups' K/V caches).
  """
  cfg: LayerConfig
  heads: tuple[int, ...]

  @nn.compact
  def __call__(self, x_q_BxTxD, kvs, positions_q_T, positions_k, masks, deterministic: bool, caches=None):
    cfg = self.cfg
    axes = ("embed", "heads", "kv")
    q_BxTxNxH = dense(cfg, (cfg.num_heads, cfg.head_dim), axes, "query")(x_q_BxTxD)
    if cfg.position == "rope":
      q_BxTxNxH = apply_rope(q_BxTxNxH, positions_q_T, cfg.rope_base)
    else:
      zeros = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads", "kv"))
      u_NxH = self.param("content_bias", zeros, (cfg.num_heads, cfg.head_dim))
      v_NxH = self.param("position_bias", zeros, (cfg.num_heads, cfg.head_dim))
    outs, written, first = [], [], 0
    for g, (n, kv_BxSxD, positions_k_S, mask_TxS) in enumerate(zip(self.heads, kvs, positions_k, masks)):
      group = slice(first, first + n)
      first += n
      k_BxSxnxH = dense(cfg, (n, cfg.head_dim), axes, f"key_{g}")(kv_BxSxD)
      v_BxSxnxH = dense(cfg, (n, cfg.head_dim), axes, f"value_{g}")(kv_BxSxD)
      relative = None
      if cfg.position == "rope":
        k_BxSxnxH = apply_rope(k_BxSxnxH, positions_k_S, cfg.rope_base)
      else:
        relative = u_NxH[group], v_NxH[group], dense(cfg, (n, cfg.head_dim), axes, f"position_{g}", use_bias=False)
      cache = None if caches is None else caches[g]
      empty_T = ~mask_TxS.any(axis=1)
      if cache is None and empty_T.any():  # any allowed key keeps the softmax finite; the output is then zeroed
        mask_TxS = mask_TxS | (empty_T[:, None] & (np.arange(mask_TxS.shape[1]) == 0)[None, :])
      out_BxTxnxH, kv = head_attention(self, cfg, q_BxTxNxH[:, :, group], k_BxSxnxH, v_BxSxnxH, positions_q_T,
                                       positions_k_S, mask_TxS, deterministic, relative, cache, f"table_{g}")
      if cache is not None or empty_T.any():  # a traced mask (cached) may leave rows empty too
        out_BxTxnxH = jnp.where(empty_T[None, :, None, None], 0.0, out_BxTxnxH).astype(out_BxTxnxH.dtype)
      outs.append(out_BxTxnxH)
      written.append(kv)
    out_BxTxNxH = jnp.concatenate(outs, axis=2)
    out_BxTxD = dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out", in_axes=(-2, -1))(out_BxTxNxH)
    return out_BxTxD if caches is None else (out_BxTxD, written)
