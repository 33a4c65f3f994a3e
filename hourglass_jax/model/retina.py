"""Retina body (Subramanian et al. 2020): one stack whose attention head groups see different scales, each over its
own window of the past (e.g. '0:8,8:256,256:512': scale-1 heads the last 8 tokens, scale-4 heads 8..255 back,
scale-16 heads 256..511 back). Keys and values of a group are the layer's normed input pooled causally at its scale.
"""

import flax.linen as nn

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.layers import FeedForward, layer_norm, scan_blocks, stream_positions
from hourglass_jax.model.scale_attention import ScaleAttention, retina_mask
from hourglass_jax.model.scale_resampling import pyramid


def check_windows_fit(cfg: ModelConfig, length: int) -> None:
  """Raises when a window starts beyond a `length`-token sequence (its heads would never see a token)."""
  scales = cfg.parsed_scales
  for scale, (start, stop) in zip(scales.factors, scales.windows):
    if start >= length:
      raise ValueError(f"model.retina_windows={cfg.retina_windows!r}: window {start}:{stop} of the scale-{scale} "
                       f"heads starts beyond this {length}-token sequence, so those heads would see nothing; use "
                       f"sequences longer than {start} tokens (pad prompts at the end: it is causal-safe) or "
                       "shrink the windows.")


class RetinaBlock(nn.Module):
  """Pre-LN block: x + drop(RetinaAttn(LN x)); x + drop(FFN(LN x))."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    cfg = self.cfg
    scales = cfg.parsed_scales
    x_BxLxD = nn.with_logical_constraint(x_BxLxD, ("batch", "length", "embed"))
    length = x_BxLxD.shape[1]
    h_BxLxD = layer_norm(cfg, "attention_norm")(x_BxLxD)
    kvs = pyramid(cfg, h_BxLxD, scales.factors, deterministic)
    masks = [retina_mask(length, s, start, stop) for s, (start, stop) in zip(scales.factors, scales.windows)]
    positions_k = [stream_positions(length // s, s) for s in scales.factors]
    h_BxLxD = ScaleAttention(cfg, scales.heads, name="attention")(
        h_BxLxD, kvs, stream_positions(length, 1), positions_k, masks, deterministic)
    x_BxLxD = x_BxLxD + nn.Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)
    h_BxLxD = FeedForward(cfg, name="mlp")(layer_norm(cfg, "mlp_norm")(x_BxLxD), deterministic)
    return x_BxLxD + nn.Dropout(cfg.dropout)(h_BxLxD, deterministic=deterministic)


class Retina(nn.Module):
  """The single-level `hierarchy` ('12@1') of retina blocks (scanned, params under 'blocks'), ending with its own
  LayerNorm."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    num_layers = self.cfg.parsed_hierarchy.levels[0][0]
    x_BxLxD = scan_blocks(self.cfg, RetinaBlock, num_layers, x_BxLxD, deterministic)
    return layer_norm(self.cfg, "final_norm")(x_BxLxD)
