"""Learned shortening for a config file: its shortened levels pool dynamic segments (configs/dynamic.py,
configs/enwik8_dynamic.py)."""

import ml_collections

from hourglass_jax.model.hourglass.dynamic.level import level_predictors
from hourglass_jax.model.hourglass.hierarchy import parse_hierarchy
from hourglass_jax.model.hourglass.dynamic.predictors import PREDICTORS, resolve


def with_dynamic_shortening(cfg: ml_collections.ConfigDict, predictor: str, config_name: str,
                            inner_layers: tuple[int, int] | None = None) -> ml_collections.ConfigDict:
  """`cfg` (one shortened level, '2@1 4@4 2@1') with shorten='dynamic' and boundaries=`predictor` (from the file's
  ':predictor' argument). Several names ('whitespace,gumbel': outermost first) nest as many dynamic levels, each
  past the first with `inner_layers[0]` layers before and after it, the innermost `inner_layers[1]` at the center
  ('2@1 2@4 4@16 2@4 2@1'). A level's factor is the file's, or the segment length its predictor fixes. The loss
  weight is the one the predictors with a loss share (H-Net's 0.03 where every one routes), else the default."""
  names = [name.strip() for name in predictor.split(",")]
  for name in names:
    if not any(cls.parse(name) is not None for cls in PREDICTORS.values()):
      raise ValueError(f"configs/{config_name}.py: unknown boundary predictor {name!r}; choose one of "
                       f"{', '.join(PREDICTORS)}, or one per level (e.g. --config=configs/{config_name}.py:gumbel "
                       f"or :whitespace,gumbel).")
  if len(names) > 1 and not inner_layers:
    raise ValueError(f"configs/{config_name}.py:{predictor} names {len(names)} predictors; the file has one dynamic "
                     "level. Set model.hierarchy and model.boundaries for more.")
  hierarchy = parse_hierarchy(cfg.model.hierarchy)
  (outer, _), (center, factor) = hierarchy.levels
  factors = [resolve(name)[0].segment_length(**resolve(name)[1]) or factor for name in names]
  if len(names) > 1 or factors[0] != factor:
    inner = [inner_layers[0]] * (len(names) - 1) if inner_layers else []
    totals = [1]
    for k in factors:
      totals.append(totals[-1] * k)
    level = lambda layers: [f"{n}@{total}" for n, total in zip(layers, totals)]
    cfg.model.hierarchy = " ".join(level([outer] + inner) + [f"{inner_layers[1] if inner else center}@{totals[-1]}"]
                                   + level([hierarchy.post_layers[0]] + inner)[::-1])
  cfg.model.update(shorten="dynamic", upsample="repeat", boundaries=",".join(names))
  level_predictors(parse_hierarchy(cfg.model.hierarchy), cfg.model.upsample, predictor,
                   f"configs/{config_name}.py:{predictor}: model.")
  weights = {resolve(name)[0].loss_weight for name in names} - {None}
  if len(weights) == 1:
    cfg.model.boundary_loss_weight = weights.pop()
  return cfg
