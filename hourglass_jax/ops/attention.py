"""One attention dispatcher: 'xla' | 'cudnn' | 'splash' (TPU) | 'auto', with a naive einsum reference.

Shapes: q [B, T, N, H], k and v [B, S, N, H], mask [T, S] (True = may attend), bias [B|1, N|1, T, S] added to the
scaled logits. Every query row must be allowed at least one key.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "reference")


def reference_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, dropout_rate=0.0,
                        dropout_rng=None):
  """Plain einsum attention with float32 softmax; the ground truth, and the path that supports prob dropout."""
  scale = q_BxTxNxH.shape[-1] ** -0.5
  logits_BxNxTxS = jnp.einsum("btnh,bsnh->bnts", q_BxTxNxH, k_BxSxNxH,
                              preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits_BxNxTxS = logits_BxNxTxS + bias.astype(jnp.float32)
  if mask_TxS is not None:
    logits_BxNxTxS = jnp.where(mask_TxS, logits_BxNxTxS, jnp.finfo(jnp.float32).min)
  probs_BxNxTxS = jax.nn.softmax(logits_BxNxTxS, axis=-1)
  if dropout_rate > 0.0 and dropout_rng is not None:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs_BxNxTxS.shape)
    probs_BxNxTxS = jnp.where(keep, probs_BxNxTxS / (1.0 - dropout_rate), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", probs_BxNxTxS.astype(v_BxSxNxH.dtype), v_BxSxNxH)


def _is_causal(mask_TxS) -> bool:
  if not isinstance(mask_TxS, np.ndarray) or mask_TxS.ndim != 2 or mask_TxS.shape[0] != mask_TxS.shape[1]:
    return False
  return bool(np.array_equal(mask_TxS, np.tril(np.ones(mask_TxS.shape, bool))))


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


def resolve_implementation(impl: str, *, dtype, has_bias: bool, has_dropout: bool, static_mask: bool,
                           lengths: tuple[int, int]) -> str:
  """Picks the concrete kernel for `impl`; 'auto' prefers the fused kernel of the backend when it applies."""
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"attention implementation {impl!r} is not one of {IMPLEMENTATIONS}.")
  backend = jax.default_backend()
  if impl == "auto":
    fused_ok = not has_bias and not has_dropout
    if fused_ok and backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
      return "cudnn"
    if fused_ok and backend == "tpu" and static_mask and all(n % 128 == 0 for n in lengths):
      return "splash"
    return "reference" if has_dropout else "xla"
  if impl == "cudnn" and backend != "gpu":
    raise ValueError(f"attention_impl='cudnn' needs a GPU backend, but JAX runs on {backend!r}; use 'auto'.")
  if impl == "splash" and backend != "tpu":
    raise ValueError(f"attention_impl='splash' needs a TPU backend, but JAX runs on {backend!r}; use 'auto'.")
  if impl in ("cudnn", "splash") and (has_bias or has_dropout):
    raise ValueError(f"attention_impl={impl!r} supports neither position biases nor probability dropout.")
  if impl == "xla" and has_dropout:
    return "reference"  # jax.nn.dot_product_attention has no dropout; the einsum path is the XLA path with it.
  return impl


def dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, impl: str = "auto",
                          dropout_rate: float = 0.0, dropout_rng=None):
  """Multi-head attention through the kernel `impl` names (see module docstring for shapes)."""
  has_dropout = dropout_rate > 0.0 and dropout_rng is not None
  chosen = resolve_implementation(
      impl, dtype=q_BxTxNxH.dtype, has_bias=bias is not None, has_dropout=has_dropout,
      static_mask=mask_TxS is None or isinstance(mask_TxS, np.ndarray),
      lengths=(q_BxTxNxH.shape[1], k_BxSxNxH.shape[1]))
  if chosen == "reference":
    return reference_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, bias, dropout_rate=dropout_rate,
                               dropout_rng=dropout_rng)
  if chosen == "splash":
    return sharded_splash_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS)
  causal = _is_causal(mask_TxS)
  mask = None if (mask_TxS is None or causal) else jnp.asarray(mask_TxS)[None, None]
  return jax.nn.dot_product_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, bias=bias, mask=mask, is_causal=causal,
                                      implementation=chosen)

