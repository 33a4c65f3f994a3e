"""Learned shortening for a config file: its shortened levels pool dynamic segments (configs/dynamic.py,
configs/enwik8_dynamic.py)."""

import itertools

import ml_collections

from hourglass_jax.model.hourglass.dynamic.level import level_predictors
from hourglass_jax.model.hourglass.dynamic.predictors import resolve
from hourglass_jax.model.hourglass.hierarchy import parse_hierarchy


def with_dynamic_shortening(cfg: ml_collections.ConfigDict, predictor: str, config_name: str,
                            inner_layers: tuple[int, int] | None = None,
                            cpu: bool = False) -> ml_collections.ConfigDict:
  """`cfg` (one shortened level, '2@1 4@4 2@1') with shorten='dynamic' and boundaries=`predictor` (from the file's
  ':predictor' argument). Several names ('whitespace,gumbel': outermost first) nest as many dynamic levels, each
  past the first with `inner_layers[0]` layers before and after it, the innermost `inner_layers[1]` at the center
  ('2@1 2@4 4@16 2@4 2@1'). A level's factor is the file's, or the segment length its predictor fixes. The loss
  weight is the one the predictors with a loss share (H-Net's 0.03 where every one routes), else the default; on the
  `cpu` preset a single predictor's `cpu_loss_weight`, where it has one."""
  try:
    predictors = [resolve(name.strip()) for name in predictor.split(",")]
  except ValueError as error:
    raise ValueError(f"configs/{config_name}.py: {error} Name one per level, e.g. "
                     f"--config=configs/{config_name}.py:gumbel or :whitespace,gumbel.") from None
  if len(predictors) > 1 and not inner_layers:
    raise ValueError(f"configs/{config_name}.py:{predictor} names {len(predictors)} predictors; the file has one "
                     "dynamic level. Set model.hierarchy and model.boundaries for more.")
  hierarchy = parse_hierarchy(cfg.model.hierarchy)
  (outer, _), (center, factor) = hierarchy.levels
  factors = [p.segment_length() or factor for p in predictors]
  if len(predictors) > 1 or factors[0] != factor:
    inner = [inner_layers[0]] * (len(predictors) - 1) if inner_layers else []
    totals = list(itertools.accumulate(factors, lambda total, k: total * k, initial=1))
    level = lambda layers: [f"{n}@{total}" for n, total in zip(layers, totals)]
    cfg.model.hierarchy = " ".join(level([outer] + inner) + [f"{inner_layers[1] if inner else center}@{totals[-1]}"]
                                   + level([hierarchy.post_layers[0]] + inner)[::-1])
  cfg.model.update(shorten="dynamic", upsample="repeat", boundaries=",".join(p.key for p in predictors))
  level_predictors(parse_hierarchy(cfg.model.hierarchy), cfg.model.upsample, tuple(predictors),
                   f"configs/{config_name}.py:{predictor}: model.")
  weights = {p.loss_weight for p in predictors} - {None}
  if cpu and len(predictors) == 1 and predictors[0].cpu_loss_weight:
    weights = {predictors[0].cpu_loss_weight}
  if len(weights) == 1:
    cfg.model.boundary_loss_weight = weights.pop()
  return cfg
