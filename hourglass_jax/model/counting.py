"""Analytic parameter and FLOP counts per level, for any ModelConfig (no tracing, no devices).

FLOPs are forward-pass matmul FLOPs (2 per multiply-add) for one sequence, counting attention as the full
square XLA computes (masked entries included). A training step costs about 3x the forward.
"""

import dataclasses

from hourglass_jax.model.config import ModelConfig


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


def _ffn(cfg: ModelConfig, tokens: int) -> tuple[int, int]:
  d, f = cfg.d_model, cfg.d_ff
  return 2 * d * f + f + d, 2 * 2 * tokens * d * f


def _stack(cfg: ModelConfig, num_layers: int, tokens: int) -> tuple[int, int]:
  attn_p, attn_f = _attention(cfg, tokens, tokens)
  ffn_p, ffn_f = _ffn(cfg, tokens)
  block_p = attn_p + ffn_p + 2 * _norm(cfg.d_model)
  return num_layers * block_p + _norm(cfg.d_model), num_layers * (attn_f + ffn_f)


def _attention_tail(cfg: ModelConfig, queries: int, keys: int) -> tuple[int, int]:
  attn_p, attn_f = _attention(cfg, queries, keys)
  ffn_p, ffn_f = _ffn(cfg, queries)
  return attn_p + ffn_p + _norm(cfg.d_model), attn_f + ffn_f


def _shorten(cfg: ModelConfig, k: int, length: int) -> tuple[int, int]:
  d, short = cfg.d_model, length // k
  params, flops = 0, 0
  if cfg.shorten.endswith("linear"):
    params, flops = k * d * d + d, 2 * short * k * d * d
  if cfg.shorten.startswith("attention_"):
    tail_p, tail_f = _attention_tail(cfg, short, length)
    params, flops = params + tail_p + 2 * _norm(d), flops + tail_f
  return params, flops


def _upsample(cfg: ModelConfig, k: int, length: int) -> tuple[int, int]:
  d, short = cfg.d_model, length // k
  if cfg.upsample == "none":
    return 0, 0
  params, flops = _norm(d), 0
  if cfg.upsample.endswith("linear"):
    params, flops = params + d * k * d + k * d, 2 * short * d * k * d
  if cfg.upsample.startswith("attention_"):
    tail_p, tail_f = _attention_tail(cfg, length, short)
    params, flops = params + tail_p + 2 * _norm(d), flops + tail_f
  return params, flops


def count(cfg: ModelConfig, seq_len: int) -> list[Part]:
  """Per-part parameter and forward-FLOP counts for one sequence of `seq_len` tokens (padded as the model pads)."""
  hierarchy = cfg.parsed_hierarchy
  d, vocab = cfg.d_model, cfg.vocab_size
  length = -(-seq_len // hierarchy.total_factor) * hierarchy.total_factor
  parts = [Part("embed", 1, length, 0, vocab * d, 0)]
  ups = []
  for level, (num_pre, factor) in enumerate(hierarchy.levels):
    tokens = length // factor
    if level == hierarchy.depth:
      parts.append(Part(f"center@{factor}", factor, tokens, num_pre, *_stack(cfg, num_pre, tokens)))
      break
    k = hierarchy.relative_factor(level)
    parts.append(Part(f"pre@{factor}", factor, tokens, num_pre, *_stack(cfg, num_pre, tokens)))
    parts.append(Part(f"shorten@{factor}->{factor * k}", factor, tokens, 0, *_shorten(cfg, k, tokens)))
    num_post = hierarchy.post_layers[level]
    ups.append(Part(f"post@{factor}", factor, tokens, num_post, *_stack(cfg, num_post, tokens)))
    ups.append(Part(f"upsample@{factor * k}->{factor}", factor, tokens, 0, *_upsample(cfg, k, tokens)))
  parts.extend(reversed(ups))
  parts.append(Part("head", 1, length, 0, d * vocab + vocab, 2 * length * d * vocab))
  return parts


def total_params(cfg: ModelConfig) -> int:
  return sum(p.params for p in count(cfg, cfg.parsed_hierarchy.total_factor))


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
