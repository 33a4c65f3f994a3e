"""Incremental decoding of kind='topdown' and 'bottomup' (multiscale.py): a coarse scale advances only when its
next token becomes computable.

Scale i (cumulative factor s_i, coarse to fine; k = s_{i-1} / s_i between scales i-1 and i) holds token j at
position j s_i, computable once position j s_i has been fed. So at stream position t the scales whose factor divides
t advance by one token, and they are nested: scale i-1 runs under lax.cond(t % s_{i-1} == 0) inside the branch of
scale i. The cache holds, per scale:
  scale_<s>  K/V of the scale's decoder stack (padded max_len / s entries).
  buf_<s>    the last k-1 tokens of the finer stream that scale s pools (zeros before the start): with the finer
             stream's newest token they are the window of the next scale-s token (the causal shift of k-1).
  rows_<s>   (top-down) the k up-sampled rows of the newest scale-s output; finer token m reads row m % k.
  aggregate_<g> (bottom-up) K/V of the aggregation layer's head group g: the scale-s stack outputs, and at
             scale 1 the layer's normed input.
"""

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import decode_layers as dl
from hourglass_jax.model.layers import dense
from hourglass_jax.model.scale_resampling import down_method, up_method


def _positions(start, length: int):
  return start + jnp.arange(length)


def init_state(cfg, batch: int, padded: int):
  """Empty caches for `batch` sequences of `padded` (a multiple of the coarsest scale) positions."""
  scales = cfg.parsed_scales
  factors, dtype = scales.factors, cfg.compute_dtype
  st = {}
  for i, s in enumerate(factors):
    if cfg.kind == "topdown" or i < len(factors) - 1:
      st[f"scale_{s}"] = dl.new_stack(cfg, batch, scales.layers[i], padded // s)
    if i < len(factors) - 1:
      k = scales.relative_factor(i + 1)
      st[f"buf_{s}"] = jnp.zeros((batch, k - 1, cfg.d_model), dtype)
      if cfg.kind == "topdown":
        st[f"rows_{s}"] = jnp.zeros((batch, k, cfg.d_model), dtype)
  if cfg.kind == "bottomup":
    st["scale_1"] = dl.new_stack(cfg, batch, scales.layers[-1], padded)
    for g, (s, n) in enumerate(zip(factors, scales.heads)):
      st[f"aggregate_{g}"] = dl.new_kv(cfg, batch, padded // s, n)
  return st


def relative_tables(cfg, body, padded: int):
  scale_factor = lambda name, f: int(name.removeprefix("scale_")) if name.startswith("scale_") else f
  return dl.relative_tables(cfg, body, padded, 1, scale_factor)


def _stack(cfg, p, st, i, x_BxTxD, start):
  """Scale i's decoder stack on its tokens start .. start+T-1."""
  s = cfg.parsed_scales.factors[i]
  index_T = _positions(start, x_BxTxD.shape[1])
  out, st[f"scale_{s}"] = dl.stack(cfg, p[f"scale_{s}"], st[f"scale_{s}"], x_BxTxD, index_T, start,
                                   cfg.parsed_scales.layers[i], s)
  return out


def _merge(cfg, p, s, e_BxTxD, u_BxTxD):
  merge = dense(cfg, cfg.d_model, ("mlp", "embed"), "merge")
  h_BxTxD = merge.apply({"params": p[f"merge_{s}"]}, jnp.concatenate([e_BxTxD, u_BxTxD], axis=-1))
  return nn.gelu(h_BxTxD, approximate=True)


# Top-down -------------------------------------------------------------------------------------------------------

def _topdown_prefill(cfg, p, st, x_BxTxD):
  scales = cfg.parsed_scales
  factors = scales.factors
  e = {len(factors) - 1: x_BxTxD}  # pyramid of pooled embeddings, fine to coarse
  for i in range(len(factors) - 2, -1, -1):
    k = scales.relative_factor(i + 1)
    window_BxVxD, st[f"buf_{factors[i]}"] = dl.shift_in(st[f"buf_{factors[i]}"], e[i + 1])
    count = dl.num_coarse(e[i + 1].shape[1], k)
    e[i] = dl.pool(cfg, p.get(f"downsample_{factors[i]}"), k, down_method(cfg.downsampler),
                   window_BxVxD[:, :count * k])
  z_BxTxD = _stack(cfg, p, st, 0, e[0], 0)
  for i in range(1, len(factors)):
    k, coarse = scales.relative_factor(i), factors[i - 1]
    rows_BxRxD = dl.unpool(cfg, p.get(f"upsample_{coarse}"), k, up_method(cfg.upsampler), z_BxTxD)
    st[f"rows_{coarse}"] = rows_BxRxD[:, -k:]
    h_BxTxD = _merge(cfg, p, factors[i], e[i], rows_BxRxD[:, :e[i].shape[1]])
    z_BxTxD = _stack(cfg, p, st, i, h_BxTxD, 0)
  return z_BxTxD, st


def _topdown_scale(cfg, p, st, i, e_Bx1xD, t):
  """Scale i at stream position t (a multiple of its factor): pools upward, runs the coarser scales whose token
  completes at t, then this scale's stack; returns (its output [B, 1, D], cache)."""
  scales = cfg.parsed_scales
  s = scales.factors[i]
  j = t // s
  if i == 0:
    return _stack(cfg, p, st, 0, e_Bx1xD, j), st
  k, coarse = scales.relative_factor(i), scales.factors[i - 1]
  window_BxKxD, st[f"buf_{coarse}"] = dl.shift_in(st[f"buf_{coarse}"], e_Bx1xD)

  def coarser(st):
    st = dict(st)
    e_c = dl.pool(cfg, p.get(f"downsample_{coarse}"), k, down_method(cfg.downsampler), window_BxKxD)
    z_c, st = _topdown_scale(cfg, p, st, i - 1, e_c, t)
    st[f"rows_{coarse}"] = dl.unpool(cfg, p.get(f"upsample_{coarse}"), k, up_method(cfg.upsampler), z_c)
    return st

  st = lax.cond(t % coarse == 0, coarser, lambda st: st, st)
  u_Bx1xD = lax.dynamic_slice_in_dim(st[f"rows_{coarse}"], j % k, 1, axis=1)
  return _stack(cfg, p, st, i, _merge(cfg, p, s, e_Bx1xD, u_Bx1xD), j), st


# Bottom-up ------------------------------------------------------------------------------------------------------

def _write_group(cfg, p, st, g, x_BxTxD, start):
  s = cfg.parsed_scales.factors[g]
  pa = p["aggregate"]["attention"]
  st[f"aggregate_{g}"] = dl.write_kv(cfg, pa[f"key_{g}"], pa[f"value_{g}"], st[f"aggregate_{g}"], x_BxTxD,
                                     _positions(start, x_BxTxD.shape[1]) * s, start)


def _bottomup_feed(cfg, p, st, i, fine_BxTxD, t):
  """The finer stream (scale i+1) produced `fine` (its tokens up to position t, or the prompt's): pools scale i's
  tokens that completed, runs its stack, caches them for the aggregation, and feeds scale i-1 in turn."""
  scales = cfg.parsed_scales
  s, k = scales.factors[i], scales.relative_factor(i + 1)
  window_BxVxD, st[f"buf_{s}"] = dl.shift_in(st[f"buf_{s}"], fine_BxTxD)

  def active(st):
    st = dict(st)
    count = 1 if t is not None else dl.num_coarse(fine_BxTxD.shape[1], k)
    z_BxTxD = dl.pool(cfg, p.get(f"downsample_{s}"), k, down_method(cfg.downsampler),
                      window_BxVxD[:, :count * k])
    start = 0 if t is None else t // s
    o_BxTxD = _stack(cfg, p, st, i, z_BxTxD, start)
    _write_group(cfg, p, st, i, o_BxTxD, start)
    return st if i == 0 else _bottomup_feed(cfg, p, st, i - 1, o_BxTxD, t)

  return active(st) if t is None else lax.cond(t % s == 0, active, lambda st: st, st)


def _bottomup(cfg, p, st, x_BxTxD, position):
  scales = cfg.parsed_scales
  factors, n = scales.factors, len(scales.factors)
  start = 0 if position is None else position
  index_T = _positions(start, x_BxTxD.shape[1])
  st = _bottomup_feed(cfg, p, st, n - 2, x_BxTxD, position)
  pb = p["aggregate"]
  h_BxTxD = dl.ln(cfg, pb["attention_norm"], x_BxTxD)
  _write_group(cfg, p, st, n - 1, h_BxTxD, start)
  kvs = [st[f"aggregate_{g}"] for g in range(n)]
  positions_k = [jnp.arange(kv["v"].shape[2]) * s for kv, s in zip(kvs, factors)]
  masks = [jnp.arange(kv["v"].shape[2])[None, :] <= (index_T // s)[:, None] for kv, s in zip(kvs, factors)]
  x_BxTxD = x_BxTxD + dl.attend_groups(cfg, pb["attention"], kvs, h_BxTxD, index_T, positions_k, masks,
                                       scales.heads)
  x_BxTxD = dl.ffn_residual(cfg, pb, x_BxTxD)
  return _stack(cfg, p, st, n - 1, x_BxTxD, start), st


def run(cfg, body, state, x_BxTxD, position=None):
  """Body outputs and cache: prefill of entries 0..T-1 (position None) or one entry at `position`."""
  st = dict(state)
  if cfg.kind == "bottomup":
    return _bottomup(cfg, body, st, x_BxTxD, position)
  if position is None:
    return _topdown_prefill(cfg, body, st, x_BxTxD)
  return _topdown_scale(cfg, body, st, len(cfg.parsed_scales.factors) - 1, x_BxTxD, position)
