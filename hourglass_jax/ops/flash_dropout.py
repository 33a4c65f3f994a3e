"""Flash attention with in-kernel probability dropout: a Pallas kernel, Triton on a GPU, the Pallas interpreter
(`interpret=True`) on a CPU.

cuDNN's fused attention takes no dropout, so the paper's settings (attention dropout 0.2) fell back to the einsum
path. Here the keep mask is the counter hash of ops/dropout.keep_mask over [B, N, T, S]: element (b, n, t, s) keeps
when mix32(mix32(s ^ s0) ^ mix32(((b N + n) T + t) ^ s1)) < 2^32 (1 - rate), computed per tile in the kernel and
recomputed in the backward kernels, so no [B, N, T, S] array is ever stored; given the same rng the mask is
reference_attention's. Forward: one program per (query block, batch, head) runs the online softmax over the key
blocks its static mask allows and keeps the base-2 log-sum-exp. Backward: one kernel per key block for dK and dV,
one per query block for dQ (so queries and keys may differ in length, as in the shortening / upsampling attention).

Masks are static (numpy, True = may attend) or None; a causal square mask is computed in the kernel, any other is
read per tile as int8. Lengths are padded to the block sizes and head sizes to a power of two, both internally.
"""

import contextlib
import contextvars
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from hourglass_jax.ops.dropout import mix32



class Blocks(NamedTuple):
  """Tile sizes of the three kernels (forward: queries x keys; dK/dV: the queries stepped through per key block;
  dQ: the keys stepped through per query block) and Triton's warps and pipeline stages."""
  q: int
  k: int
  dkv_q: int
  dkv_k: int
  dq_q: int
  dq_k: int
  warps: int = 4
  fwd_stages: int = 2
  bwd_stages: int = 2


# Per GPU generation (compute capability major), from the public Triton flash-attention kernels. Ampere: JAX's
# Pallas GPU flash attention (jax/experimental/pallas/ops/gpu/attention.py, BlockSizes.get_default: forward 128 x
# 128, backward 32 x 32, 4 warps at head size <= 64, 2 stages). Hopper: that forward, and the backward of Triton's
# fused-attention tutorial (python/tutorials/06-fused-attention.py: dK/dV for 128 keys in steps of 32 queries, dQ
# for 128 queries in steps of 32 keys, 4 warps, 5 stages). Others (and the interpreter): the first, untuned setting.
BLOCKS = {8: Blocks(128, 128, 32, 32, 32, 32), 9: Blocks(128, 128, 32, 128, 128, 32, bwd_stages=5)}
DEFAULT_BLOCKS = Blocks(64, 64, 32, 32, 32, 32)
MIN_BLOCK = 16  # Triton's smallest dot
MAX_PADDING = 1 / 8  # a block this much larger than the padded length it tiles is halved (down to 64)
_MASKED = -0.7 * float(np.finfo(np.float32).max)
_LOG2E = math.log2(math.e)


def is_causal(mask_TxS) -> bool:
  """Whether the mask is a static (numpy) causal square."""
  return (isinstance(mask_TxS, np.ndarray) and mask_TxS.ndim == 2 and mask_TxS.shape[0] == mask_TxS.shape[1]
          and bool(np.array_equal(mask_TxS, np.tril(np.ones(mask_TxS.shape, bool)))))


_CHOSEN = contextvars.ContextVar("flash_blocks", default=None)


@contextlib.contextmanager
def use_blocks(blocks: Blocks):
  """Traces in this context (this thread) tile with `blocks` instead of `device_blocks()`'s row, e.g. to compile for
  a GPU that is described, not attached, or to time another setting."""
  token = _CHOSEN.set(blocks)
  try:
    yield
  finally:
    _CHOSEN.reset(token)


def device_blocks() -> Blocks:
  """`use_blocks`' setting, else `BLOCKS`' row for the first device's compute capability (`DEFAULT_BLOCKS` off a
  GPU or for another generation)."""
  if _CHOSEN.get() is not None:
    return _CHOSEN.get()
  device = jax.devices()[0]
  capability = str(getattr(device, "compute_capability", "")) if device.platform == "gpu" else ""
  major = capability.split(".")[0]
  return BLOCKS.get(int(major), DEFAULT_BLOCKS) if major.isdigit() else DEFAULT_BLOCKS


def _block(size: int, n: int) -> int:
  """`size`, at most n's power of two, halved while padding n to it would waste more than MAX_PADDING of n."""
  size = max(MIN_BLOCK, min(size, pl.next_power_of_2(n)))
  while size > 64 and -n % size > n * MAX_PADDING:
    size //= 2
  return size


def _ranges(mask, rows: int, cols: int, along_rows: bool):
  """[lo, hi) of the column blocks (along_rows) or row blocks each row (column) block must visit, as int32 arrays
  padded to a power of two (Triton's block shapes)."""
  tiles = mask.reshape(mask.shape[0] // rows, rows, mask.shape[1] // cols, cols).any(axis=(1, 3))
  tiles = tiles if along_rows else tiles.T
  any_ = tiles.any(axis=1)
  lo = np.where(any_, tiles.argmax(axis=1), 0)
  hi = np.where(any_, tiles.shape[1] - tiles[:, ::-1].argmax(axis=1), 0)
  n = pl.next_power_of_2(len(lo))
  pad = lambda x: np.pad(x.astype(np.int32), (0, n - len(x)))
  return pad(lo), pad(hi)


class _Spec:
  """The static facts of one call: sizes, blocks, padded mask, tile ranges."""

  def __init__(self, q_shape, s: int, mask_TxS, rate: float, blocks: Blocks, heads_total: int):
    self.b, self.t, self.n, self.h = q_shape
    self.heads_total = heads_total  # of the whole array, when this call sees one shard of it
    self.s, self.rate = s, rate
    self.hp = max(MIN_BLOCK, pl.next_power_of_2(self.h))
    self.warps, self.fwd_stages, self.bwd_stages = blocks.warps, blocks.fwd_stages, blocks.bwd_stages
    self.bq, self.bk = _block(blocks.q, self.t), _block(blocks.k, s)
    self.dkv_q, self.dkv_k = _block(blocks.dkv_q, self.t), _block(blocks.dkv_k, s)
    self.dq_q, self.dq_k = _block(blocks.dq_q, self.t), _block(blocks.dq_k, s)
    step_t, step_s = max(self.bq, self.dkv_q, self.dq_q), max(self.bk, self.dkv_k, self.dq_k)
    self.tp, self.sp = -(-self.t // step_t) * step_t, -(-s // step_s) * step_s
    self.causal = is_causal(mask_TxS)
    full = np.zeros((self.tp, self.sp), bool)
    if self.causal:
      full = np.tril(np.ones((self.tp, self.sp), bool))  # padded keys come after every real query
    elif mask_TxS is None:
      full[:, :s] = True
    else:
      full[:self.t, :s] = mask_TxS
    self.tiled = not self.causal and not full.all()
    self.mask = full.astype(np.int8) if self.tiled else None
    self.fwd = _ranges(full, self.bq, self.bk, along_rows=True)
    self.dq = _ranges(full, self.dq_q, self.dq_k, along_rows=True)
    self.dkv = _ranges(full, self.dkv_q, self.dkv_k, along_rows=False)
    self.scale = self.h ** -0.5
    self.threshold = np.uint32(min(round(2 ** 32 * (1.0 - rate)), 2 ** 32 - 1))


def _allowed(spec: _Spec, mask_ref, q0, k0, rows: int, cols: int):
  """The tile's mask (bool [rows, cols]), or None where every pair may attend."""
  if spec.causal:
    return (q0 + jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 0)
            >= k0 + jax.lax.broadcasted_iota(jnp.int32, (rows, cols), 1))
  if spec.tiled:
    return mask_ref[pl.ds(q0, rows), pl.ds(k0, cols)] != 0
  return None


def _keep(spec: _Spec, seeds_ref, b, n, q0, k0, rows: int, cols: int):
  """ops/dropout.keep_mask's bits for the tile at (q0, k0) of head (b, n) of this shard, whose first batch row
  and head in the whole array are seeds_ref[2] and seeds_ref[3]."""
  b_global = b.astype(jnp.uint32) + seeds_ref[2]
  n_global = n.astype(jnp.uint32) + seeds_ref[3]
  row0 = (b_global * jnp.uint32(spec.heads_total) + n_global) * jnp.uint32(spec.t) + q0.astype(jnp.uint32)
  # Rows and columns hashed as [rows, 1] and [1, cols] vectors: one mix32 per element of the tile, not three.
  row = mix32((row0 + jax.lax.broadcasted_iota(jnp.uint32, (rows, 1), 0)) ^ seeds_ref[1])
  col = mix32((k0.astype(jnp.uint32) + jax.lax.broadcasted_iota(jnp.uint32, (1, cols), 1)) ^ seeds_ref[0])
  return mix32(col ^ row) < spec.threshold


def _dot(a, b, trans_a=False, trans_b=False):
  dims = (((0,) if trans_a else (1,)), ((1,) if trans_b else (0,)))
  return jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32)


def _probs(spec, mask_ref, q, k, lse, q0, k0, rows, cols):
  """Normalised probabilities of a tile from the saved base-2 log-sum-exp."""
  qk = _dot(q, k, trans_b=True) * (spec.scale * _LOG2E)
  p = jnp.exp2(qk - lse[:, None])
  allowed = _allowed(spec, mask_ref, q0, k0, rows, cols)
  return p if allowed is None else jnp.where(allowed, p, 0.0)


def _forward_kernel(seeds_ref, lo_ref, hi_ref, mask_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, spec: _Spec):
  i, b, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk = spec.bq, spec.bk
  q0 = i * bq
  q = q_ref[...]

  def body(j, carry):
    o, m, l = carry
    k0 = j * bk
    k, v = k_ref[pl.ds(k0, bk), :], v_ref[pl.ds(k0, bk), :]
    qk = _dot(q, k, trans_b=True) * (spec.scale * _LOG2E)
    allowed = _allowed(spec, mask_ref, q0, k0, bq, bk)
    if allowed is not None:
      qk = jnp.where(allowed, qk, _MASKED)
    m_next = jnp.maximum(m, qk.max(axis=-1))
    p = jnp.exp2(qk - m_next[:, None])
    if allowed is not None:
      p = jnp.where(allowed, p, 0.0)
    correction = jnp.exp2(m - m_next)
    l = correction * l + p.sum(axis=-1)
    if spec.rate:
      p = jnp.where(_keep(spec, seeds_ref, b, n, q0, k0, bq, bk), p, 0.0)
    o = correction[:, None] * o + _dot(p.astype(v.dtype), v)
    return o, m_next, l

  init = (jnp.zeros((bq, spec.hp), jnp.float32), jnp.full((bq,), _MASKED, jnp.float32), jnp.zeros((bq,), jnp.float32))
  o, m, l = jax.lax.fori_loop(lo_ref[i], hi_ref[i], body, init)
  seen = l > 0.0  # a padded query row may see no key
  l = jnp.where(seen, l, 1.0)
  o_ref[...] = (o * (1.0 / (1.0 - spec.rate)) / l[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log2(l), 0.0)


def _dkv_kernel(seeds_ref, lo_ref, hi_ref, mask_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref,
                dv_ref, *, spec: _Spec):
  b, n, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk = spec.dkv_q, spec.dkv_k
  k0 = j * bk
  k, v = k_ref[...], v_ref[...]

  def body(i, carry):
    dk, dv = carry
    q0 = i * bq
    q, do = q_ref[pl.ds(q0, bq), :], do_ref[pl.ds(q0, bq), :]
    p = _probs(spec, mask_ref, q, k, lse_ref[pl.ds(q0, bq)], q0, k0, bq, bk)
    dp = _dot(do, v, trans_b=True)
    if spec.rate:
      keep = _keep(spec, seeds_ref, b, n, q0, k0, bq, bk)
      dv = dv + _dot(jnp.where(keep, p, 0.0).astype(do.dtype), do, trans_a=True) * (1.0 / (1.0 - spec.rate))
      dp = jnp.where(keep, dp, 0.0) * (1.0 / (1.0 - spec.rate))
    else:
      dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
    ds = p * (dp - delta_ref[pl.ds(q0, bq)][:, None]) * spec.scale
    dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
    return dk, dv

  zeros = jnp.zeros((bk, spec.hp), jnp.float32)
  dk, dv = jax.lax.fori_loop(lo_ref[j], hi_ref[j], body, (zeros, zeros))
  dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)


def _dq_kernel(seeds_ref, lo_ref, hi_ref, mask_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *,
               spec: _Spec):
  i, b, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk = spec.dq_q, spec.dq_k
  q0 = i * bq
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

  def body(j, dq):
    k0 = j * bk
    k, v = k_ref[pl.ds(k0, bk), :], v_ref[pl.ds(k0, bk), :]
    p = _probs(spec, mask_ref, q, k, lse, q0, k0, bq, bk)
    dp = _dot(do, v, trans_b=True)
    if spec.rate:
      dp = jnp.where(_keep(spec, seeds_ref, b, n, q0, k0, bq, bk), dp, 0.0) * (1.0 / (1.0 - spec.rate))
    ds = p * (dp - delta[:, None]) * spec.scale
    return dq + _dot(ds.astype(k.dtype), k)

  dq = jax.lax.fori_loop(lo_ref[i], hi_ref[i], body, jnp.zeros((bq, spec.hp), jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _call(kernel, spec: _Spec, grid, in_specs, out_specs, out_shape, ranges, interpret, name, stages, *args):
  """pallas_call with the shared leading inputs (seeds, tile ranges, int8 mask) prepended."""
  from jax.experimental.pallas import triton as plgpu

  whole = lambda x: pl.BlockSpec(x.shape, lambda *_: (0,) * x.ndim)
  mask = jnp.asarray(spec.mask) if spec.tiled else jnp.zeros((MIN_BLOCK, MIN_BLOCK), jnp.int8)
  lo, hi = (jnp.asarray(r) for r in ranges)
  seeds = args[0]
  lead = [whole(seeds), whole(lo), whole(hi), whole(mask)]
  return pl.pallas_call(
      functools.partial(kernel, spec=spec), grid=grid, in_specs=lead + in_specs, out_specs=out_specs,
      out_shape=out_shape, interpret=interpret, name=name,
      compiler_params=plgpu.CompilerParams(num_warps=spec.warps, num_stages=stages),
  )(seeds, lo, hi, mask, *args[1:])


def _rows(block: int, hp: int, order):
  """BlockSpec of [B, L, N, H] arrays: `block` rows of one head (padded to `hp`), placed by the grid map `order`."""
  return pl.BlockSpec((None, block, None, hp), order)


def _forward(spec: _Spec, interpret: bool, q, k, v, seeds):
  grid = (spec.tp // spec.bq, spec.b, spec.n)
  return _call(
      _forward_kernel, spec, grid,
      [_rows(spec.bq, spec.hp, lambda i, b, n: (b, i, n, 0)),
       _rows(spec.sp, spec.hp, lambda i, b, n: (b, 0, n, 0)), _rows(spec.sp, spec.hp, lambda i, b, n: (b, 0, n, 0))],
      [_rows(spec.bq, spec.hp, lambda i, b, n: (b, i, n, 0)),
       pl.BlockSpec((None, None, spec.bq), lambda i, b, n: (b, n, i))],
      [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((spec.b, spec.n, spec.tp), jnp.float32)],
      spec.fwd, interpret, "flash_dropout_forward", spec.fwd_stages, seeds, q, k, v)


def _backward(spec: _Spec, interpret: bool, q, k, v, seeds, out, lse, d_out):
  delta = jnp.einsum("btnh,btnh->bnt", out.astype(jnp.float32), d_out.astype(jnp.float32))
  whole_q, whole_k = (_rows(n, spec.hp, lambda b, h, j: (b, 0, h, 0)) for n in (spec.tp, spec.sp))
  whole_t = pl.BlockSpec((None, None, spec.tp), lambda b, h, j: (b, h, 0))
  k_block = _rows(spec.dkv_k, spec.hp, lambda b, h, j: (b, j, h, 0))
  dk, dv = _call(
      _dkv_kernel, spec, (spec.b, spec.n, spec.sp // spec.dkv_k),
      [whole_q, k_block, k_block, whole_q, whole_t, whole_t], [k_block, k_block],
      [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      spec.dkv, interpret, "flash_dropout_dkv", spec.bwd_stages, seeds, q, k, v, d_out, lse, delta)
  q_block = _rows(spec.dq_q, spec.hp, lambda i, b, h: (b, i, h, 0))
  whole_k = _rows(spec.sp, spec.hp, lambda i, b, h: (b, 0, h, 0))
  t_block = pl.BlockSpec((None, None, spec.dq_q), lambda i, b, h: (b, h, i))
  dq = _call(
      _dq_kernel, spec, (spec.tp // spec.dq_q, spec.b, spec.n),
      [q_block, whole_k, whole_k, q_block, t_block, t_block], q_block,
      jax.ShapeDtypeStruct(q.shape, q.dtype), spec.dq, interpret, "flash_dropout_dq", spec.bwd_stages,
      seeds, q, k, v, d_out, lse, delta)
  return dq, dk, dv


@functools.lru_cache(maxsize=64)
def _attention_fn(spec: _Spec, interpret: bool):
  @jax.custom_vjp
  def attend(q, k, v, seeds):
    return _forward(spec, interpret, q, k, v, seeds)[0]

  def attend_fwd(q, k, v, seeds):
    out, lse = _forward(spec, interpret, q, k, v, seeds)
    return out, (q, k, v, seeds, out, lse)

  def attend_bwd(res, d_out):
    return (*_backward(spec, interpret, *res, d_out), None)  # no cotangent for the integer seeds

  attend.defvjp(attend_fwd, attend_bwd)
  return attend


def flash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, *, dropout_rate: float = 0.0,
                    dropout_rng=None, interpret: bool = False, blocks: Blocks | None = None,
                    block_q: int | None = None, block_k: int | None = None, block_bwd: int | None = None,
                    shard=None):
  """Attention (shapes as ops/attention.py; `mask_TxS` a numpy mask or None, no bias) with probability dropout
  drawn as reference_attention(dropout_rng=...) draws it. Differentiable (custom VJP, masks recomputed).

  `blocks`: tile sizes and Triton settings (default: `device_blocks()`, the row of `BLOCKS` for this GPU);
  `block_q`, `block_k` and `block_bwd` (all four backward sizes) override single fields.
  `shard`: (first batch row, first head, batch, heads) of the whole array when q, k and v are one device's shard
  of it (inside jax.shard_map; the offsets may be traced), so every shard draws its part of the whole array's
  mask rather than the same pattern."""
  if mask_TxS is not None and not isinstance(mask_TxS, np.ndarray):
    raise ValueError("flash_attention plans its tiles from the mask at trace time: it needs a numpy mask.")
  rate = float(dropout_rate) if dropout_rate > 0.0 and dropout_rng is not None else 0.0
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate {dropout_rate!r} must be in [0, 1).")
  b, t, n, h = q_BxTxNxH.shape
  s = k_BxSxNxH.shape[1]
  b_offset, n_offset, b_total, n_total = shard or (0, 0, b, n)
  if b_total * n_total * t >= 2 ** 32:
    raise ValueError(f"flash_attention dropout: {b_total} x {n_total} x {t} query rows exceed the hash's 2^32 "
                     "counters.")
  key = None if mask_TxS is None else np.asarray(mask_TxS, bool)
  blocks = blocks or device_blocks()
  override = dict(q=block_q, k=block_k, **dict.fromkeys(("dkv_q", "dkv_k", "dq_q", "dq_k"), block_bwd))
  blocks = blocks._replace(**{field: size for field, size in override.items() if size})
  spec = _cached_spec((b, t, n, h), s, None if key is None else (key.shape, key.tobytes()), rate, blocks, n_total)
  seeds = jax.random.bits(dropout_rng, (2,), jnp.uint32) if rate else jnp.zeros((2,), jnp.uint32)
  # [s0, s1, first batch row, first head]; four words, a power of two as Triton's blocks need
  seeds = jnp.concatenate([seeds, jnp.asarray([b_offset, n_offset], jnp.uint32)])
  pad = lambda x, length: jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, spec.hp - h)))
  out = _attention_fn(spec, interpret)(pad(q_BxTxNxH, spec.tp), pad(k_BxSxNxH, spec.sp), pad(v_BxSxNxH, spec.sp),
                                        seeds)
  return out[:, :t, :, :h]


@functools.lru_cache(maxsize=64)
def _cached_spec(q_shape, s, mask_key, rate, blocks, heads_total) -> _Spec:
  mask = None if mask_key is None else np.frombuffer(mask_key[1], bool).reshape(mask_key[0])
  return _Spec(q_shape, s, mask, rate, blocks, heads_total)
