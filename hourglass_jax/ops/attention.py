"""One attention dispatcher: 'xla' | 'cudnn' | 'splash' (TPU) | 'block' | 'flash' | 'auto', with a naive einsum
reference. 'flash' is the Pallas kernel with in-kernel probability dropout (ops/flash_dropout.py; Triton on a GPU,
the Pallas interpreter elsewhere).

Shapes: q [B, T, N, H], k and v [B, S, N, H], mask [T, S] (True = may attend), bias [B|1, N|1, T, S] added to the
scaled logits, or its relative form (pos [B|1, N|1, T, R], static index [T, S]; see ops/block_attention.py), which
'block' gathers per block and the others materialise. Every query row must be allowed at least one key.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from hourglass_jax.ops.block_attention import block_attention, block_attention_pays, materialize_bias
from hourglass_jax.ops.dropout import keep_mask
from hourglass_jax.ops.flash_dropout import flash_attention, is_causal

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "block", "flash", "reference")


def reference_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, dropout_rate=0.0,
                        dropout_rng=None, dropout_mask=None):
  """Plain einsum attention with float32 softmax; the ground truth, and the path that supports prob dropout.

  `dropout_mask` (bool keep mask [B|1, N|1, T, S]) replaces the one drawn from `dropout_rng` (ops/dropout.keep_mask,
  a counter hash), e.g. to reproduce block_attention's block-wise draw (block_attention.dropout_keep_mask).
  """
  scale = q_BxTxNxH.shape[-1] ** -0.5
  logits_BxNxTxS = jnp.einsum("btnh,bsnh->bnts", q_BxTxNxH, k_BxSxNxH,
                              preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits_BxNxTxS = logits_BxNxTxS + materialize_bias(bias).astype(jnp.float32)
  if mask_TxS is not None:
    logits_BxNxTxS = jnp.where(mask_TxS, logits_BxNxTxS, jnp.finfo(jnp.float32).min)
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  if dropout_rate > 0.0 and (dropout_rng is not None or dropout_mask is not None):
    keep = dropout_mask if dropout_mask is not None else keep_mask(dropout_rng, dropout_rate, probs_BxNxTxS.shape)
    probs_BxNxTxS = jnp.where(keep, probs_BxNxTxS / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", probs_BxNxTxS.astype(v_BxSxNxH.dtype), v_BxSxNxH)


def splash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, interpret: bool = False):
  """TPU Pallas splash attention with a static mask; lengths must be multiples of 128.

  `interpret=True` runs the kernel in the Pallas interpreter, so its glue can be tested on CPU.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  num_heads = q_BxTxNxH.shape[2]
  if mask_TxS is None:
    mask_TxS = np.ones((q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]), bool)
  head_mask = splash.NumpyMask(np.asarray(mask_TxS))
  kernel = splash.make_splash_mha(mask=splash.MultiHeadMask([head_mask] * num_heads), head_shards=1,
                                  q_seq_shards=1, interpret=interpret)
  q_BxNxTxH = jnp.swapaxes(q_BxTxNxH, 1, 2) * (q_BxTxNxH.shape[-1] ** -0.5)
  out_BxNxTxH = jax.vmap(kernel)(q_BxNxTxH, jnp.swapaxes(k_BxSxNxH, 1, 2), jnp.swapaxes(v_BxSxNxH, 1, 2))
  return jnp.swapaxes(out_BxNxTxH, 1, 2)


def sharded_splash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, interpret: bool = False):
  """splash_attention on each device's shard of a sharded jit: XLA cannot partition a Mosaic kernel, so it runs
  under jax.shard_map, batch split as the logical 'batch' axis and heads as 'heads' (the active flax logical axis
  rules), lengths whole. Without a mesh, or on a one-device mesh, it calls the kernel directly."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return splash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, interpret=interpret)
  batch, heads = nn.logical_to_mesh_axes(("batch", "heads")) or (None, None)
  spec = P(batch, None, heads, None)
  local = functools.partial(splash_attention, mask_TxS=mask_TxS, interpret=interpret)
  return jax.shard_map(local, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(
      q_BxTxNxH, k_BxSxNxH, v_BxSxNxH)


def sharded_flash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, *, dropout_rate: float, dropout_rng,
                            interpret: bool = False):
  """flash_attention on each device's shard of a sharded jit, under jax.shard_map as sharded_splash_attention;
  each shard draws its own part of the whole array's dropout mask (the same mask as on one device)."""
  mesh = jax.sharding.get_abstract_mesh()
  attend = functools.partial(flash_attention, mask_TxS=mask_TxS, dropout_rate=dropout_rate, interpret=interpret)
  if mesh.empty or mesh.size == 1:
    return attend(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, dropout_rng=dropout_rng)
  batch, heads = nn.logical_to_mesh_axes(("batch", "heads")) or (None, None)
  spec = P(batch, None, heads, None)
  b_total, n_total = q_BxTxNxH.shape[0], q_BxTxNxH.shape[2]

  def local(q, k, v, rng):
    offset = lambda axes, size: 0 if axes is None else jax.lax.axis_index(axes) * size
    shard = (offset(batch, q.shape[0]), offset(heads, q.shape[2]), b_total, n_total)
    return attend(q, k, v, dropout_rng=rng, shard=shard)

  rng = dropout_rng if dropout_rng is not None else jax.random.key(0)  # unused without dropout
  return jax.shard_map(local, in_specs=(spec, spec, spec, P()), out_specs=spec, check_vma=False)(
      q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, rng)


def resolve_implementation(impl: str, *, dtype, has_bias: bool, has_dropout: bool, static_mask: bool,
                           lengths: tuple[int, int], mask_TxS=None) -> str:
  """Picks the concrete kernel for `impl`. 'auto' prefers the backend's fused kernel where it applies (cuDNN: bf16
  or fp16 without bias or dropout, any length; flash: a GPU, bf16 or fp16 with probability dropout and a static
  mask, no bias; splash: TPU, lengths a multiple of 128), else block attention on
  CPU and GPU where its static plan skips enough of the square, else XLA (the einsum path with dropout). Measured:
  benchmarks/block_attention.py on CPU, 1.4-4.8x faster than XLA's masked square at 1024-2048 tokens, forward +
  backward; on an H100 the enwik8 step ran 1.14x faster with block than with XLA's square (14.5 instead of 37.9 GiB)
  and as fast as the einsum path with dropout (14.6 instead of 18.1 GiB), benchmarks/results/gpu_throughput.json.
  `mask_TxS` is the static mask, when there is one."""
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"attention implementation {impl!r} is not one of {IMPLEMENTATIONS}.")
  backend = jax.default_backend()
  if impl == "auto":
    fused_ok = not has_bias and not has_dropout
    half = jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
    if fused_ok and backend == "gpu" and half:
      return "cudnn"
    if backend == "gpu" and half and has_dropout and not has_bias and static_mask:
      return "flash"
    if fused_ok and backend == "tpu" and static_mask and all(n % 128 == 0 for n in lengths):
      return "splash"
    if backend in ("cpu", "gpu") and static_mask and block_attention_pays(mask_TxS, *lengths):
      return "block"
    return "reference" if has_dropout else "xla"
  if impl == "cudnn" and backend != "gpu":
    raise ValueError(f"attention_impl='cudnn' needs a GPU backend, but JAX runs on {backend!r}; use 'auto'.")
  if impl == "splash" and backend != "tpu":
    raise ValueError(f"attention_impl='splash' needs a TPU backend, but JAX runs on {backend!r}; use 'auto'.")
  if impl == "block" and not static_mask:
    raise ValueError("attention_impl='block' plans its blocks from the mask at trace time: it needs a numpy mask.")
  if impl == "flash" and (has_bias or not static_mask):
    raise ValueError("attention_impl='flash' needs a numpy mask (or none) and no position bias; use position="
                     "'rope', or 'auto'.")
  if impl in ("cudnn", "splash") and (has_bias or has_dropout):
    raise ValueError(f"attention_impl={impl!r} supports neither position biases nor probability dropout.")
  if impl == "xla" and has_dropout:
    return "reference"  # jax.nn.dot_product_attention has no dropout; the einsum path is the XLA path with it.
  return impl


def fused_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, implementation: str = "cudnn",
                    pad_odd: bool | None = None):
  """jax.nn.dot_product_attention's kernel `implementation` ('xla' or 'cudnn'). With `pad_odd` (default: for cuDNN,
  which refuses odd lengths in training, e.g. a hierarchy's 2049 = 3 x 683), odd lengths are padded by one query
  and one key that no real query sees."""
  t, s = q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]
  causal = is_causal(mask_TxS)
  tp, sp = t + t % 2, s + s % 2
  if (implementation == "cudnn" if pad_odd is None else pad_odd) and (tp, sp) != (t, s):
    if bias is not None:
      raise ValueError("fused_attention pads odd lengths only without a bias.")
    pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, 0)))
    q_BxTxNxH, k_BxSxNxH, v_BxSxNxH = pad(q_BxTxNxH, tp), pad(k_BxSxNxH, sp), pad(v_BxSxNxH, sp)
    if not causal:  # causal stays causal: the extra key comes after every real query
      real = True if mask_TxS is None else jnp.asarray(mask_TxS)
      # Real queries keep their mask and never see the extra key; the extra query sees every key (stays finite).
      mask_TxS = jnp.ones((tp, sp), bool).at[:t, :s].set(real).at[:t, s:].set(False)
  mask = None if (mask_TxS is None or causal) else jnp.asarray(mask_TxS)[None, None]
  out = jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias, mask=mask, is_causal=causal,
                                     implementation=implementation)
  return out[:, :t]


def dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, impl: str = "auto",
                          dropout_rate: float = 0.0, dropout_rng=None):
  """Multi-head attention through the kernel `impl` names (see module docstring for shapes)."""
  has_dropout = dropout_rate > 0.0 and dropout_rng is not None
  chosen = resolve_implementation(
      impl, dtype=q_BxTxNxH.dtype, has_bias=bias is not None, has_dropout=has_dropout,
      static_mask=mask_TxS is None or isinstance(mask_TxS, np.ndarray),
      lengths=(q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]), mask_TxS=mask_TxS)
  if chosen == "reference":
    attend = functools.partial(reference_attention, mask_TxS=mask_TxS, bias=bias, dropout_rate=dropout_rate)
    if has_dropout:
      # The backward pass recomputes the [B, N, T, S] probabilities and keep mask from q, k and the key instead of
      # a scanned stack storing them for every layer (19.8 GiB/device for the enwik8 step on a v4-8, SCALING.md).
      attend = jax.checkpoint(attend, policy=jax.checkpoint_policies.nothing_saveable)
    return attend(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, dropout_rng=dropout_rng)
  if chosen == "block":
    return block_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, bias, dropout_rate=dropout_rate,
                           dropout_rng=dropout_rng)
  if chosen == "flash":
    return sharded_flash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, dropout_rate=dropout_rate,
                                   dropout_rng=dropout_rng, interpret=jax.default_backend() != "gpu")
  if chosen == "splash":
    return sharded_splash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS)
  bias = None if bias is None else materialize_bias(bias)
  return fused_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, bias, implementation=chosen)

