"""Transformer building blocks: LayerNorm, GELU feed-forward, multi-head attention, pre-LN decoder stack.

Every stream carries its positions in original-token units (a level with total factor P has positions 0, P, 2P...),
so rotary and relative positions measure real distances at every level.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import kv_cache
from hourglass_jax.model.kv_cache import KVCache
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions
from hourglass_jax.model.positions import apply_rope, relative_distance_index, sinusoid_table
from hourglass_jax.ops.attention import dot_product_attention
from hourglass_jax.ops.block_attention import relative_bias
from hourglass_jax.ops.dropout import Dropout
from hourglass_jax.ops.layer_norm import layer_norm as fused_layer_norm
from hourglass_jax.ops.weight_gradient import dense_dot_general
from hourglass_jax.runtime.sharding import LAYERS_AXIS


def dense(cfg: LayerConfig, features, axes: tuple[str, ...], name: str, in_axes=-1, use_bias: bool = True):
  """DenseGeneral in the compute dtype with float32 params annotated with logical axes; its matmul is
  `dense_dot_general` (on CPU the kernel gradient runs as a YNNPACK matmul)."""
  out_axes = axes[-len(features):] if isinstance(features, tuple) else axes[-1:]
  return nn.DenseGeneral(
      features=features, axis=in_axes, use_bias=use_bias, dtype=cfg.compute_dtype, name=name,
      dot_general=dense_dot_general,
      kernel_init=_flat_partitioned(nn.initializers.xavier_uniform(), axes),
      bias_init=_flat_partitioned(nn.initializers.zeros_init(), out_axes))


class _FlatPartitioned(nn.LogicallyPartitioned):
  """DenseGeneral inits its params flat, then reshapes: constrain them only at full rank (flax issue #3676)."""

  def unbox(self, apply_constraint=True):
    return super().unbox(apply_constraint and jnp.ndim(self.value) == len(self.names))


def _flat_partitioned(init, axes: tuple[str, ...]):
  return lambda rng, shape, dtype=jnp.float32: _FlatPartitioned(init(rng, shape, dtype), axes)


class LayerNorm(nn.Module):
  """nn.LayerNorm(epsilon, dtype) over the last axis, with its parameters ('scale', 'bias': float32 [features],
  logical axis 'embed') and values, whose backward pass keeps only the input and two numbers per row
  (ops/layer_norm.py)."""
  epsilon: float  # both from the model's settings (layer_norm_eps, compute_dtype), declared there once
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x):
    features = (x.shape[-1],)
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)), features,
                       jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)), features,
                      jnp.float32)
    return fused_layer_norm(x, scale, bias, self.epsilon, self.dtype)


def layer_norm(cfg: LayerConfig, name: str | None = None):
  return LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, name=name)


def causal_mask(length: int) -> np.ndarray:
  return np.tril(np.ones((length, length), bool))


def pad_to(x_BxLxD, multiple: int):
  """Zeros at the end up to a multiple of `multiple` (causal-safe: no real position can see them)."""
  return jnp.pad(x_BxLxD, ((0, 0), (0, -x_BxLxD.shape[1] % multiple), (0, 0)))


def stream_positions(length: int, factor: int) -> np.ndarray:
  """Original-token positions of a stream at total shortening `factor` (token j summarises up to j*factor)."""
  return np.arange(length) * factor


class FeedForward(nn.Module):
  """Dense(d_ff) -> GELU(tanh) -> dropout -> Dense(d_model)."""
  cfg: LayerConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    cfg = self.cfg
    h_BxLxF = dense(cfg, cfg.d_ff, ("embed", "mlp"), "wi")(x_BxLxD)
    h_BxLxF = nn.gelu(h_BxLxF, approximate=True)
    h_BxLxF = Dropout(cfg.dropout)(h_BxLxF, deterministic=deterministic)
    return dense(cfg, cfg.d_model, ("mlp", "embed"), "wo")(h_BxLxF)


class MultiHeadAttention(nn.Module):
  """Attention from queries x_q to keys/values x_kv under a static mask, rotary or Transformer-XL positions.

  With a `kv_cache.KVCache`, x_kv holds only the new key rows (at `positions_k_S`): they are written into the
  cache, the queries attend over all of its entries under `mask_TxS` [T, cache size], and (out, cache.kv) is
  returned. Relative positions then read their distance table from the 'tables' collection (made on first use).
  """
  cfg: LayerConfig

  @nn.compact
  def __call__(self, x_q_BxTxD, x_kv_BxSxD, positions_q_T, positions_k_S, mask_TxS, deterministic: bool,
               cache: KVCache | None = None):
    cfg = self.cfg
    heads = (cfg.num_heads, cfg.head_dim)
    q_BxTxNxH = dense(cfg, heads, ("embed", "heads", "kv"), "query")(x_q_BxTxD)
    k_BxSxNxH = dense(cfg, heads, ("embed", "heads", "kv"), "key")(x_kv_BxSxD)
    v_BxSxNxH = dense(cfg, heads, ("embed", "heads", "kv"), "value")(x_kv_BxSxD)
    if cfg.position == "rope":
      q_BxTxNxH = apply_rope(q_BxTxNxH, positions_q_T, cfg.rope_base)
      k_BxSxNxH = apply_rope(k_BxSxNxH, positions_k_S, cfg.rope_base)
    relative = self._relative_params() if cfg.position == "relative" else None
    out_BxTxNxH, kv = head_attention(self, cfg, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, positions_q_T, positions_k_S, mask_TxS,
                                     deterministic, relative, cache)
    out_BxTxD = dense(cfg, cfg.d_model, ("heads", "kv", "embed"), "out", in_axes=(-2, -1))(out_BxTxNxH)
    return out_BxTxD if cache is None else (out_BxTxD, kv)

  def _relative_params(self):
    """Transformer-XL: logits = (q+u)k + (q+v)W_r R(i-j); returns (u, v, the 'position' Dense W_r)."""
    cfg = self.cfg
    zeros = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("heads", "kv"))
    u_NxH = self.param("content_bias", zeros, (cfg.num_heads, cfg.head_dim))
    v_NxH = self.param("position_bias", zeros, (cfg.num_heads, cfg.head_dim))
    project = dense(cfg, (cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"), "position", use_bias=False)
    return u_NxH, v_NxH, project


def head_attention(module: nn.Module, cfg: LayerConfig, q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, positions_q_T, positions_k_S,
                   mask_TxS, deterministic: bool, relative=None, cache: KVCache | None = None, table: str = "table"):
  """(out [B, T, N, H], kv) of `module`'s heads (all, or a group), rotary positions applied or `relative` = (u, v,
  W_r) the Transformer-XL terms. A `cache` is used as in `MultiHeadAttention` (relative positions reading the table
  named `table`); without one, kv is None."""
  if cache is not None:
    kv = kv_cache.write(cache, k_BxSxNxH, v_BxSxNxH)
    bias = None
    if relative is not None:
      u_NxH, v_NxH, project = relative
      table_NxRxH = module.variable("tables", table, kv_cache.relative_table, cfg, project, cache).value
      bias = kv_cache.relative_bias(cfg, q_BxTxNxH + v_NxH.astype(q_BxTxNxH.dtype), table_NxRxH, positions_q_T, cache)
      q_BxTxNxH = q_BxTxNxH + u_NxH.astype(q_BxTxNxH.dtype)
    return kv_cache.attend(q_BxTxNxH, kv_cache.view(cache, kv), mask_TxS, bias), kv
  bias = None
  if relative is not None:
    q_BxTxNxH, bias = relative_position_terms(cfg, q_BxTxNxH, *relative, positions_q_T, positions_k_S, mask_TxS)
  use_dropout = cfg.attention_dropout_rate > 0.0 and not deterministic
  return dot_product_attention(
      q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS, bias, impl=cfg.attention_impl,
      dropout_rate=cfg.attention_dropout_rate if use_dropout else 0.0,
      dropout_rng=module.make_rng("dropout") if use_dropout else None), None


def relative_position_terms(cfg: LayerConfig, q_BxTxNxH, u_NxH, v_NxH, project, positions_q_T, positions_k_S,
                            mask_TxS):
  """(q + u, the scaled position term (q + v) W_r R(i - j) in its relative form (pos [B, N, T, R], static index
  [T, S]): the block kernel gathers it per block, the others materialise [B, N, T, S]). `project` maps sinusoids
  [R, D] to [R, N, H]."""
  distances_R, index_TxS = relative_distance_index(positions_q_T, positions_k_S, mask_TxS)
  r_RxD = sinusoid_table(distances_R, cfg.d_model).astype(cfg.compute_dtype)
  r_RxNxH = project(r_RxD)
  qv_BxTxNxH = q_BxTxNxH + v_NxH.astype(q_BxTxNxH.dtype)
  pos_BxNxTxR = jnp.einsum("btnh,rnh->bntr", qv_BxTxNxH, r_RxNxH, preferred_element_type=jnp.float32)
  return q_BxTxNxH + u_NxH.astype(q_BxTxNxH.dtype), relative_bias(pos_BxNxTxR, index_TxS, cfg.head_dim ** -0.5)


def feed_forward_residual(cfg: LayerConfig, x_BxLxD, h_BxLxD, deterministic: bool):
  """x + drop(h), then + drop(FFN(LN .)): the tail every block shares after its attention output h, whatever the
  attention (self, scale groups, resampling). Its params ('mlp_norm', 'mlp') belong to the calling block."""
  x_BxLxD = x_BxLxD + Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)
  h_BxLxD = FeedForward(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x_BxLxD), deterministic)
  return x_BxLxD + Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)


class DecoderBlock(nn.Module):
  """Pre-LN block: x + drop(Attn(LN x)); x + drop(FFN(LN x)).

  Cached (`kv` the stack's K/V cache, `index_T` the stream entries of x's rows, `layer` this block's index in a
  stacked cache): returns (y, kv) with x's keys and values written.
  """
  cfg: LayerConfig
  factor: int = 1

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool, kv=None, index_T=None, layer=None):
    cfg = self.cfg
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
    length = x_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    attention = MultiHeadAttention(cfg, name="attention")
    if kv is None:
      positions = stream_positions(length, self.factor)
      h_BxLxD = attention(h_BxLxD, h_BxLxD, positions, positions, causal_mask(length), deterministic)
      return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)
    entries_S = jnp.arange(kv_cache.size(kv))  # entry m of the stream sits at position m * factor
    cache = KVCache(kv, index_T[..., 0], entries_S * self.factor, self.factor, kv_cache.size(kv), layer)
    positions_T = index_T * self.factor  # index_T [T], or [B, T]: rows at their own entries
    mask_TxS = entries_S <= index_T[..., None]
    h_BxLxD, kv = attention(h_BxLxD, h_BxLxD, positions_T, positions_T, mask_TxS, deterministic, cache)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic), kv


_REMAT_POLICIES = {"nothing_saveable": jax.checkpoint_policies.nothing_saveable,
                   "dots_saveable": jax.checkpoint_policies.dots_saveable}


def rematerialised(cfg: LayerConfig, block_cls, static_argnums: tuple[int, ...], in_scan: bool = False):
  """`block_cls` under `nn.remat` with `cfg.remat_policy` (unchanged for 'none'): every block kind goes through
  here, scanned or not. `static_argnums` counts self as 0 (e.g. `deterministic`). Inside a scan CSE cannot undo
  the recomputation, so its prevention (which costs fusion) is dropped there."""
  if cfg.remat_policy == "none":
    return block_cls
  return nn.remat(block_cls, policy=_REMAT_POLICIES[cfg.remat_policy], static_argnums=static_argnums,
                  prevent_cse=not in_scan)


def scan_blocks(cfg: LayerConfig, block_cls, num_layers: int, x_BxLxD, deterministic: bool, **block_kwargs):
  """`num_layers` blocks `block_cls(cfg, **block_kwargs)(x, deterministic) -> x` as one `nn.scan`: params stacked
  on a leading 'layers' axis (under 'blocks'), a dropout key per layer, `cfg.remat_policy` applied inside the scan,
  so compile time does not grow with depth."""
  if num_layers == 0:
    return x_BxLxD
  block_cls = rematerialised(cfg, block_cls, static_argnums=(2,), in_scan=True)
  scanned = nn.scan(lambda block, x, _: (block(x, deterministic), None),
                    variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True}, length=num_layers,
                    unroll=cfg.scan_unroll or num_layers, metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})
  x_BxLxD, _ = scanned(block_cls(cfg, **block_kwargs, name="blocks"), x_BxLxD, None)
  return x_BxLxD


def scan_cached_blocks(cfg: LayerConfig, block_cls, num_layers: int, x_BxLxD, kv, index_T, **block_kwargs):
  """`scan_blocks` for decoding: block i reads and extends layer i of the stacked cache `kv` (written in place),
  `block_cls(cfg, **block_kwargs)(x, True, kv, index_T, i) -> (x, kv)`; returns (x, kv)."""
  if num_layers == 0:
    return x_BxLxD, kv

  def step(block, carry, layer):
    x_BxLxD, kv = carry
    return block(x_BxLxD, True, kv, index_T, layer), None

  scanned = nn.scan(step, variable_axes={"params": 0, "tables": 0}, split_rngs={"params": True}, length=num_layers,
                    metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})
  (x_BxLxD, kv), _ = scanned(block_cls(cfg, **block_kwargs, name="blocks"), (x_BxLxD, kv), jnp.arange(num_layers))
  return x_BxLxD, kv


class DecoderStack(LayerOptions):
  """`num_layers` pre-LN decoder blocks over x [B, L, D] -> [B, L, D], causal, ending with its own LayerNorm.

  Scanned: params under 'blocks' with a leading 'layers' axis. `factor` is the stream's total shortening (its
  positions are 0, factor, 2*factor...), so rotary and relative positions measure original-token distances.
  Block settings are the keyword arguments of `LayerOptions`. Cached decoding: pass the stacked K/V cache `kv`
  (`kv_cache.new_stack`) and `index_T`, the stream entries of x's rows; returns (y, kv).
  """
  num_layers: int = 1
  factor: int = 1

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, kv=None, index_T=None):
    cfg = self.layer_config(x_BxLxD.shape[-1])
    if kv is None:
      x_BxLxD = scan_blocks(cfg, DecoderBlock, self.num_layers, x_BxLxD, deterministic, factor=self.factor)
      return layer_norm(cfg, "final_norm")(x_BxLxD)
    x_BxLxD, kv = scan_cached_blocks(cfg, DecoderBlock, self.num_layers, x_BxLxD, kv, index_T, factor=self.factor)
    return layer_norm(cfg, "final_norm")(x_BxLxD), kv
