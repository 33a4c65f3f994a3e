"""Caches of incremental decoding: K/V caches, in the layouts the attention matmuls read without a transpose:
K [B, heads, head_dim, S] and V [B, heads, S, head_dim] (a scanned stack adds a leading layer axis).

Attention (layers.head_attention) takes a `KVCache` in place of its full key stream (MultiHeadAttention is given
one, ScaleAttention makes one per head group): it writes the new rows' keys and values and attends over its entries.
A pooled stream is kept whole (`new_stream`, with the causal shift's zero rows in front), so every cache is indexed
by position: a cache extended past t holds what it held at t in its entries before t, and decoding can go back to
any earlier position by passing it (the entries past it are overwritten as they are fed again).

Rows may sit at their own positions: every start here is one entry for all rows (an int or int scalar) or int [B],
each row its own. Writes and reads then go row by row by position (a scatter or gather over the batch axis), and
masks and positions gain a leading batch axis ([B, T, S], [B, T]), in one batched program.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from hourglass_jax.model.positions import sinusoid_table


class KVCache(NamedTuple):
  """A cache being extended by one attention call.

  kv: {'k', 'v'} arrays (with a leading layer axis when `layer` is given: the entry of that layer is written in
  place); start: the entry of the call's first new key row (scalar, or [B]); positions_S: the original-token
  positions of all S entries ([S], or [B, S] with a window per row); unit: the spacing of query-key distances
  (relative positions: the table holds W_r R(n * unit) for n < num_distances); window: (first entry, count) to
  attend over only that slice (first scalar or [B]; positions_S and the mask then describe the slice).
  """
  kv: dict
  start: Any
  positions_S: Any
  unit: int = 1
  num_distances: int = 0
  layer: Any = None
  window: tuple | None = None


def new_kv(cfg, batch: int, size: int, heads: int | None = None) -> dict:
  heads = cfg.num_heads if heads is None else heads
  return {"k": jnp.zeros((batch, heads, cfg.head_dim, size), cfg.compute_dtype),
          "v": jnp.zeros((batch, heads, size, cfg.head_dim), cfg.compute_dtype)}


def new_stack(cfg, batch: int, num_layers: int, size: int) -> dict:
  """Caches of a scanned stack: the per-block layout with a leading layer axis."""
  return {name: jnp.zeros((num_layers, *a.shape), a.dtype) for name, a in new_kv(cfg, batch, size).items()}


def size(kv: dict) -> int:
  return kv["v"].shape[-2]


_ENTRY_AXIS = {"k": 3, "v": 2}


def per_row(update, array, start):
  """`update(array, start)` with one start for every row, or row by row (a vmap over the batch axis, 0) for int [B],
  `update` then seeing one row without its batch axis."""
  return update(array, start) if not jnp.ndim(start) else jax.vmap(update)(array, start)


def entries(start, count: int):
  """The entries of `count` rows from `start`: [count], or [B, count] for int [B]."""
  return jnp.asarray(start)[..., None] + jnp.arange(count) if jnp.ndim(start) else start + jnp.arange(count)


def out_of_range(start, count: int, size: int):
  """Whether rows start .. start+count-1 leave a stream of `size` entries (a bool, or [B])."""
  return (start < 0) | (start + count > size)


def batch_mask(mask_TxS):
  """A mask [T, S] or per row [B, T, S] as attention logits [B, N, T, S] take it."""
  return mask_TxS if mask_TxS.ndim == 2 else mask_TxS[:, None]


def scatter_rows(store, rows_BxTx, first_B, entry_axis: int, lead=()):
  """`store` with each row b's T new entries rows_BxTx[b] at entries first_B[b].. of `entry_axis`, in place: one
  scatter (sorted, unique, in bounds), its update laid out [B, T, the other axes in order]. `lead`: indices of axes
  in front of the batch axis (a stacked cache's layer)."""
  batch, num = rows_BxTx.shape[:2]
  b_BxT = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, num))
  index = [slice(None)] * (store.ndim - len(lead))
  index[0], index[entry_axis - len(lead)] = b_BxT, first_B[:, None] + jnp.arange(num)[None]
  return store.at[(*lead, *index)].set(rows_BxTx.astype(store.dtype), indices_are_sorted=True, unique_indices=True,
                                       mode="promise_in_bounds")


def write(cache: KVCache, k_BxTxNxH, v_BxTxNxH) -> dict:
  """`cache.kv` with the new keys/values at entries start..start+T-1 (of layer `cache.layer`, in place; start one
  entry for every row, or [B])."""
  kv, lead = cache.kv, () if cache.layer is None else (jnp.asarray(cache.layer, jnp.int32),)
  batch, num = k_BxTxNxH.shape[:2]
  if jnp.ndim(cache.start) or num > 1:  # one scatter each: XLA:CPU copied the cache for a several-entry update slice
    new, start_B = {"k": k_BxTxNxH, "v": v_BxTxNxH}, jnp.broadcast_to(cache.start, (batch,))
    put = lambda name: scatter_rows(kv[name], new[name], start_B, _ENTRY_AXIS[name] + len(lead), lead)
  else:
    new = {"k": jnp.einsum("btnh->bnht", k_BxTxNxH), "v": jnp.einsum("btnh->bnth", v_BxTxNxH)}

    def put(name):  # entries start.. (of layer `layer`: index (layer, 0, .., start, ..))
      index = [*lead] + [jnp.zeros((), jnp.int32)] * new[name].ndim
      index[_ENTRY_AXIS[name] + len(lead)] = jnp.asarray(cache.start, jnp.int32)
      return lax.dynamic_update_slice(kv[name], new[name][(None,) * len(lead)].astype(kv[name].dtype), index)
  # The barrier keeps XLA from fusing the update into the attention matmul, which would copy the whole cache.
  return lax.optimization_barrier({name: put(name) for name in ("k", "v")})


def view(cache: KVCache, kv: dict) -> dict:
  """The entries of `kv` (cache.kv written) that the queries attend over: one layer of a stacked cache, or the
  window (each row's own, for a start per row)."""
  if cache.layer is not None:
    kv = {name: lax.dynamic_index_in_dim(a, cache.layer, 0, keepdims=False) for name, a in kv.items()}
  if cache.window is not None:
    first, count = cache.window
    rows = jnp.ndim(first) > 0
    kv = {name: per_row(lambda a, f: lax.dynamic_slice_in_dim(a, f, count, axis=_ENTRY_AXIS[name] - rows), a, first)
          for name, a in kv.items()}
  return kv


def attend(q_BxTxNxH, kv: dict, mask_TxS, bias=None):
  """ops.attention.reference_attention on the cache layouts; `mask_TxS` may be traced, and per row [B, T, S]."""
  logits_BxNxTxS = jnp.einsum("btnh,bnhs->bnts", q_BxTxNxH, kv["k"], preferred_element_type=jnp.float32)
  logits_BxNxTxS = logits_BxNxTxS * q_BxTxNxH.shape[-1] ** -0.5
  if bias is not None:
    logits_BxNxTxS = logits_BxNxTxS + bias
  logits_BxNxTxS = jnp.where(batch_mask(mask_TxS), logits_BxNxTxS, jnp.finfo(jnp.float32).min)
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  return jnp.einsum("bnts,bnsh->btnh", probs_BxNxTxS.astype(kv["v"].dtype), kv["v"])


def relative_table(cfg, project, cache: KVCache):
  """W_r R(n * unit) for n < num_distances as [heads, R, head_dim] (`project`: the attention's 'position' Dense)."""
  r_RxD = sinusoid_table(jnp.arange(cache.num_distances) * cache.unit, cfg.d_model).astype(cfg.compute_dtype)
  return jnp.swapaxes(project(r_RxD), 0, 1)


def relative_bias(cfg, qv_BxTxNxH, table_NxRxH, positions_q_T, cache: KVCache):
  """Scaled Transformer-XL position term (q + v) W_r R(q - k) [B, N, T, S] against every cache entry (query and
  entry positions [T] and [S], or per row [B, T] and [B, S])."""
  pos_BxNxTxR = jnp.einsum("btnh,nrh->bntr", qv_BxTxNxH, table_NxRxH, preferred_element_type=jnp.float32)
  index_TxS = jnp.clip((positions_q_T[..., :, None] - cache.positions_S[..., None, :]) // cache.unit, 0,
                       table_NxRxH.shape[1] - 1)
  index_BxNxTxS = index_TxS[None, None] if index_TxS.ndim == 2 else index_TxS[:, None]
  return jnp.take_along_axis(pos_BxNxTxR, index_BxNxTxS, axis=-1) * (cfg.head_dim ** -0.5)


def new_stream(cfg, batch: int, size: int, lead: int = 0):
  """A stream store: `size` rows [B, lead + size, D] of zeros, entry m at row lead + m (`lead` zero rows in front
  are the causal shift of a pooled stream: a window of k rows ending at entry m starts at row m)."""
  return jnp.zeros((batch, lead + size, cfg.d_model), cfg.compute_dtype)


def write_rows(store_BxSx, rows_BxTx, first):
  """`store` [B, S, ...] with rows_BxTx at entries first.. (first + T <= S: dynamic_update_slice would clamp
  otherwise; first scalar, or [B] each row its own)."""
  if not jnp.ndim(first):
    return lax.dynamic_update_slice_in_dim(store_BxSx, rows_BxTx.astype(store_BxSx.dtype), first, 1)
  return scatter_rows(store_BxSx, rows_BxTx, first, 1)


def read_rows(store_BxSx, first, count: int):
  """`count` entries of `store` [B, S, ...] from first (scalar, or [B] each row its own)."""
  if not jnp.ndim(first):
    return lax.dynamic_slice_in_dim(store_BxSx, first, count, 1)
  return jax.vmap(lambda a, f: lax.dynamic_slice_in_dim(a, f, count, 0))(store_BxSx, first)


def read_row(store_BxSx, index):
  """Entry `index` of `store` [B, S, ...], as [B, ...] (index scalar, or [B] each row its own)."""
  if not jnp.ndim(index):
    return lax.dynamic_index_in_dim(store_BxSx, index, 1, keepdims=False)
  return jax.vmap(lambda a, i: lax.dynamic_index_in_dim(a, i, 0, keepdims=False))(store_BxSx, index)


class Coarse(NamedTuple):
  """The coarse tokens that fine entries start .. start+T-1 complete (token j, pooling fine entries jk-k+1 .. jk,
  completes at jk): `count` (static) tokens from `first`, clamped so that first + count <= size (the tokens before
  the first new one are recomputed from the stored stream then: the same values); `any_new`: whether one completes
  (a Python bool where it is known statically, else a traced one)."""
  first: Any
  count: int
  any_new: Any


def coarse_tokens(start, length: int, k: int, size: int) -> Coarse:
  """`Coarse` for fine entries start .. start+length-1 (start an int, or traced: a scalar, or [B] each row its own,
  then `first` is [B] and `any_new` whether any row completes one: rows that complete none compute the token they
  have begun, at entries no position reads before it is computed again) and a coarse stream of `size`."""
  count = min(size, -(-length // k))
  if isinstance(start, int):
    first_new = -(-start // k)
    return Coarse(min(first_new, size - count), count, (start + length - 1) // k >= first_new)
  first_new = -(-start // k)
  any_new = True if length >= k else jnp.any((start + length - 1) // k >= first_new)
  return Coarse(jnp.minimum(first_new, size - count), count, any_new)


def coarse_read(start, length: int, k: int, size: int):
  """(first, count): the coarse tokens that fine entries start .. start+length-1 read (token q // k for entry q),
  clamped into the stream of `size`."""
  count = min(size, (length + k - 2) // k + 1)
  return (min(start // k, size - count) if isinstance(start, int) else jnp.minimum(start // k, size - count)), count


def num_coarse(num_fine: int, k: int) -> int:
  """Coarse tokens computable from the first `num_fine` fine tokens: token j needs fine token jk."""
  return (num_fine - 1) // k + 1
