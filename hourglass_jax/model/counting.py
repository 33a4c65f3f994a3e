"""Analytic parameter and FLOP counts per level, for any ModelConfig (no tracing, no devices).

FLOPs are forward-pass matmul FLOPs (2 per multiply-add) for one sequence, counting attention as the full
square XLA computes (masked entries included). A training step costs about 3x the forward.
Parts are named `stage@factor`, the factor being the total shortening (multi-scale: the scale) they run at.
"""

import dataclasses

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hourglass.dynamic.level import max_segments


@dataclasses.dataclass(frozen=True)
class Part:
  """One piece of the model: its name, total shortening factor, sequence length there, layers, params, FLOPs."""
  name: str
  factor: int
  length: int
  layers: int
  params: int
  flops: int


def _norm(d: int) -> int:
  return 2 * d


def _attention(cfg: ModelConfig, queries: int, keys: int) -> tuple[int, int]:
  d = cfg.d_model
  params = 4 * (d * d + d)
  flops = 2 * d * d * (2 * queries + 2 * keys) + 2 * 2 * queries * keys * d
  if cfg.position == "relative":
    distances = queries + keys  # upper bound of distinct distances; the exact table is no longer than this
    params += d * d + 2 * d
    flops += 2 * distances * d * d + 2 * queries * distances * d
  return params, flops


def _block(cfg: ModelConfig, attention: tuple[int, int], tokens: int, norms: int) -> tuple[int, int]:
  """`attention`'s (params, FLOPs) with the feed-forward of its `tokens` output rows and `norms` LayerNorms."""
  d, f = cfg.d_model, cfg.d_ff
  return attention[0] + 2 * d * f + f + d + norms * _norm(d), attention[1] + 2 * 2 * tokens * d * f


def _stack(cfg: ModelConfig, num_layers: int, tokens: int) -> tuple[int, int]:
  block_p, block_f = _block(cfg, _attention(cfg, tokens, tokens), tokens, 2)
  return num_layers * block_p + _norm(cfg.d_model), num_layers * block_f


def _shorten(cfg: ModelConfig, k: int, length: int, level: int = 0) -> tuple[int, int]:
  d, short = cfg.d_model, length // k
  params, flops = 0, 0
  if cfg.shorten == "dynamic":  # mean pooling, and what the level's predictor adds
    params, flops = cfg.level_predictors[level].cost(cfg, length)
    if cfg.segment_pooling == "linear":  # k matrices; each position is projected by all k, then one is kept
      params, flops = params + k * d * d + d, flops + 2 * length * k * d * d
    return params, flops
  if cfg.shorten.endswith("linear"):
    params, flops = k * d * d + d, 2 * short * k * d * d
  if cfg.shorten.startswith("attention_"):
    tail_p, tail_f = _block(cfg, _attention(cfg, short, length), short, 3)
    params, flops = params + tail_p, flops + tail_f
  return params, flops


def _upsample(cfg: ModelConfig, k: int, length: int) -> tuple[int, int]:
  d, short = cfg.d_model, length // k
  if cfg.upsample == "none":
    return 0, 0
  params, flops = _norm(d), 0
  if cfg.upsample.endswith("linear"):
    params, flops = params + d * k * d + k * d, 2 * short * d * k * d
  if cfg.upsample.startswith("attention_"):
    tail_p, tail_f = _block(cfg, _attention(cfg, length, short), length, 3)
    params, flops = params + tail_p, flops + tail_f
  return params, flops


def _scale_attention(cfg: ModelConfig, queries: int, groups: list[tuple[int, int, int]]) -> tuple[int, int]:
  """Head groups (heads, keys, distinct distances) reading their own streams: MultiHeadAttention's params."""
  d, width = cfg.d_model, cfg.head_dim
  params, flops = _attention(cfg, queries, 0)[0], 2 * 2 * queries * d * d
  for heads, keys, distances in groups:
    flops += 2 * 2 * keys * d * heads * width + 2 * 2 * queries * keys * heads * width
    if cfg.position == "relative":
      flops += 2 * distances * d * heads * width + 2 * queries * distances * heads * width
  return params, flops


def _downsample(cfg: ModelConfig, k: int, tokens_out: int) -> tuple[int, int]:
  d = cfg.d_model
  return (k * d * d + d, 2 * tokens_out * k * d * d) if cfg.downsampler == "conv" else (0, 0)


def _topdown_upsample(cfg: ModelConfig, k: int, tokens_in: int) -> tuple[int, int]:
  d = cfg.d_model
  return (d * k * d + k * d, 2 * tokens_in * d * k * d) if cfg.upsampler == "transposed_conv" else (0, 0)


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
  parts.append(Part("aggregate@1", 1, length, 1, *_block(cfg, _scale_attention(cfg, length, groups), length, 2)))
  parts.append(Part("scale@1", 1, length, scales.layers[-1], *_stack(cfg, scales.layers[-1], length)))
  return parts


def _retina_parts(cfg: ModelConfig, length: int) -> list[Part]:
  scales, d = cfg.parsed_scales, cfg.d_model
  num_layers = cfg.parsed_hierarchy.levels[0][0]
  groups = [(n, length // s, min(stop, length)) for n, s, (_, stop) in zip(scales.heads, scales.factors,
                                                                          scales.windows)]
  pools = [_downsample(cfg, scales.relative_factor(i), length // scales.factors[i - 1])
           for i in range(1, len(scales.factors))]
  block_p, block_f = _block(cfg, _scale_attention(cfg, length, groups), length, 2)
  block_p, block_f = block_p + sum(p for p, _ in pools), block_f + sum(f for _, f in pools)
  return [Part("retina@1", 1, length, num_layers, num_layers * block_p + _norm(d), num_layers * block_f)]


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
