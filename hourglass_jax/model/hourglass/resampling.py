"""Hourglass resampling: shift right by k-1, shorten (avg | linear | attention_*), upsample back with "+ r".

A shortened token j summarises shifted positions jk .. jk+k-1, i.e. original stream positions jk-k+1 .. jk, so a
full-resolution position q may use shortened tokens j <= q // k.
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import kv_cache
from hourglass_jax.model.kv_cache import KVCache
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice, check_int
from hourglass_jax.model.layers import (MultiHeadAttention, dense, feed_forward_residual, layer_norm, rematerialised,
                                        stream_positions)
from hourglass_jax.ops.dropout import Dropout

SHORTEN_METHODS = ("avg", "linear", "attention_avg", "attention_linear")
UPSAMPLE_METHODS = ("repeat", "linear", "attention_repeat", "attention_linear", "none")


def shift_right(x_BxLxD, shift: int):
  """k-1 zero vectors in front, the last k-1 dropped."""
  if shift == 0:
    return x_BxLxD
  return jnp.pad(x_BxLxD, ((0, 0), (shift, 0), (0, 0)))[:, :x_BxLxD.shape[1]]


def shorten_mask(length: int, k: int) -> np.ndarray:
  """[L/k, L]: pooled query i may see shifted full-resolution key j when j // k <= i."""
  return np.arange(length)[None, :] // k <= np.arange(length // k)[:, None]


def upsample_mask(length: int, k: int) -> np.ndarray:
  """[L, L/k]: full-resolution query q may see shortened key j when j <= q // k."""
  return np.arange(length // k)[None, :] <= (np.arange(length) // k)[:, None]


class Pool(nn.Module):
  """k consecutive vectors -> one: 'avg' = mean, 'linear' = Dense(d) of their position-major concatenation."""
  cfg: LayerConfig
  k: int
  method: str

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    b, length, d = x_BxLxD.shape
    x_BxLkxKxD = x_BxLxD.reshape(b, length // self.k, self.k, d)
    if self.method == "avg":
      return x_BxLkxKxD.mean(axis=2)
    z_BxLkxD = dense(self.cfg, d, ("mlp", "embed"), "proj")(x_BxLkxKxD.reshape(b, length // self.k, self.k * d))
    return Dropout(self.cfg.dropout)(z_BxLkxD, deterministic=deterministic)


class Unpool(nn.Module):
  """One vector -> k: 'repeat' copies it, 'linear' = Dense(k*d) split position-major."""
  cfg: LayerConfig
  k: int
  method: str

  @nn.compact
  def __call__(self, z_BxLkxD, deterministic: bool):
    if self.method == "repeat":
      return jnp.repeat(z_BxLkxD, self.k, axis=1)
    b, short, d = z_BxLkxD.shape
    u_BxLkxKD = dense(self.cfg, self.k * d, ("embed", "mlp"), "proj")(z_BxLkxD)
    u_BxLkxKD = Dropout(self.cfg.dropout)(u_BxLkxKD, deterministic=deterministic)
    return u_BxLkxKD.reshape(b, short * self.k, d)


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


def _check_resampling(module, methods: tuple[str, ...], length: int | None) -> None:
  """The module's settings, and a full-resolution `length` that factor divides (None: decoding single rows)."""
  name = type(module).__name__
  check_choice(f"{name}.method", module.method, methods)
  check_int(f"{name}.factor", module.factor, 1)
  check_int(f"{name}.outer_factor", module.outer_factor, 1)
  if length is not None and length % module.factor:
    raise ValueError(f"{name}: the full-resolution length {length} is not a multiple of factor={module.factor}; "
                     "pad the sequence at the end (causal-safe) or use the Hourglass body, which pads for you.")


class Shorten(LayerOptions):
  """x [B, L, D] -> z [B, L/factor, D], causal: x is shifted right by factor-1 first, so z[j] summarises
  x[j*factor - factor + 1 .. j*factor]. `method` 'avg' | 'linear' pool each group of `factor` vectors; the
  'attention_*' methods pool queries that way and attend over the shifted stream (then a feed-forward tail).
  `outer_factor` is the input stream's own total shortening (for positions). Block settings: `LayerOptions`.

  Cached decoding (`start` given): x holds the shifted rows of whole segments start, start+1, ... (the caller
  keeps the last factor-1 rows of the stream); `kv` is the attention's K/V cache (None for 'avg' | 'linear');
  returns (z, kv).
  """
  factor: int = 2
  method: str = "attention_avg"
  outer_factor: int = 1

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, kv=None, start=None):
    length = x_BxLxD.shape[1]
    _check_resampling(self, SHORTEN_METHODS, length)
    cfg, k = self.layer_config(x_BxLxD.shape[-1]), self.factor
    cached = start is not None
    h0_BxLxD = x_BxLxD if cached else shift_right(x_BxLxD, k - 1)
    pool_method = self.method.removeprefix("attention_")
    if not self.method.startswith("attention_"):
      z_BxLkxD = Pool(cfg, k, pool_method, name="pool")(h0_BxLxD, deterministic)
      return (z_BxLkxD, kv) if cached else z_BxLkxD
    h_BxLxD = layer_norm(cfg, "input_norm")(h0_BxLxD)
    q_BxLkxD = layer_norm(cfg, "query_norm")(Pool(cfg, k, pool_method, name="pool")(h_BxLxD, deterministic))
    block = attention_residual(cfg, "shorten", k, self.outer_factor, cached)
    return block(q_BxLkxD, h_BxLxD, deterministic, kv, start) if cached else block(q_BxLkxD, h_BxLxD, deterministic)


class Upsample(LayerOptions):
  """Shortened z [B, L/factor, D] and the full-resolution residual r [B, L, D] -> [B, L, D] (includes "+ r").
  Position q reads only z[j] with j <= q // factor. `method` 'repeat' | 'linear' expand each vector to `factor`;
  'attention_*' expand that way and attend over z; 'none' returns r. Block settings: `LayerOptions`.

  Cached decoding (`start` given): r holds stream entries start.., z the shortened tokens from entry `first` (at
  most start // factor) through the last one they read; `kv` is the attention's K/V cache (None otherwise);
  returns (y, kv).
  """
  factor: int = 2
  method: str = "attention_repeat"
  outer_factor: int = 1

  @nn.compact
  def __call__(self, z_BxLkxD, r_BxLxD, deterministic: bool = True, kv=None, start=None, first=None):
    length = r_BxLxD.shape[1]
    cached = start is not None
    _check_resampling(self, UPSAMPLE_METHODS, None if cached else length)
    if not cached and z_BxLkxD.shape[1] * self.factor != length:
      raise ValueError(f"Upsample: z has {z_BxLkxD.shape[1]} positions and r has {length}; with factor="
                       f"{self.factor} z needs {length // self.factor}.")
    if self.method == "none":
      return (r_BxLxD, kv) if cached else r_BxLxD
    cfg, k = self.layer_config(r_BxLxD.shape[-1]), self.factor
    # Cached: z's first token covers entries first * k ..; r's rows start at offset start - first * k of its rows.
    rows = (lambda u: kv_cache.read_rows(u, start - first * k, length)) if cached else (lambda u: u)
    unpool_method = self.method.removeprefix("attention_")
    if not self.method.startswith("attention_"):
      u_BxLxD = rows(Unpool(cfg, k, unpool_method, name="unpool")(z_BxLkxD, deterministic))
      y_BxLxD = layer_norm(cfg, "output_norm")(u_BxLxD) + r_BxLxD
      return (y_BxLxD, kv) if cached else y_BxLxD
    s_BxLkxD = layer_norm(cfg, "input_norm")(z_BxLkxD)
    u_BxLxD = layer_norm(cfg, "query_norm")(rows(Unpool(cfg, k, unpool_method, name="unpool")(s_BxLkxD,
                                                                                              deterministic)))
    u_BxLxD = u_BxLxD + r_BxLxD
    block = attention_residual(cfg, "upsample", k, self.outer_factor, cached)
    if cached:
      y_BxLxD, kv = block(u_BxLxD, s_BxLkxD, deterministic, kv, start, first)
      return layer_norm(cfg, "output_norm")(y_BxLxD) + r_BxLxD, kv
    return layer_norm(cfg, "output_norm")(block(u_BxLxD, s_BxLkxD, deterministic)) + r_BxLxD
