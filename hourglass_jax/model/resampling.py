"""Hourglass resampling: shift right by k-1, shorten (avg | linear | attention_*), upsample back with "+ r".

A shortened token j summarises shifted positions jk .. jk+k-1, i.e. original stream positions jk-k+1 .. jk, so a
full-resolution position q may use shortened tokens j <= q // k.
"""

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.layers import FeedForward, MultiHeadAttention, dense, layer_norm, stream_positions


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
  cfg: ModelConfig
  k: int
  method: str

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    b, length, d = x_BxLxD.shape
    x_BxLkxKxD = x_BxLxD.reshape(b, length // self.k, self.k, d)
    if self.method == "avg":
      return x_BxLkxKxD.mean(axis=2)
    z_BxLkxD = dense(self.cfg, d, ("mlp", "embed"), "proj")(x_BxLkxKxD.reshape(b, length // self.k, self.k * d))
    return nn.Dropout(self.cfg.dropout)(z_BxLkxD, deterministic=deterministic)


class Unpool(nn.Module):
  """One vector -> k: 'repeat' copies it, 'linear' = Dense(k*d) split position-major."""
  cfg: ModelConfig
  k: int
  method: str

  @nn.compact
  def __call__(self, z_BxLkxD, deterministic: bool):
    if self.method == "repeat":
      return jnp.repeat(z_BxLkxD, self.k, axis=1)
    b, short, d = z_BxLkxD.shape
    u_BxLkxKD = dense(self.cfg, self.k * d, ("embed", "mlp"), "proj")(z_BxLkxD)
    u_BxLkxKD = nn.Dropout(self.cfg.dropout)(u_BxLkxKD, deterministic=deterministic)
    return u_BxLkxKD.reshape(b, short * self.k, d)


class AttentionResidual(nn.Module):
  """x + drop(Attn(Q=x, K=V=kv)); then x + drop(FFN(LN x)). The tail of attention resampling."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, kv_BxSxD, positions_q, positions_k, mask_TxS, deterministic: bool):
    cfg = self.cfg
    h_BxTxD = MultiHeadAttention(cfg, name="attention")(x_BxTxD, kv_BxSxD, positions_q, positions_k, mask_TxS,
                                                        deterministic)
    x_BxTxD = x_BxTxD + nn.Dropout(cfg.dropout)(h_BxTxD, deterministic=deterministic)
    h_BxTxD = FeedForward(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x_BxTxD), deterministic)
    return x_BxTxD + nn.Dropout(cfg.dropout)(h_BxTxD, deterministic=deterministic)


class Shorten(nn.Module):
  """Shifted stream h0 [B, L, D] at total factor `outer_factor` -> z [B, L/k, D]."""
  cfg: ModelConfig
  k: int
  outer_factor: int

  @nn.compact
  def __call__(self, h0_BxLxD, deterministic: bool):
    cfg, k = self.cfg, self.k
    method = cfg.shorten.removeprefix("attention_")
    if not cfg.shorten.startswith("attention_"):
      return Pool(cfg, k, method, name="pool")(h0_BxLxD, deterministic)
    length = h0_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "input_norm")(h0_BxLxD)
    q_BxLkxD = layer_norm(cfg, "query_norm")(Pool(cfg, k, method, name="pool")(h_BxLxD, deterministic))
    positions_q = stream_positions(length // k, k * self.outer_factor)
    positions_k = stream_positions(length, self.outer_factor) - (k - 1) * self.outer_factor
    return AttentionResidual(cfg, name="resample")(q_BxLkxD, h_BxLxD, positions_q, positions_k,
                                                   shorten_mask(length, k), deterministic)


class Upsample(nn.Module):
  """Shortened output z [B, L/k, D] and unshifted residual r [B, L, D] -> [B, L, D] (includes "+ r")."""
  cfg: ModelConfig
  k: int
  outer_factor: int

  @nn.compact
  def __call__(self, z_BxLkxD, r_BxLxD, deterministic: bool):
    cfg, k = self.cfg, self.k
    if cfg.upsample == "none":
      return r_BxLxD
    method = cfg.upsample.removeprefix("attention_")
    if not cfg.upsample.startswith("attention_"):
      u_BxLxD = Unpool(cfg, k, method, name="unpool")(z_BxLkxD, deterministic)
      return layer_norm(cfg, "output_norm")(u_BxLxD) + r_BxLxD
    length = r_BxLxD.shape[1]
    s_BxLkxD = layer_norm(cfg, "input_norm")(z_BxLkxD)
    u_BxLxD = layer_norm(cfg, "query_norm")(Unpool(cfg, k, method, name="unpool")(s_BxLkxD, deterministic))
    u_BxLxD = u_BxLxD + r_BxLxD
    positions_q = stream_positions(length, self.outer_factor)
    positions_k = stream_positions(length // k, k * self.outer_factor)
    y_BxLxD = AttentionResidual(cfg, name="resample")(u_BxLxD, s_BxLkxD, positions_q, positions_k,
                                                      upsample_mask(length, k), deterministic)
    return layer_norm(cfg, "output_norm")(y_BxLxD) + r_BxLxD
