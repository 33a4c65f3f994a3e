"""Analytic parameter and FLOP counts per level, for any ModelConfig (no tracing, no devices).

FLOPs are forward-pass matmul FLOPs (2 per multiply-add) for one sequence, counting attention as the full
square XLA computes (masked entries included). A training step costs about 3x the forward.
Parts are named `stage@factor`, the factor being the total shortening (multi-scale: the scale) they run at.
"""

import dataclasses

from hourglass_jax.model import costs
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hourglass.dynamic.level import max_segments
from hourglass_jax.model.resampling import downsampling, scale_upsampling, shortening, upsampling


@dataclasses.dataclass(frozen=True)
class Part:
  """One piece of the model: its name, total shortening factor, sequence length there, layers, params, FLOPs."""
  name: str
  factor: int
  length: int
  layers: int
  params: int
  flops: int


def _stack(cfg: ModelConfig, num_layers: int, tokens: int) -> tuple[int, int]:
  block_p, block_f = costs.block(cfg, costs.attention(cfg, tokens, tokens), tokens, 2)
  return num_layers * block_p + costs.norm(cfg.d_model), num_layers * block_f


def _shorten(cfg: ModelConfig, k: int, length: int, level: int = 0) -> tuple[int, int]:
  """The level's shortening: a fixed method's own count, or a dynamic level's."""
  if not cfg.dynamic:
    return shortening(cfg.shorten).cost(cfg, k, length)
  d = cfg.d_model  # mean pooling, and what the level's predictor adds
  params, flops = cfg.level_predictors[level].cost(cfg, length)
  if cfg.segment_pooling == "linear":  # k matrices; each position is projected by all k, then one is kept
    params, flops = params + k * d * d + d, flops + 2 * length * k * d * d
  return params, flops


def _upsample(cfg: ModelConfig, k: int, length: int) -> tuple[int, int]:
  return upsampling(cfg.upsample).cost(cfg, k, length)


def _scale_attention(cfg: ModelConfig, queries: int, groups: list[tuple[int, int, int]]) -> tuple[int, int]:
  """Head groups (heads, keys, distinct distances) reading their own streams: MultiHeadAttention's params."""
  d, width = cfg.d_model, cfg.head_dim
  params, flops = costs.attention(cfg, queries, 0)[0], 2 * 2 * queries * d * d
  for heads, keys, distances in groups:
    flops += 2 * 2 * keys * d * heads * width + 2 * 2 * queries * keys * heads * width
    if cfg.position == "relative":
      flops += 2 * distances * d * heads * width + 2 * queries * distances * heads * width
  return params, flops


def _downsample(cfg: ModelConfig, k: int, tokens_out: int) -> tuple[int, int]:
  return downsampling(cfg.downsampler).pool_cost(cfg, k, tokens_out)


def _topdown_upsample(cfg: ModelConfig, k: int, tokens_in: int) -> tuple[int, int]:
  return scale_upsampling(cfg.upsampler).unpool_cost(cfg, k, tokens_in)


def _hourglass_parts(cfg: ModelConfig, length: int) -> list[Part]:
  hierarchy = cfg.parsed_hierarchy
  parts = []
  ups = []
  stream = length  # a dynamic level's segment stream: max_segments of the stream above, whatever the boundaries
  for level, (num_pre, factor) in enumerate(hierarchy.levels):
    tokens = length // factor
    if cfg.shorten == "dynamic" and level:
      stream = tokens = max_segments(stream, hierarchy.relative_factor(level - 1), cfg.segment_capacity)
    if level == hierarchy.depth:
      parts.append(Part(f"center@{factor}", factor, tokens, num_pre, *_stack(cfg, num_pre, tokens)))
      break
    k = hierarchy.relative_factor(level)
    parts.append(Part(f"pre@{factor}", factor, tokens, num_pre, *_stack(cfg, num_pre, tokens)))
    parts.append(Part(f"shorten@{factor}->{factor * k}", factor, tokens, 0, *_shorten(cfg, k, tokens, level)))
    num_post = hierarchy.post_layers[level]
    ups.append(Part(f"post@{factor}", factor, tokens, num_post, *_stack(cfg, num_post, tokens)))
    ups.append(Part(f"upsample@{factor * k}->{factor}", factor, tokens, 0, *_upsample(cfg, k, tokens)))
  parts.extend(reversed(ups))
  return parts


def _topdown_parts(cfg: ModelConfig, length: int) -> list[Part]:
  scales, d = cfg.parsed_scales, cfg.d_model
  f = scales.factors
  parts = [Part(f"downsample@{f[i]}->{f[i - 1]}", f[i], length // f[i], 0,
                *_downsample(cfg, scales.relative_factor(i), length // f[i - 1])) for i in range(len(f) - 1, 0, -1)]
  for i, (factor, layers) in enumerate(zip(f, scales.layers)):
    tokens = length // factor
    if i:
      k = scales.relative_factor(i)
      parts.append(Part(f"upsample@{f[i - 1]}->{factor}", factor, tokens, 0, *_topdown_upsample(cfg, k, tokens // k)))
      parts.append(Part(f"merge@{factor}", factor, tokens, 0, 2 * d * d + d, 2 * tokens * 2 * d * d))
    parts.append(Part(f"scale@{factor}", factor, tokens, layers, *_stack(cfg, layers, tokens)))
  return parts


def _bottomup_parts(cfg: ModelConfig, length: int) -> list[Part]:
  scales = cfg.parsed_scales
  f = scales.factors
  parts = []
  for i in range(len(f) - 2, -1, -1):
    tokens = length // f[i]
    parts.append(Part(f"downsample@{f[i + 1]}->{f[i]}", f[i + 1], length // f[i + 1], 0,
                      *_downsample(cfg, scales.relative_factor(i + 1), tokens)))
    parts.append(Part(f"scale@{f[i]}", f[i], tokens, scales.layers[i], *_stack(cfg, scales.layers[i], tokens)))
  groups = [(n, length // s, length) for n, s in zip(scales.heads, f)]
  parts.append(Part("aggregate@1", 1, length, 1, *costs.block(cfg, _scale_attention(cfg, length, groups), length, 2)))
  parts.append(Part("scale@1", 1, length, scales.layers[-1], *_stack(cfg, scales.layers[-1], length)))
  return parts


def _retina_parts(cfg: ModelConfig, length: int) -> list[Part]:
  scales, d = cfg.parsed_scales, cfg.d_model
  num_layers = cfg.parsed_hierarchy.levels[0][0]
  groups = [(n, length // s, min(stop, length)) for n, s, (_, stop) in zip(scales.heads, scales.factors,
                                                                          scales.windows)]
  pools = [_downsample(cfg, scales.relative_factor(i), length // scales.factors[i - 1])
           for i in range(1, len(scales.factors))]
  block_p, block_f = costs.block(cfg, _scale_attention(cfg, length, groups), length, 2)
  block_p, block_f = block_p + sum(p for p, _ in pools), block_f + sum(f for _, f in pools)
  return [Part("retina@1", 1, length, num_layers, num_layers * block_p + costs.norm(d), num_layers * block_f)]


_BODY_PARTS = {"hourglass": _hourglass_parts, "vanilla": _hourglass_parts, "topdown": _topdown_parts,
               "bottomup": _bottomup_parts, "retina": _retina_parts}


def count(cfg: ModelConfig, seq_len: int) -> list[Part]:
  """Per-part parameter and forward-FLOP counts for one sequence of `seq_len` tokens (padded as the model pads)."""
  d, vocab = cfg.d_model, cfg.vocab_size
  length = -(-seq_len // cfg.pad_multiple) * cfg.pad_multiple
  parts = ([Part("embed", 1, length, 0, vocab * d, 0)] + _BODY_PARTS[cfg.kind](cfg, length)
           + [Part("head", 1, length, 0, d * vocab + vocab, 2 * length * d * vocab)])
  if cfg.draft_heads:  # in training and evaluation: two d x d matmuls and the output layer per head
    m = cfg.draft_heads
    parts.append(Part("draft_heads", 1, length, 0, m * (2 * d * d + 6 * d), 2 * length * m * (2 * d * d + d * vocab)))
  return parts


def total_params(cfg: ModelConfig) -> int:
  return sum(p.params for p in count(cfg, cfg.pad_multiple))


def forward_flops(cfg: ModelConfig, seq_len: int) -> int:
  return sum(p.flops for p in count(cfg, seq_len))


def format_table(cfg: ModelConfig, seq_len: int) -> str:
  """Human-readable per-part table with totals."""
  parts = count(cfg, seq_len)
  lines = [f"{'part':<22}{'factor':>7}{'length':>8}{'layers':>7}{'params':>14}{'GFLOPs/seq':>12}"]
  for p in parts:
    lines.append(f"{p.name:<22}{p.factor:>7}{p.length:>8}{p.layers:>7}{p.params:>14,}{p.flops / 1e9:>12.3f}")
  lines.append(f"{'total':<22}{'':>7}{'':>8}{sum(p.layers for p in parts):>7}"
               f"{sum(p.params for p in parts):>14,}{sum(p.flops for p in parts) / 1e9:>12.3f}")
  return "\n".join(lines)
