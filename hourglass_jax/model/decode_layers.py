"""Cached building blocks of incremental decoding: K/V caches, attention of new queries against them, decoder
stacks that extend them, causal pooling windows, and relative-position tables computed once per cache.

They apply the model's own sub-modules (layer_norm, dense, FeedForward, Pool, Unpool, apply_rope, sinusoid_table)
to sub-trees of the trained params, so cached results equal `build_model(cfg).apply` position by position.
Cache layout: K [B, heads, head_dim, S] and V [B, heads, S, head_dim], the layouts the attention matmuls read
without a transpose.
"""

import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hourglass_jax.model.layers import FeedForward, dense, layer_norm
from hourglass_jax.model.positions import apply_rope, sinusoid_table
from hourglass_jax.model.resampling import Pool, Unpool

HEADS = ("embed", "heads", "kv")
_GROUP_POSITION = re.compile(r"^position_(\d+)$")


def ln(cfg, p, x):
  return layer_norm(cfg).apply({"params": p}, x)


def project(cfg, p, x_BxTxD):
  """Dense to [B, T, heads, head_dim]; the head count comes from the kernel (a head group has fewer)."""
  heads = p["kernel"].shape[1]
  proj = dense(cfg, (heads, cfg.head_dim), HEADS, "proj", use_bias="bias" in p)
  return proj.apply({"params": p}, x_BxTxD)


def pool(cfg, p, k: int, method: str, h_BxNkxD):
  """Pool 'avg' | 'linear' of each k consecutive vectors (p: the Pool's params, None or {} for avg)."""
  return Pool(cfg, k, method).apply({"params": p or {}}, h_BxNkxD, True)


def unpool(cfg, p, k: int, method: str, z_BxNxD):
  """Unpool 'repeat' | 'linear': each vector -> k rows."""
  return Unpool(cfg, k, method).apply({"params": p or {}}, z_BxNxD, True)


def new_kv(cfg, batch: int, size: int, heads: int | None = None):
  heads = cfg.num_heads if heads is None else heads
  dtype = cfg.compute_dtype
  return {"k": jnp.zeros((batch, heads, cfg.head_dim, size), dtype),
          "v": jnp.zeros((batch, heads, size, cfg.head_dim), dtype)}


def new_stack(cfg, batch: int, num_layers: int, size: int):
  """K/V caches of a scanned stack: the per-block layout with a leading layer axis."""
  return {name: jnp.zeros((num_layers, *a.shape), a.dtype) for name, a in new_kv(cfg, batch, size).items()}


def write_kv(cfg, p_key, p_value, kv, x_BxTxD, positions_T, start, layer=None):
  """Projects keys/values of x (keys rotated at `positions_T`) into the cache at entries start..start+T-1 (of
  layer `layer` of a stacked cache, written in place)."""
  k_BxTxNxH, v_BxTxNxH = project(cfg, p_key, x_BxTxD), project(cfg, p_value, x_BxTxD)
  if cfg.position == "rope":
    k_BxTxNxH = apply_rope(k_BxTxNxH, positions_T, cfg.rope_base)
  new = {"k": jnp.einsum("btnh->bnht", k_BxTxNxH), "v": jnp.einsum("btnh->bnth", v_BxTxNxH)}
  axes = {"k": 3, "v": 2}
  if layer is None:
    put = lambda name: lax.dynamic_update_slice_in_dim(kv[name], new[name].astype(kv[name].dtype), start,
                                                       axes[name])
  else:
    def put(name):  # entries start.. of layer `layer`: index (layer, 0, .., start, ..)
      index = [jnp.asarray(layer, jnp.int32)] + [jnp.zeros((), jnp.int32)] * new[name].ndim
      index[axes[name] + 1] = jnp.asarray(start, jnp.int32)
      return lax.dynamic_update_slice(kv[name], new[name][None].astype(kv[name].dtype), index)
  # The barrier keeps XLA from fusing the update into the attention matmul, which would copy the whole cache.
  return lax.optimization_barrier({name: put(name) for name in ("k", "v")})


def cached_attention(q_BxTxNxH, kv, mask_TxS, bias=None):
  """ops.attention.reference_attention on the cache layouts."""
  logits_BxNxTxS = jnp.einsum("btnh,bnhs->bnts", q_BxTxNxH, kv["k"], preferred_element_type=jnp.float32)
  logits_BxNxTxS = logits_BxNxTxS * q_BxTxNxH.shape[-1] ** -0.5
  if bias is not None:
    logits_BxNxTxS = logits_BxNxTxS + bias
  logits_BxNxTxS = jnp.where(mask_TxS, logits_BxNxTxS, jnp.finfo(jnp.float32).min)
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  return jnp.einsum("bnts,bnsh->btnh", probs_BxNxTxS.astype(kv["v"].dtype), kv["v"])


def _relative_bias(cfg, qv_BxTxNxH, table_NxRxH, positions_q_T, positions_k_S, unit: int):
  """Scaled Transformer-XL position term (q + v) W_r R(q - k) [B, N, T, S] from a table of W_r R(n * unit)."""
  pos_BxNxTxR = jnp.einsum("btnh,nrh->bntr", qv_BxTxNxH, table_NxRxH, preferred_element_type=jnp.float32)
  index_TxS = jnp.clip((positions_q_T[:, None] - positions_k_S[None, :]) // unit, 0, table_NxRxH.shape[1] - 1)
  return jnp.take_along_axis(pos_BxNxTxR, index_TxS[None, None], axis=-1) * (cfg.head_dim ** -0.5)


def _queries(cfg, p, x_BxTxD, positions_q_T):
  q_BxTxNxH = project(cfg, p["query"], x_BxTxD)
  if cfg.position == "rope":
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_q_T, cfg.rope_base)
  return q_BxTxNxH


def _out(cfg, p, out_BxTxNxH):
  out = dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out", in_axes=(-2, -1))
  return out.apply({"params": p["out"]}, out_BxTxNxH)


def attend(cfg, p, kv, x_BxTxD, positions_q_T, positions_k_S, mask_TxS, unit: int):
  """MultiHeadAttention of queries x against the whole cache under `mask_TxS`; distances in multiples of `unit`."""
  q_BxTxNxH = _queries(cfg, p, x_BxTxD, positions_q_T)
  bias = None
  if cfg.position == "relative":
    bias = _relative_bias(cfg, q_BxTxNxH + p["position_bias"].astype(q_BxTxNxH.dtype), p["table"], positions_q_T,
                          positions_k_S, unit)
    q_BxTxNxH = q_BxTxNxH + p["content_bias"].astype(q_BxTxNxH.dtype)
  return _out(cfg, p, cached_attention(q_BxTxNxH, kv, mask_TxS, bias))


def attend_groups(cfg, p, kvs, x_BxTxD, positions_q_T, positions_k, masks, heads):
  """ScaleAttention against cached streams: head group g reads kvs[g] (keys at positions_k[g]) under masks[g]
  [T, S_g]; a query row its mask leaves empty gets zero output from that group. Distances in units of 1."""
  q_BxTxNxH = _queries(cfg, p, x_BxTxD, positions_q_T)
  outs, first = [], 0
  for g, (n, kv, positions_k_S, mask_TxS) in enumerate(zip(heads, kvs, positions_k, masks)):
    q_BxTxnxH = q_BxTxNxH[:, :, first:first + n]
    bias = None
    if cfg.position == "relative":
      u_nxH, v_nxH = p["content_bias"][first:first + n], p["position_bias"][first:first + n]
      bias = _relative_bias(cfg, q_BxTxnxH + v_nxH.astype(q_BxTxnxH.dtype), p[f"table_{g}"], positions_q_T,
                            positions_k_S, 1)
      q_BxTxnxH = q_BxTxnxH + u_nxH.astype(q_BxTxnxH.dtype)
    first += n
    out_BxTxnxH = cached_attention(q_BxTxnxH, kv, mask_TxS, bias)
    seen_T = mask_TxS.any(axis=1)
    outs.append(jnp.where(seen_T[None, :, None, None], out_BxTxnxH, 0.0).astype(out_BxTxnxH.dtype))
  return _out(cfg, p, jnp.concatenate(outs, axis=2))


def ffn_residual(cfg, p, x_BxTxD):
  return x_BxTxD + FeedForward(cfg).apply({"params": p["mlp"]}, ln(cfg, p["mlp_norm"], x_BxTxD), True)


def stack(cfg, p, kv, x_BxTxD, index_T, start, num_layers: int, factor: int):
  """DecoderStack over stream entries index_T (= start + arange(T)) at total factor `factor`, reading and
  extending its stacked K/V cache (one lax.scan over the blocks, as in training); returns (output after the final
  LayerNorm, cache)."""
  if num_layers:
    size = kv["v"].shape[3]
    mask_TxS = jnp.arange(size)[None, :] <= index_T[:, None]

    def block(carry, layer):
      x_BxTxD, kv = carry
      pb, i = layer
      pa = pb["attention"]
      h_BxTxD = ln(cfg, pb["attention_norm"], x_BxTxD)
      kv = write_kv(cfg, pa["key"], pa["value"], kv, h_BxTxD, index_T * factor, start, layer=i)
      kv_i = {name: lax.dynamic_index_in_dim(a, i, 0, keepdims=False) for name, a in kv.items()}
      x_BxTxD = x_BxTxD + attend(cfg, pa, kv_i, h_BxTxD, index_T * factor, jnp.arange(size) * factor, mask_TxS,
                                 factor)
      return (ffn_residual(cfg, pb, x_BxTxD), kv), None

    (x_BxTxD, kv), _ = lax.scan(block, (x_BxTxD, kv), (p["blocks"], jnp.arange(num_layers)))
  return ln(cfg, p["final_norm"], x_BxTxD), kv


def shift_in(buf_BxWxD, new_BxTxD):
  """(window = the last W buffered vectors followed by the new ones, the buffer's next value = its last W)."""
  window_BxVxD = jnp.concatenate([buf_BxWxD, new_BxTxD], axis=1)
  return window_BxVxD, window_BxVxD[:, window_BxVxD.shape[1] - buf_BxWxD.shape[1]:]


def num_coarse(num_fine: int, k: int) -> int:
  """Coarse tokens computable from the first `num_fine` fine tokens: token j needs fine token jk."""
  return (num_fine - 1) // k + 1


def _table(cfg, p_position, distances_R):
  """W_r R(d) for each distance, as [heads, R, head_dim]."""
  r_RxD = sinusoid_table(distances_R, cfg.d_model).astype(cfg.compute_dtype)
  return jnp.swapaxes(project(cfg, p_position, r_RxD), 0, 1)


def relative_tables(cfg, p, padded: int, factor: int, child_factor):
  """Tree mirroring `p` with the relative-position tables of every attention in it: 'table' (one for all heads,
  distances n * factor for n < padded / factor) or 'table_g' (head group g, distances 0 .. padded-1).
  `child_factor(name, factor)` gives the total factor of sub-tree `name`."""
  if "query" in p:
    tables = {}
    for name, sub in p.items():
      match = _GROUP_POSITION.match(name)
      if name == "position":
        tables["table"] = _table(cfg, sub, np.arange(padded // factor) * factor)
      elif match:
        tables[f"table_{match.group(1)}"] = _table(cfg, sub, np.arange(padded))
    return tables
  tables = {}
  for name, sub in p.items():
    if not isinstance(sub, Mapping):
      continue
    if name == "blocks":  # a scanned stack: one table per block, stacked like its params
      found = jax.vmap(lambda block: relative_tables(cfg, block, padded, factor, child_factor))(sub)
    else:
      found = relative_tables(cfg, sub, padded, child_factor(name, factor), child_factor)
    if found:
      tables[name] = found
  return tables


def merge(p, tables):
  """`p` with the tables' leaves added at their places."""
  merged = {name: merge(sub, tables[name]) if name in tables else sub for name, sub in p.items()}
  return merged | {name: value for name, value in tables.items() if name not in p}
