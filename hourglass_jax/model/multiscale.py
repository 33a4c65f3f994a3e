"""Top-down and bottom-up multi-scale bodies (Subramanian et al. 2020), causal at every scale boundary.

Both map the scale-1 stream x [B, L, D] to the scale-1 representation y [B, L, D] (any L: padded at the end
inside to a multiple of the coarsest scale). A stack at cumulative scale s runs at positions 0, s, 2s... (its
tokens' last positions), so rotary and relative positions measure real distances, as in Hourglass.
"""

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice
from hourglass_jax.model.layers import (DecoderStack, causal_mask, dense, feed_forward_residual, layer_norm, pad_to,
                                        rematerialised, stream_positions)
from hourglass_jax.model.resampling import upsample_mask
from hourglass_jax.model.scale_attention import ScaleAttention
from hourglass_jax.model.scale_resampling import DOWNSAMPLERS, UPSAMPLERS, downsample, pyramid, upsample
from hourglass_jax.model.scales import MultiScale, parse_multiscale


class TopDown(LayerOptions):
  """Coarsest scale on pooled inputs; each finer scale's input is GELU(Linear(concat(pooled inputs, up-sampled
  coarser output))); the scale-1 stack's output is y. `scales` ('64,16,4,1', coarse to fine) and
  `layers_per_scale` ('2,4,8,12') as in the multi-scale notation; `downsampler` 'avg' | 'conv', `upsampler`
  'transposed_conv' | 'repeat'. Block settings: `LayerOptions`."""
  scales: str = "16,4,1"
  layers_per_scale: str = "2,2,2"
  downsampler: str = "avg"
  upsampler: str = "transposed_conv"

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True):
    check_choice("TopDown.downsampler", self.downsampler, DOWNSAMPLERS)
    check_choice("TopDown.upsampler", self.upsampler, UPSAMPLERS)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    options = cfg.options()
    scales = parse_multiscale("topdown", self.scales, self.layers_per_scale, "", "", cfg.num_heads)
    factors = scales.factors
    length = x_BxLxD.shape[1]
    e = pyramid(cfg, self.downsampler, pad_to(x_BxLxD, scales.coarsest), factors, deterministic)
    z = DecoderStack(num_layers=scales.layers[0], factor=factors[0], **options, name=f"scale_{factors[0]}")(
        e[0], deterministic)
    for i in range(1, len(factors)):
      u = upsample(cfg, self.upsampler, z, scales.relative_factor(i), deterministic, f"upsample_{factors[i - 1]}")
      h = dense(cfg, cfg.d_model, ("mlp", "embed"), f"merge_{factors[i]}")(jnp.concatenate([e[i], u], axis=-1))
      h = nn.Dropout(cfg.dropout)(nn.gelu(h, approximate=True), deterministic=deterministic)
      z = DecoderStack(num_layers=scales.layers[i], factor=factors[i], **options, name=f"scale_{factors[i]}")(
          h, deterministic)
    return z[:, :length]


class AggregationBlock(nn.Module):
  """Pre-LN block at scale 1 whose head groups attend causally to the streams of the different scales.

  `streams` are aligned with the scales (coarse to fine); the scale-1 group attends to the block's own normed input.
  """
  cfg: LayerConfig
  scales: MultiScale

  @nn.compact
  def __call__(self, x_BxLxD, streams, deterministic: bool):
    cfg = self.cfg
    factors = self.scales.factors
    length = x_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    kvs = list(streams[:-1]) + [h_BxLxD]
    masks = [upsample_mask(length, s) for s in factors[:-1]] + [causal_mask(length)]
    positions_k = [stream_positions(length // s, s) for s in factors]
    h_BxLxD = ScaleAttention(cfg, self.scales.heads, name="attention")(
        h_BxLxD, kvs, stream_positions(length, 1), positions_k, masks, deterministic)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)


class BottomUp(LayerOptions):
  """Pool upward from x, each coarser scale from the finer scale's output, running each scale's stack; then one
  aggregation layer at scale 1 whose head groups (`heads_per_scale`, '' = even split) read all scales; then the
  scale-1 stack gives y. Fields as `TopDown`; block settings: `LayerOptions`."""
  scales: str = "16,4,1"
  layers_per_scale: str = "2,2,2"
  heads_per_scale: str = ""
  downsampler: str = "avg"

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True):
    check_choice("BottomUp.downsampler", self.downsampler, DOWNSAMPLERS)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    options = cfg.options()
    scales = parse_multiscale("bottomup", self.scales, self.layers_per_scale, self.heads_per_scale, "",
                              cfg.num_heads)
    factors = scales.factors
    length = x_BxLxD.shape[1]
    x_BxLxD = pad_to(x_BxLxD, scales.coarsest)
    streams = [x_BxLxD]
    for i in range(len(factors) - 2, -1, -1):
      z = downsample(cfg, self.downsampler, streams[0], scales.relative_factor(i + 1), deterministic,
                     f"downsample_{factors[i]}")
      stack = DecoderStack(num_layers=scales.layers[i], factor=factors[i], **options, name=f"scale_{factors[i]}")
      streams.insert(0, stack(z, deterministic))
    aggregate = rematerialised(cfg, AggregationBlock, static_argnums=(3,))
    x_BxLxD = aggregate(cfg, scales, name="aggregate")(x_BxLxD, tuple(streams), deterministic)
    y_BxLxD = DecoderStack(num_layers=scales.layers[-1], factor=1, **options, name="scale_1")(x_BxLxD, deterministic)
    return y_BxLxD[:, :length]
