"""Nested dynamic levels (shorten='dynamic' at every shortened level of a multi-level hierarchy): exact causality
by perturbation for each predictor at the inner level and both position schemes, the per-level losses and rates
over the segment slots that hold positions, the analytic counts and clear errors. Decoding parity is in
test_decode.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import ModelConfig, build_model, counting
from hourglass_jax.model.hourglass.dynamic.level import max_segments
from hourglass_jax.model.hourglass.dynamic.predictors.base import binomial_prior_loss
from hourglass_jax.model.hourglass.dynamic.predictors.routing import ratio_loss
from hourglass_jax.model.hourglass.dynamic.segments import segment_ids, segments_holding
from hourglass_jax.testing import causality_violations
from hourglass_jax.train.loop.loop import bar_label
from tests.helpers import (BATCH, SMALL, centered_gumbel_levels, dynamic_variables, jitted_apply, load_config,
                           small_config)

NESTED = dict(hierarchy="1@1 1@2 1@4 1@2 1@1", shorten="dynamic", upsample="repeat")


def level_metrics(model, variables, tokens, **kwargs) -> list[dict]:
  """What each dynamic level sowed into 'metrics', outermost first."""
  metrics = jitted_apply(model)(variables, tokens, mutable=("metrics",), **kwargs)[1]["metrics"]["body"]
  levels = []
  while "shorten" in metrics:
    levels.append({name: float(value[0]) for name, value in metrics["shorten"].items()})
    metrics = metrics.get("inner", {})
  return levels


def mixed_variables(model, cfg, length: int, **kwargs):
  """The first of a fixed series of random draws under which a random sequence closes some segments and leaves
  others open at every learned level (nested 'gumbel' levels centred on the filled slots)."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, SMALL["vocab_size"], (1, length)), jnp.int32)
  for seed in range(40):
    variables = centered_gumbel_levels(model, dynamic_variables(model, tokens, seed=seed), tokens)
    rates = [level["boundary_rate"] for level in level_metrics(model, variables, tokens, **kwargs)]
    if all(0.1 < rate < 0.9 for rate, predictor in zip(rates, cfg.level_predictors) if predictor.key != "whitespace"):
      return variables
  raise AssertionError(f"no draw of variables gives {cfg.boundaries} a mixed boundary rate at every level")


CASES = [("gumbel", 12, "rope"), ("whitespace,routing", 11, "relative"), ("entropy,gumbel", 11, "rope"),
         ("routing", 12, "relative"), ("gumbel", 11, "relative"), ("whitespace,gumbel", 12, "rope")]
QUICK = set(CASES[:3])


@pytest.mark.parametrize("boundaries, length, position",
                         [case if case in QUICK else pytest.param(*case, marks=pytest.mark.slow) for case in CASES])
def test_nested_dynamic_levels_are_causal(boundaries, length, position):
  cfg = small_config(**NESTED, boundaries=boundaries, position=position)
  model = build_model(cfg)
  variables = mixed_variables(model, cfg, length)
  problems = causality_violations(lambda tokens: jitted_apply(model)(variables, tokens), length, SMALL["vocab_size"],
                                  batch_size=BATCH)
  assert not problems, problems[:3]


@pytest.mark.slow
def test_nested_gumbel_levels_are_causal_with_training_noise():
  cfg = small_config(**NESTED, boundaries="gumbel")
  model = build_model(cfg)
  key = jax.random.key(3)
  variables = mixed_variables(model, cfg, 12, deterministic=False, rngs={"dropout": key})

  def apply_one(tokens_L):
    return jitted_apply(model)(variables, tokens_L[None], deterministic=False, rngs={"dropout": key})[0]

  problems = causality_violations(jax.vmap(apply_one), 12, SMALL["vocab_size"], batch_size=BATCH)
  assert not problems, problems[:3]


def test_each_level_reports_its_rates_and_its_loss_over_the_slots_that_hold_positions():
  """The inner level's stream has M = max_segments slots, of which a row fills only its segments; the inner
  predictor's prior and rate count those alone (empty slots would pull the rate toward what an empty slot gets)."""
  cfg = small_config(**NESTED, boundaries="whitespace,gumbel", vocab_size=256)
  model = build_model(cfg)
  tokens = jnp.asarray(np.frombuffer(b"to be or not to be, that is the question: whether 'tis nobler in the mind"
                                     [:48], np.uint8)[None].astype(np.int32))
  variables = centered_gumbel_levels(model, dynamic_variables(model, tokens), tokens)
  outer, inner = level_metrics(model, variables, tokens)
  (_, sown) = jitted_apply(model)(variables, tokens, mutable=("intermediates", "losses"))
  cuts = sown["intermediates"]["body"]
  outer_cuts = np.asarray(cuts["shorten"]["boundaries"][0])[0]
  inner_cuts = np.asarray(cuts["inner"]["shorten"]["boundaries"][0])[0]
  filled = int(outer_cuts.sum()) + 1  # the segments closed and the open one
  assert filled < inner_cuts.shape[0] == max_segments(48, 2, cfg.segment_capacity)
  assert outer["boundary_rate"] == pytest.approx(outer_cuts.mean())
  assert inner["boundary_rate"] == pytest.approx(inner_cuts[:filled].mean())
  assert inner["shortening_rate"] == pytest.approx(1 / inner_cuts[:filled].mean())
  prior = float(sown["losses"]["body"]["inner"]["shorten"]["boundary_prior"][0])
  assert prior == pytest.approx(float(binomial_prior_loss(inner_cuts[None, :filled], 1 / 2)), rel=1e-5)


def test_masked_losses_equal_the_losses_of_the_rows_cut_to_length():
  rng = np.random.default_rng(0)
  b_BxL = jnp.asarray(rng.random((3, 10)) < 0.4, jnp.float32)
  p_BxL = jnp.asarray(rng.random((3, 10)), jnp.float32)
  lengths_B = jnp.asarray([10, 4, 7])
  per_row = [float(binomial_prior_loss(b_BxL[i:i + 1, :n], 0.25)) for i, n in enumerate([10, 4, 7])]
  assert float(binomial_prior_loss(b_BxL, 0.25, lengths_B)) == pytest.approx(np.mean(per_row), rel=1e-5)
  flat = lambda a: jnp.concatenate([a[0, :10], a[1, :4], a[2, :7]])[None]
  assert float(ratio_loss(b_BxL, p_BxL, 4, lengths_B)) == pytest.approx(float(ratio_loss(flat(b_BxL), flat(p_BxL),
                                                                                         4)), rel=1e-5)


def test_segments_holding_counts_the_segments_of_each_rows_positions():
  boundaries = jnp.asarray([[0, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], bool)
  ids = segment_ids(boundaries, 4)  # row 1 overflows into the merged tail 3
  np.testing.assert_array_equal(segments_holding(ids), [3, 4, 1])
  np.testing.assert_array_equal(segments_holding(ids, jnp.asarray([2, 3, 0])), [1, 3, 0])
  np.testing.assert_array_equal(segments_holding(ids, jnp.asarray([3, 6, 6])), [2, 4, 1])


def test_analytic_counts_follow_nested_dynamic_levels():
  """Params as initialised (each level's own predictor); each level runs over the slots of the level above."""
  cfg = small_config(**NESTED, boundaries="entropy,routing", segment_capacity=1.5)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"]
  assert "router" in shapes["body"]["inner"]["shorten"] and "entropy" in shapes["body"]["shorten"]
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)
  parts = {part.name: part.length for part in counting.count(cfg, 48)}
  first = max_segments(48, 2, 1.5)
  assert parts["pre@2"] == first and parts["center@4"] == max_segments(first, 2, 1.5)


@pytest.mark.parametrize("overrides, message", [
    (dict(boundaries="gumbel,whitespace"), "level 2 reads the segments of the level above.*'gumbel,gumbel'"),
    (dict(boundaries="routing,entropy"), "'entropy' cannot cut it"),
    (dict(boundaries="gumbel,gumbel,gumbel"), "names 3 predictors for 2 shortened levels"),
    (dict(boundaries="gumbel,spaces"), "model.boundaries='spaces' is not supported"),
    (dict(upsample="attention_repeat"), "upsample='repeat'"),
])
def test_bad_nested_settings_are_named(overrides, message):
  with pytest.raises(ValueError, match=message):
    small_config(**dict(NESTED, **overrides))


@pytest.mark.parametrize("name, single_routing_weight", [("dynamic", 0.3), ("enwik8_dynamic", 0.03)])
def test_two_predictors_make_a_preset_of_two_dynamic_levels(name, single_routing_weight):
  cfg = ModelConfig.from_dict(load_config(name, "whitespace,gumbel").model)
  assert cfg.parsed_hierarchy.depth == 2 and tuple(p.key for p in cfg.level_predictors) == ("whitespace", "gumbel")
  assert cfg.boundary_loss_weight == 1.0
  assert load_config(name, "whitespace,routing").model.boundary_loss_weight == 0.03  # routing's is the only loss
  assert load_config(name, "routing").model.boundary_loss_weight == single_routing_weight
  assert load_config(name, "gumbel,routing").model.boundary_loss_weight == 1.0
  with pytest.raises(ValueError, match="level 2 reads the segments of the level above"):
    load_config(name, "gumbel,whitespace")
  assert ModelConfig.from_dict(load_config(name, "gumbel,gumbel,gumbel").model).parsed_hierarchy.depth == 3


def test_the_progress_bar_names_each_levels_metrics_apart():
  assert bar_label("body/shorten/boundary_rate") == "boundary_rate"
  assert bar_label("body/inner/shorten/boundary_rate") == "boundary_rate[2]"
  assert bar_label("body/inner/inner/shorten/segment_overflow") == "segment_overflow[3]"
