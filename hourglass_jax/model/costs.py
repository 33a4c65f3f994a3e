"""Analytic (parameters, forward FLOPs) of the blocks every model is built of: LayerNorms, attention and the
feed-forward residual. FLOPs are matmul FLOPs (2 per multiply-add), attention counted as the full square XLA
computes (masked entries included). `counting` adds them up per part; a resampling method counts its own with them.
`cfg`: anything with the block settings (d_model, d_ff, position: a ModelConfig or LayerConfig)."""


def norm(d: int) -> int:
  return 2 * d


def attention(cfg, queries: int, keys: int) -> tuple[int, int]:
  d = cfg.d_model
  params = 4 * (d * d + d)
  flops = 2 * d * d * (2 * queries + 2 * keys) + 2 * 2 * queries * keys * d
  if cfg.position == "relative":
    distances = queries + keys  # upper bound of distinct distances; the exact table is no longer than this
    params += d * d + 2 * d
    flops += 2 * distances * d * d + 2 * queries * distances * d
  return params, flops


def block(cfg, attention_cost: tuple[int, int], tokens: int, norms: int) -> tuple[int, int]:
  """`attention_cost` (params, FLOPs) with the feed-forward of its `tokens` output rows and `norms` LayerNorms."""
  d, f = cfg.d_model, cfg.d_ff
  return (attention_cost[0] + 2 * d * f + f + d + norms * norm(d),
          attention_cost[1] + 2 * 2 * tokens * d * f)
