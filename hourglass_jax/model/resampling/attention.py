"""The 'attention_*' methods (the Hourglass paper's attention resampling): a pooling method's output (shortening) or
unpooling's (up-sampling) is the query of an attention over the other resolution, then a feed-forward tail
(`AttentionResidual`). Each keeps its K/V cache in decoding ('short' | 'up').

A shortened token j summarises shifted positions jk .. jk+k-1, i.e. original stream positions jk-k+1 .. jk, so a
full-resolution position q may use shortened tokens j <= q // k (`shorten_mask`, `upsample_mask`).
"""

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import costs, kv_cache
from hourglass_jax.model.kv_cache import KVCache
from hourglass_jax.model.layer_config import LayerConfig
from hourglass_jax.model.layers import (MultiHeadAttention, feed_forward_residual, layer_norm, rematerialised,
                                        stream_positions)
from hourglass_jax.model.resampling.avg import Avg
from hourglass_jax.model.resampling.base import Shortening, Upsampling, register_shortening, register_upsampling
from hourglass_jax.model.resampling.linear import Linear, LinearUp
from hourglass_jax.model.resampling.repeat import Repeat


def shorten_mask(length: int, k: int) -> np.ndarray:
  """[L/k, L]: pooled query i may see shifted full-resolution key j when j // k <= i."""
  return np.arange(length)[None, :] // k <= np.arange(length // k)[:, None]


def upsample_mask(length: int, k: int) -> np.ndarray:
  """[L, L/k]: full-resolution query q may see shortened key j when j <= q // k."""
  return np.arange(length // k)[None, :] <= (np.arange(length) // k)[:, None]


class AttentionResidual(nn.Module):
  """x + drop(Attn(Q=x, K=V=kv)); then x + drop(FFN(LN x)): the tail of attention resampling. `direction`
  'shorten': queries are the L/k pooled tokens over the L shifted keys (`shorten_mask`); 'upsample': the L
  full-resolution queries over the L/k shortened keys (`upsample_mask`). Positions in original-token units.

  Cached (`kv` this attention's K/V cache, `start` the stream entry of x's first row): kv_rows are the new key rows
  ('shorten': k per query, from entry start*k; 'upsample': the shortened tokens x's rows read, from entry `first`);
  returns (y, kv).
  """
  cfg: LayerConfig
  direction: str
  k: int
  outer_factor: int

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD, deterministic: bool, kv=None, start=None, first=None):
    cfg, k, outer = self.cfg, self.k, self.outer_factor
    attention = MultiHeadAttention(cfg, name="attention")
    if kv is not None:
      positions_q, positions_k, mask_TxS, cache = self._cached(kv, start, first, x_BxTxD.shape[1],
                                                               kv_BxSxD.shape[1])
      h_BxTxD, kv = attention(x_BxTxD, kv_BxSxD, positions_q, positions_k, mask_TxS, deterministic, cache)
      return feed_forward_residual(cfg, x_BxTxD, h_BxTxD, deterministic), kv
    if self.direction == "shorten":
      length = kv_BxSxD.shape[1]
      positions_q = stream_positions(length // k, k * outer)
      positions_k = stream_positions(length, outer) - (k - 1) * outer
      mask_TxS = shorten_mask(length, k)
    else:
      length = x_BxTxD.shape[1]
      positions_q, positions_k = stream_positions(length, outer), stream_positions(length // k, k * outer)
      mask_TxS = upsample_mask(length, k)
    h_BxTxD = attention(x_BxTxD, kv_BxSxD, positions_q, positions_k, mask_TxS, deterministic)
    return feed_forward_residual(cfg, x_BxTxD, h_BxTxD, deterministic)

  def _cached(self, kv, start, first, num_queries: int, num_keys: int):
    """(query positions, new key positions, mask over the cache, KVCache): the masks above, row by row."""
    k, outer = self.k, self.outer_factor
    size = kv_cache.size(kv)
    entries_S = jnp.arange(size)
    query_T = kv_cache.entries(start, num_queries)  # [T], or [B, T] for rows at their own entries
    if self.direction == "shorten":  # cache entry m: shifted position m, original position m - k + 1
      first_key = start * k
      positions_S = (entries_S - k + 1) * outer
      return (query_T * k * outer, (kv_cache.entries(first_key, num_keys) - k + 1) * outer,
              entries_S // k <= query_T[..., None], KVCache(kv, first_key, positions_S, outer, size))
    # cache entry j: shortened token j at position j k
    return (query_T * outer, kv_cache.entries(first, num_keys) * k * outer, entries_S <= (query_T // k)[..., None],
            KVCache(kv, first, entries_S * k * outer, outer, size * k))


def attention_residual(cfg: LayerConfig, direction: str, k: int, outer_factor: int, cached: bool = False):
  """The AttentionResidual block of a resampling, named 'resample' (rematerialised per `cfg.remat_policy`, unless
  `cached`: decoding has no backward pass)."""
  block_cls = AttentionResidual if cached else rematerialised(cfg, AttentionResidual, static_argnums=(3,))
  return block_cls(cfg, direction, k, outer_factor, name="resample")


class AttentionShortening(Shortening):
  """'attention_<pooling>': LN the shifted stream ('input_norm'), pool it into queries ('pool', then 'query_norm')
  and attend over the stream ('resample'). Decoding keeps the attention's K/V cache ('short')."""
  pooling: ClassVar[type[Shortening]]

  @classmethod
  def shorten(cls, cfg, k, outer_factor, h0_BxLxD, deterministic, kv=None, start=None):
    h_BxLxD = layer_norm(cfg, "input_norm")(h0_BxLxD)
    q_BxSxD = layer_norm(cfg, "query_norm")(cls.pooling.pool(cfg, k, h_BxLxD, deterministic))
    block = attention_residual(cfg, "shorten", k, outer_factor, cached=start is not None)
    if start is not None:
      return block(q_BxSxD, h_BxLxD, deterministic, kv, start)
    return block(q_BxSxD, h_BxLxD, deterministic), kv

  cache = classmethod(lambda cls, cfg, batch, padded, k: {"short": kv_cache.new_kv(cfg, batch, padded)})

  @classmethod
  def cost(cls, cfg, k: int, length: int) -> tuple[int, int]:
    short = length // k
    pool_p, pool_f = cls.pooling.pool_cost(cfg, k, short)
    tail_p, tail_f = costs.block(cfg, costs.attention(cfg, short, length), short, 3)
    return pool_p + tail_p, pool_f + tail_f


class AttentionUpsampling(Upsampling):
  """'attention_<unpooling>': LN the shortened tokens ('input_norm'), unpool them into queries ('unpool', then
  'query_norm', plus the residual), attend over the tokens ('resample'), LN ('output_norm') and add the residual.
  Decoding keeps the attention's K/V cache ('up')."""
  unpooling: ClassVar[type[Upsampling]]

  @classmethod
  def upsample(cls, cfg, k, outer_factor, z_BxSxD, r_BxLxD, deterministic, rows, kv=None, start=None, first=None):
    s_BxSxD = layer_norm(cfg, "input_norm")(z_BxSxD)
    u_BxLxD = layer_norm(cfg, "query_norm")(rows(cls.unpooling.unpool(cfg, k, s_BxSxD, deterministic)))
    u_BxLxD = u_BxLxD + r_BxLxD
    block = attention_residual(cfg, "upsample", k, outer_factor, cached=start is not None)
    if start is not None:
      y_BxLxD, kv = block(u_BxLxD, s_BxSxD, deterministic, kv, start, first)
    else:
      y_BxLxD = block(u_BxLxD, s_BxSxD, deterministic)
    return layer_norm(cfg, "output_norm")(y_BxLxD) + r_BxLxD, kv

  cache = classmethod(lambda cls, cfg, batch, padded, k: {"up": kv_cache.new_kv(cfg, batch, padded // k)})

  @classmethod
  def cost(cls, cfg, k: int, length: int) -> tuple[int, int]:
    short = length // k
    unpool_p, unpool_f = cls.unpooling.unpool_cost(cfg, k, short)
    tail_p, tail_f = costs.block(cfg, costs.attention(cfg, length, short), length, 3)
    return unpool_p + tail_p + costs.norm(cfg.d_model), unpool_f + tail_f


@register_shortening
class AttentionAvg(AttentionShortening):
  key = "attention_avg"
  pooling = Avg


@register_shortening
class AttentionLinear(AttentionShortening):
  key = "attention_linear"
  pooling = Linear


@register_upsampling
class AttentionRepeat(AttentionUpsampling):
  key = "attention_repeat"
  unpooling = Repeat


@register_upsampling
class AttentionLinearUp(AttentionUpsampling):
  key = "attention_linear"
  unpooling = LinearUp
