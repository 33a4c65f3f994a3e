"""Incremental decoding of kind='retina' (retina.py): per block, the head group of scale s reads the block's normed
input pooled at scale s, whose token j completes at position j s and is then cached once.

The cache holds, per block (stacked on a leading layer axis, scanned like the blocks' params): `group_<g>` K/V of
head group g (padded max_len / s_g entries) and `buf_<s>` the last k-1 tokens of the next finer pooled stream (the
causal shift). At position t the scales whose factor divides t pool one new token each, nested under lax.cond like
the multi-scale bodies. A decode step reads only the slice of each group's cache its window can reach, so its cost
does not grow with the context beyond the widest window.
"""

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import decode_layers as dl
from hourglass_jax.model.scale_resampling import down_method


def init_state(cfg, batch: int, padded: int):
  scales = cfg.parsed_scales
  block = {f"group_{g}": dl.new_kv(cfg, batch, padded // s, n)
           for g, (s, n) in enumerate(zip(scales.factors, scales.heads))}
  for i, s in enumerate(scales.factors[:-1]):
    block[f"buf_{s}"] = jnp.zeros((batch, scales.relative_factor(i + 1) - 1, cfg.d_model), cfg.compute_dtype)
  num_layers = cfg.parsed_hierarchy.levels[0][0]
  return jax.tree.map(lambda a: jnp.zeros((num_layers, *a.shape), a.dtype), block)


def relative_tables(cfg, body, padded: int):
  return dl.relative_tables(cfg, body, padded, 1, lambda name, f: f)


def _write_group(cfg, p, st, g, x_BxTxD, start):
  pa = p["attention"]
  s = cfg.parsed_scales.factors[g]
  positions_T = (start + jnp.arange(x_BxTxD.shape[1])) * s
  st[f"group_{g}"] = dl.write_kv(cfg, pa[f"key_{g}"], pa[f"value_{g}"], st[f"group_{g}"], x_BxTxD, positions_T,
                                 start)


def _feed(cfg, p, st, i, fine_BxTxD, t):
  """Scale i+1 produced `fine`: pools and caches the scale-i tokens that completed, then feeds scale i-1."""
  scales = cfg.parsed_scales
  s, k = scales.factors[i], scales.relative_factor(i + 1)
  window_BxVxD, st[f"buf_{s}"] = dl.shift_in(st[f"buf_{s}"], fine_BxTxD)

  def active(st):
    st = dict(st)
    count = 1 if t is not None else dl.num_coarse(fine_BxTxD.shape[1], k)
    z_BxTxD = dl.pool(cfg, p.get(f"downsample_{s}"), k, down_method(cfg.downsampler),
                      window_BxVxD[:, :count * k])
    _write_group(cfg, p, st, i, z_BxTxD, 0 if t is None else t // s)
    return st if i == 0 else _feed(cfg, p, st, i - 1, z_BxTxD, t)

  return active(st) if t is None else lax.cond(t % s == 0, active, lambda st: st, st)


def _retina_mask(index_T, first_key, size: int, s: int, start: int, stop: int):
  """retina_mask rows for queries index_T over keys first_key .. first_key+size-1 (key j: tokens js-s+1 .. js)."""
  last_S = (first_key + jnp.arange(size)) * s
  q_Tx1 = index_T[:, None]
  return (last_S <= q_Tx1) & (last_S - s + 1 <= q_Tx1 - start) & (last_S >= q_Tx1 - stop + 1)


def _window(kv, s: int, start: int, stop: int, q):
  """(first key, count, keys) of the cache slice a query at position q can see: at most (stop-start+s-1)/s + 1
  keys, so a decode step reads a window of each cache, however long the context."""
  size = kv["v"].shape[2]
  count = min(size, -(-(stop - start + s - 1) // s) + 1)
  first = jnp.clip(-(-(q - stop + 1) // s), 0, size - count)
  return first, count, {"k": lax.dynamic_slice_in_dim(kv["k"], first, count, axis=3),
                        "v": lax.dynamic_slice_in_dim(kv["v"], first, count, axis=2)}


def _block(cfg, p, st, x_BxTxD, position):
  scales = cfg.parsed_scales
  n = len(scales.factors)
  start = 0 if position is None else position
  index_T = start + jnp.arange(x_BxTxD.shape[1])
  st = dict(st)
  h_BxTxD = dl.ln(cfg, p["attention_norm"], x_BxTxD)
  _write_group(cfg, p, st, n - 1, h_BxTxD, start)
  st = _feed(cfg, p, st, n - 2, h_BxTxD, position)
  kvs, positions_k, masks = [], [], []
  for g, (s, (back_start, back_stop)) in enumerate(zip(scales.factors, scales.windows)):
    kv = st[f"group_{g}"]
    if position is None:
      first, count = 0, kv["v"].shape[2]
    else:
      first, count, kv = _window(kv, s, back_start, back_stop, position)
    kvs.append(kv)
    positions_k.append((first + jnp.arange(count)) * s)
    masks.append(_retina_mask(index_T, first, count, s, back_start, back_stop))
  x_BxTxD = x_BxTxD + dl.attend_groups(cfg, p["attention"], kvs, h_BxTxD, index_T, positions_k, masks,
                                       scales.heads)
  return dl.ffn_residual(cfg, p, x_BxTxD), st


def run(cfg, body, state, x_BxTxD, position=None):
  """Body outputs and cache: prefill of entries 0..T-1 (position None) or one entry at `position`."""
  x_BxTxD, state = lax.scan(lambda x, layer: _block(cfg, *layer, x, position), x_BxTxD, (body["blocks"], state))
  return dl.ln(cfg, body["final_norm"], x_BxTxD), state
