"""Top-down and bottom-up multi-scale bodies (Subramanian et al. 2020), causal at every scale boundary.

Both take the scale-1 embedded stream [B, L, D] (L a multiple of the coarsest scale) and return the scale-1
representation the LM head reads. A stack at cumulative scale s runs at positions 0, s, 2s... (its tokens' last
positions), so rotary and relative positions measure real distances, as in Hourglass.
"""

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.layers import DecoderStack, FeedForward, causal_mask, dense, layer_norm, stream_positions
from hourglass_jax.model.resampling import upsample_mask
from hourglass_jax.model.scale_attention import ScaleAttention
from hourglass_jax.model.scale_resampling import downsample, pyramid, upsample


class TopDown(nn.Module):
  """Coarsest scale on pooled embeddings; each finer scale's input is GELU(Linear(concat(pooled embeddings,
  up-sampled coarser output))); the scale-1 stack's output predicts."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    cfg = self.cfg
    scales = cfg.parsed_scales
    factors = scales.factors
    e = pyramid(cfg, x_BxLxD, factors, deterministic)
    z = DecoderStack(cfg, scales.layers[0], factors[0], name=f"scale_{factors[0]}")(e[0], deterministic)
    for i in range(1, len(factors)):
      u = upsample(cfg, z, scales.relative_factor(i), deterministic, f"upsample_{factors[i - 1]}")
      h = dense(cfg, cfg.d_model, ("mlp", "embed"), f"merge_{factors[i]}")(jnp.concatenate([e[i], u], axis=-1))
      h = nn.Dropout(cfg.dropout)(nn.gelu(h, approximate=True), deterministic=deterministic)
      z = DecoderStack(cfg, scales.layers[i], factors[i], name=f"scale_{factors[i]}")(h, deterministic)
    return z


class AggregationBlock(nn.Module):
  """Pre-LN block at scale 1 whose head groups attend causally to the streams of the different scales.

  `streams` are aligned with the scales (coarse to fine); the scale-1 group attends to the block's own normed input.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, streams, deterministic: bool):
    cfg = self.cfg
    factors = cfg.parsed_scales.factors
    length = x_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    kvs = list(streams[:-1]) + [h_BxLxD]
    masks = [upsample_mask(length, s) for s in factors[:-1]] + [causal_mask(length)]
    positions_k = [stream_positions(length // s, s) for s in factors]
    h_BxLxD = ScaleAttention(cfg, cfg.parsed_scales.heads, name="attention")(
        h_BxLxD, kvs, stream_positions(length, 1), positions_k, masks, deterministic)
    x_BxLxD = x_BxLxD + nn.Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)
    h_BxLxD = FeedForward(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x_BxLxD), deterministic)
    return x_BxLxD + nn.Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)


class BottomUp(nn.Module):
  """Pool upward from the embeddings, each coarser scale from the finer scale's output, running each scale's
  stack; then one aggregation layer at scale 1 over all scales; then the scale-1 stack predicts."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    cfg = self.cfg
    scales = cfg.parsed_scales
    factors = scales.factors
    streams = [x_BxLxD]
    for i in range(len(factors) - 2, -1, -1):
      z = downsample(cfg, streams[0], scales.relative_factor(i + 1), deterministic, f"downsample_{factors[i]}")
      streams.insert(0, DecoderStack(cfg, scales.layers[i], factors[i], name=f"scale_{factors[i]}")(z, deterministic))
    x_BxLxD = AggregationBlock(cfg, name="aggregate")(x_BxLxD, streams, deterministic)
    return DecoderStack(cfg, scales.layers[-1], 1, name="scale_1")(x_BxLxD, deterministic)
