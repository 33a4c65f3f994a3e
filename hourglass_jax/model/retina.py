"""Retina body (Subramanian et al. 2020): one stack whose attention head groups see different scales, each over its
own window of the past (e.g. '0:8,8:256,256:512': scale-1 heads the last 8 tokens, scale-4 heads 8..255 back,
scale-16 heads 256..511 back). Keys and values of a group are the layer's normed input pooled causally at its scale.
"""

import flax.linen as nn

from hourglass_jax.model.layer_config import LayerConfig, LayerOptions, check_choice, check_int
from hourglass_jax.model.layers import feed_forward_residual, layer_norm, pad_to, scan_blocks, stream_positions
from hourglass_jax.model.scale_attention import ScaleAttention, retina_mask
from hourglass_jax.model.scale_resampling import DOWNSAMPLERS, pyramid
from hourglass_jax.model.scales import MultiScale, parse_multiscale


def check_windows_fit(scales: MultiScale, retina_windows: str, length: int) -> None:
  """Raises when a window starts beyond a `length`-token sequence (its heads would never see a token)."""
  for scale, (start, stop) in zip(scales.factors, scales.windows):
    if start >= length:
      raise ValueError(f"model.retina_windows={retina_windows!r}: window {start}:{stop} of the scale-{scale} "
                       f"heads starts beyond this {length}-token sequence, so those heads would see nothing; use "
                       f"sequences longer than {start} tokens (pad prompts at the end: it is causal-safe) or "
                       "shrink the windows.")


class RetinaBlock(nn.Module):
  """Pre-LN block: x + drop(RetinaAttn(LN x)); x + drop(FFN(LN x))."""
  cfg: LayerConfig
  scales: MultiScale
  downsampler: str

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    cfg, scales = self.cfg, self.scales
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
    length = x_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    kvs = pyramid(cfg, self.downsampler, h_BxLxD, scales.factors, deterministic)
    masks = [retina_mask(length, s, start, stop) for s, (start, stop) in zip(scales.factors, scales.windows)]
    positions_k = [stream_positions(length // s, s) for s in scales.factors]
    h_BxLxD = ScaleAttention(cfg, scales.heads, name="attention")(
        h_BxLxD, kvs, stream_positions(length, 1), positions_k, masks, deterministic)
    return feed_forward_residual(cfg, x_BxLxD, h_BxLxD, deterministic)


class Retina(LayerOptions):
  """x [B, L, D] -> y [B, L, D]: `num_layers` retina blocks (scanned, params under 'blocks'), ending with its own
  LayerNorm. `scales` ('16,4,1'), `retina_windows` (one 'a:b' window per scale, nearest first, e.g.
  '0:8,8:32,32:64'), `heads_per_scale` ('' = even split) and `downsampler` ('avg' | 'conv') as in the multi-scale
  notation. Block settings: `LayerOptions`."""
  num_layers: int = 2
  scales: str = "16,4,1"
  retina_windows: str = "0:8,8:32,32:64"
  heads_per_scale: str = ""
  downsampler: str = "avg"

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True):
    check_choice("Retina.downsampler", self.downsampler, DOWNSAMPLERS)
    check_int("Retina.num_layers", self.num_layers, 0)
    cfg = self.layer_config(x_BxLxD.shape[-1])
    scales = parse_multiscale("retina", self.scales, "", self.heads_per_scale, self.retina_windows, cfg.num_heads)
    length = x_BxLxD.shape[1]
    check_windows_fit(scales, self.retina_windows, length)
    y_BxLxD = scan_blocks(cfg, RetinaBlock, self.num_layers, pad_to(x_BxLxD, scales.coarsest), deterministic,
                          scales=scales, downsampler=self.downsampler)
    return layer_norm(cfg, "final_norm")(y_BxLxD)[:, :length]
