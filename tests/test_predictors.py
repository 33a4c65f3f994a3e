"""The boundary predictors' conformance grid, then each predictor's own rule. Every example name a registered
predictor declares (`EXAMPLES`) is causal by perturbation in evaluation and in training, decodes like the forward
pass at batch 13 (its rows closing segments at their own steps, where its cuts depend on the tokens), counts its
parameters as initialised, keeps the parameter paths checkpoints were written with and a decoding state of its own,
and has a CPU and an enwik8 preset: a new predictor gets the whole grid by registering. Then 'whitespace' with run
bytes, and 'every<N>' (AU-Net's nested splits) at nested levels."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from hourglass_jax import nn as hnn
from hourglass_jax.cli.boundaries import level_boundaries
from hourglass_jax.data.builders.embedded import stdlib_bytes
from hourglass_jax.model import ModelConfig, build_model, counting, decode
from hourglass_jax.model.hourglass import CODE_BOUNDARY_BYTES, WHITESPACE_BYTES, whitespace_boundaries
from hourglass_jax.model.hourglass.dynamic.predictors import BOUNDARY_PREDICTORS, EXAMPLES, PREDICTORS, resolve
from hourglass_jax.testing import causality_violations, random_variables
from tests.helpers import (BATCH, LENGTHS, SMALL, TOKENS, assert_causal, assert_decoding_matches_forward, describe,
                           eval_boundaries, jitted_apply, load_config, mixed_variables, model_and_params, option_grid,
                           small_config)

DYNAMIC = dict(hierarchy="1@1 2@3 1@1", shorten="dynamic", upsample="repeat")


def quick(cases, every_value: bool = True) -> list:
  """The first case of each example, and of each option value the firsts leave out (`every_value`): the cases
  `make test-fast` runs (the full suite runs them all)."""
  chosen = list(dict.fromkeys(next(case for case in cases if case[0] == example) for example in EXAMPLES))
  for i in range(1, len(cases[0]) if every_value else 1):
    chosen += [next(case for case in cases if case[i] == value) for value in dict.fromkeys(case[i] for case in cases)
               if all(case[i] != value for case in chosen)]
  return chosen


def marked(cases) -> list:
  return [case if case in quick(cases) else pytest.param(*case, marks=pytest.mark.slow) for case in cases]


# --- the grid ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("boundaries, length, position, pooling, mode", marked(
    option_grid(EXAMPLES, LENGTHS, ("rope", "relative"), ("mean", "linear"), ("evaluation", "training"))))
def test_each_example_is_causal(boundaries, length, position, pooling, mode):
  """In training each row is its own call with the same rng, so that a learned predictor's noise ('gumbel') is the
  same in the perturbed rows as in the first one."""
  model = build_model(small_config(**DYNAMIC, boundaries=boundaries, position=position, segment_pooling=pooling))
  if mode == "evaluation":
    variables = mixed_variables(model, length)
    apply = lambda tokens: jitted_apply(model)(variables, tokens)
  else:
    key = jax.random.key(3)
    variables = mixed_variables(model, length, deterministic=False, rngs={"dropout": key})
    apply = jax.vmap(lambda tokens_L: jitted_apply(model)(variables, tokens_L[None], deterministic=False,
                                                          rngs={"dropout": key})[0])
  problems = causality_violations(apply, length, SMALL["vocab_size"], batch_size=BATCH)
  assert not problems, problems[:3]


# Every pair of example, position scheme and pooling (`option_grid`), then a setting of 'gumbel' and of 'whitespace'
# (position='relative' both: with each example's first case, every option value runs in `make test-fast`).
PAIRS = option_grid(EXAMPLES, ("rope", "relative"), ("mean", "linear"))
DECODING = [small_config(**DYNAMIC, boundaries=b, position=p, segment_pooling=pooling) for b, p, pooling in PAIRS] + [
    small_config(**DYNAMIC, boundaries="gumbel", position="relative", gumbel_evaluation="sample"),
    # runs of boundary bytes close one segment: TOKENS hold 10 such runs, merged across steps
    small_config(**DYNAMIC, boundaries="whitespace", position="relative", boundary_run_bytes=WHITESPACE_BYTES.decode())]


@pytest.mark.parametrize("case", [pytest.param(i, id=describe(cfg), marks=() if i >= len(PAIRS) or PAIRS[i] in quick(
    PAIRS, every_value=False) else pytest.mark.slow) for i, cfg in enumerate(DECODING)])
def test_each_example_decodes_like_the_forward_pass(case):
  """Prefill, decode_step and K-token extensions on the 13 rows of TOKENS. The rows close their segments at
  different steps, so each step runs the shortened level for some rows and not others, unless the predictor cuts
  by position alone (every input is cut alike)."""
  cfg = DECODING[case]
  model, params = model_and_params(cfg)
  cuts_BxL = eval_boundaries(model, {"params": params})
  assert 0 < cuts_BxL.mean() < 1
  assert len({row.tobytes() for row in cuts_BxL}) > 1 or (
      cuts_BxL == eval_boundaries(model, {"params": params}, np.ascontiguousarray(TOKENS[::-1]))).all()
  assert_decoding_matches_forward(cfg, case)


@pytest.mark.parametrize("boundaries", EXAMPLES)
@pytest.mark.parametrize("position, pooling", [("rope", "mean"), ("relative", "linear")])
def test_each_example_counts_its_parameters(boundaries, position, pooling):
  """Params as initialised (a predictor's own, 'linear' pooling's matrices); the center runs over max_segments
  positions."""
  cfg = small_config(**DYNAMIC, boundaries=boundaries, position=position, segment_capacity=1.5,
                     segment_pooling=pooling)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))["params"]
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)
  center = next(p for p in counting.count(cfg, 24) if p.name.startswith("center"))
  assert center.length == 1.5 * 24 / 3 + 1  # capacity x 24/3 segments and the merged tail


POOL = {"body/shorten/pool/bias": (32,), "body/shorten/pool/kernel": (3, 32, 32)}
PARAMS = {  # body/shorten/... as checkpoints were written
    "whitespace": {},
    "gumbel": {"body/shorten/predictor/hidden/bias": (32,), "body/shorten/predictor/hidden/kernel": (32, 32),
               "body/shorten/predictor/logit/bias": (1,), "body/shorten/predictor/logit/kernel": (32, 1)},
    "routing": {"body/shorten/router/key/kernel": (32, 32), "body/shorten/router/query/kernel": (32, 32)},
    "entropy": {"body/shorten/entropy/head/bias": (50,), "body/shorten/entropy/head/kernel": (32, 50),
                "body/shorten/entropy/threshold": ()},
    "every2": {}, "every3": {},
}
STATE = {"whitespace": {"run"}, "gumbel": set(), "routing": {"key", "seen"}, "entropy": {"entropy", "seen"},
         "every2": set(), "every3": set()}


@pytest.mark.parametrize("boundaries", EXAMPLES)
def test_each_example_keeps_its_parameter_paths_and_decodes_with_its_own_state(boundaries):
  assert boundaries in PARAMS and boundaries in STATE, f"record {boundaries!r}'s parameter paths and state here"
  cfg = small_config(**DYNAMIC, boundaries=boundaries, segment_pooling="linear")
  shapes = nn.meta.unbox(jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32)))
  shapes = shapes["params"]
  flat = {"/".join(path): leaf.shape for path, leaf in traverse_util.flatten_dict(shapes).items()
          if "shorten" in path}
  assert flat == {**POOL, **PARAMS[boundaries]}
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  state = decode.init_cache(cfg, 2, 12, params)["state"]["state"]  # after each of the 12 positions
  assert set(state) == {"sum", "size", "completed"} | STATE[boundaries]
  assert all(leaf.shape[:2] == (2, 12) for leaf in state.values())


@pytest.mark.parametrize("name, params", [("dynamic", 1.6e6), ("enwik8_dynamic", 38e6)])
@pytest.mark.parametrize("boundaries", EXAMPLES)
def test_each_example_has_a_cpu_and_an_enwik8_preset(name, params, boundaries):
  cfg = ModelConfig.from_dict(load_config(name, boundaries).model)
  assert (cfg.shorten, cfg.upsample, cfg.boundaries) == ("dynamic", "repeat", boundaries)
  assert cfg.parsed_hierarchy.relative_factor(0) == (resolve(boundaries).segment_length() or 4)  # every<N>: N
  assert 1.0 <= counting.total_params(cfg) / params < 1.1
  # The CPU preset trains on Python: its bytes cut it near 1/4 (see below); enwik8 keeps the default.
  code_bytes = (CODE_BOUNDARY_BYTES.decode(), " ") if name == "dynamic" else (WHITESPACE_BYTES.decode(), "")
  assert (cfg.boundary_bytes, cfg.boundary_run_bytes) == code_bytes
  with pytest.raises(ValueError, match=f"configs/{name}.py: boundaries='spaces' is not supported"):
    load_config(name, "spaces")


def test_the_registry_lists_every_predictor_and_its_examples_in_order_and_names_the_choices():
  assert BOUNDARY_PREDICTORS == ("whitespace", "gumbel", "routing", "entropy")
  assert EXAMPLES == BOUNDARY_PREDICTORS + ("every2", "every3")
  assert all(issubclass(resolve(example), tuple(PREDICTORS.values())) for example in EXAMPLES)
  assert resolve("gumbel") is PREDICTORS["gumbel"] and resolve(resolve("every2")) is resolve("every2")
  with pytest.raises(ValueError, match="model.boundaries='spaces' is not supported; choose one of whitespace"):
    resolve("spaces", "model.boundaries")


# --- 'whitespace' with run bytes (model.boundary_run_bytes): a run of them closes one segment, after its first byte

WHITESPACE = dict(DYNAMIC, boundaries="whitespace")
# Every default boundary byte merges its runs: over random tokens of 50 ids, about one pair in 17 is a run.
RUNS = dict(WHITESPACE, boundary_run_bytes=WHITESPACE_BYTES.decode())
CODE = b"def f(a,  b):\n        return a * b\n"


def segments(text: bytes, *args) -> list[bytes]:
  """`text` cut after each of whitespace_boundaries(text, *args)."""
  bytes_L = np.frombuffer(text, np.uint8)
  cuts = np.flatnonzero(np.asarray(whitespace_boundaries(jnp.asarray(bytes_L[None].astype(np.int32)), *args))[0])
  return [bytes(part) for part in np.split(bytes_L, cuts + 1) if len(part)]


def test_a_run_of_spaces_closes_one_segment_after_its_first_space():
  assert segments(CODE) == [b"def ", b"f(", b"a,", b" ", b" ", b"b)", b":", b"\n", *[b" "] * 8, b"return ", b"a ",
                            b"* ", b"b\n"]
  assert segments(CODE, CODE_BOUNDARY_BYTES, b" ") == [b"def ", b"f(", b"a,", b" ", b" b)", b":", b"\n", b" ",
                                                       b"       return ", b"a ", b"*", b" ", b"b\n"]


def test_code_bytes_with_space_runs_cut_the_embedded_corpus_near_one_byte_in_four():
  """The preset the study runs on code: every byte of CODE_BOUNDARY_BYTES cuts 0.4 of Python source, and merging
  runs of spaces (indentation) brings it to about 1/4, where fixed shortening by 4 is."""
  tokens_1xL = jnp.asarray(stdlib_bytes(2_000_000)[None].astype(np.int32))
  every = float(whitespace_boundaries(tokens_1xL, CODE_BOUNDARY_BYTES).mean())
  merged = float(whitespace_boundaries(tokens_1xL, CODE_BOUNDARY_BYTES, b" ").mean())
  assert every > 0.38 and abs(merged - 0.25) < 0.025, (every, merged)


def test_the_model_cuts_where_whitespace_boundaries_merges_runs():
  model = build_model(small_config(**RUNS))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (8, 24)), jnp.int32)
  _, sown = model.apply(random_variables(model, tokens), tokens, mutable=["intermediates"])
  cuts = np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])
  merged = np.asarray(whitespace_boundaries(tokens, WHITESPACE_BYTES, WHITESPACE_BYTES))
  assert (merged != np.asarray(whitespace_boundaries(tokens))).any()  # else no run was merged
  np.testing.assert_array_equal(cuts, merged)


@pytest.mark.parametrize("length, position", [(12, "rope"), pytest.param(11, "relative", marks=pytest.mark.slow)])
def test_merging_runs_stays_causal(length, position):
  assert_causal(small_config(**RUNS, position=position), length)


def test_run_bytes_outside_the_boundary_bytes_are_named():
  with pytest.raises(ValueError, match=r"boundary_run_bytes=' x' has 'x', not in model.boundary_bytes"):
    small_config(**WHITESPACE, boundary_run_bytes=" x")


def test_runs_for_a_learned_predictor_or_of_another_shape_are_refused():
  x_BxLxD = jnp.zeros((2, 12, 16))
  runs_BxL = jnp.zeros((2, 12), bool)
  gumbel = hnn.Hourglass(hierarchy="1@1 1@3 1@1", shorten="dynamic", upsample="repeat", boundaries="gumbel",
                         num_heads=2)
  with pytest.raises(ValueError, match="only 'whitespace' reads"):
    gumbel.init(jax.random.key(0), x_BxLxD, runs_BxL=runs_BxL)
  given = gumbel.clone(boundaries="whitespace")
  with pytest.raises(ValueError, match="runs_BxL has shape"):
    given.init(jax.random.key(0), x_BxLxD, boundaries_BxL=runs_BxL, runs_BxL=runs_BxL[:, :6])


# --- 'every<N>' at nested levels: a level cuts its stream, the segments of the level above, every N entries -------

TWO_LEVELS = "1@1 1@2 1@4 1@2 1@1"
THREE_LEVELS = "1@1 1@2 1@4 1@8 1@4 1@2 1@1"  # every2 at the inner levels: factor 2 each
TEXT = b"the cat sat on a mat, and a dog ran by; then it sat too"
# Three rows of text whose words end at different bytes: each decoding step closes segments in some rows only.
ROWS = np.array([list(b"the cat sat on it "), list(b"hello, world: a b "), list(b"def f(x):\n  y = x ")],
                np.int32)
NESTED = [("whitespace,every2", TWO_LEVELS), ("whitespace,every2,every2", THREE_LEVELS)]


@pytest.mark.parametrize("boundaries, hierarchy, length", [(*NESTED[0], 12), (*NESTED[1], 11)])
def test_nested_splits_are_causal(boundaries, hierarchy, length):
  model = build_model(small_config(**dict(DYNAMIC, hierarchy=hierarchy), boundaries=boundaries))
  variables = random_variables(model, jnp.zeros((1, length), jnp.int32))
  problems = causality_violations(jax.jit(lambda tokens: model.apply(variables, tokens)), length, SMALL["vocab_size"],
                                  batch_size=BATCH)
  assert not problems, problems[:3]


def test_each_nested_level_closes_after_every_n_segments_of_the_level_above():
  """Words, pairs of words, groups of four words: a level's n-th closing byte is the 2n-th of the level above."""
  cfg = small_config(**dict(DYNAMIC, hierarchy=THREE_LEVELS), boundaries="whitespace,every2,every2", vocab_size=256)
  model = build_model(cfg)
  params = random_variables(model, jnp.zeros((1, 8), jnp.int32))["params"]
  levels = level_boundaries(model, params, TEXT)
  closing = [np.flatnonzero(closes) for closes, _ in levels]
  words = np.flatnonzero(np.isin(np.frombuffer(TEXT, np.uint8), list(b" ,;")))
  np.testing.assert_array_equal(closing[0], words)
  np.testing.assert_array_equal(closing[1], closing[0][1::2])
  np.testing.assert_array_equal(closing[2], closing[1][1::2])
  for _, cuts in levels[1:]:  # on its own stream: after slots 1, 3, 5, ...
    np.testing.assert_array_equal(cuts, (np.arange(len(cuts)) + 1) % 2 == 0)
  assert "shorten" not in params["body"]["inner"]  # no parameters (mean pooling)


@pytest.mark.parametrize("boundaries, hierarchy", NESTED)
def test_nested_splits_decode_like_the_forward_pass(boundaries, hierarchy):
  """Prefill (0 or 5 tokens) and decode_step give the forward pass's logits, rows closing at their own steps."""
  cfg = small_config(**dict(DYNAMIC, hierarchy=hierarchy), boundaries=boundaries, vocab_size=256)
  model = build_model(cfg)
  length = ROWS.shape[1] + (-ROWS.shape[1]) % cfg.pad_multiple
  params = decode.unbox_params(random_variables(model, jnp.zeros((1, 8), jnp.int32), seed=1))
  full_BxLxV = np.asarray(jax.jit(model.apply)({"params": params}, ROWS))
  step = jax.jit(lambda params, cache, token_B, t: decode.decode_step(params, cfg, cache, token_B, t))
  for prompt_len in (0, 5):
    if prompt_len:
      cache, first_BxV = decode.prefill(params, cfg, ROWS[:, :prompt_len], length)
      out = [np.asarray(first_BxV)]
    else:
      cache, out = decode.init_cache(cfg, len(ROWS), length, params), []
    for t in range(prompt_len, ROWS.shape[1]):
      cache, logits_BxV = step(params, cache, ROWS[:, t], t)
      out.append(np.asarray(logits_BxV))
    np.testing.assert_allclose(np.stack(out, axis=1), full_BxLxV[:, max(prompt_len - 1, 0):], atol=1e-4, rtol=0,
                               err_msg=f"{boundaries} prompt {prompt_len}")


def test_the_cpu_preset_nests_words_pairs_and_groups_of_four():
  cfg = ModelConfig.from_dict(load_config("dynamic", "whitespace,every2,every2").model)
  assert cfg.hierarchy == "2@1 2@4 2@8 4@16 2@8 2@4 2@1"
  assert tuple(p.key for p in cfg.level_predictors) == ("whitespace", "every2", "every2")
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)


def test_every_n_names_are_parsed_and_checked():
  every5 = resolve("every5")
  assert every5.count == every5.segment_length() == 5 and every5.key == "every5" and resolve("every5") is every5
  with pytest.raises(ValueError, match="2 <= N <= "):
    small_config(**DYNAMIC, boundaries="every1")
  with pytest.raises(ValueError, match="choose one of whitespace, gumbel, routing, entropy, every<N>"):
    small_config(**DYNAMIC, boundaries="everytwo")
  small_config(**dict(DYNAMIC, hierarchy=TWO_LEVELS), boundaries="gumbel,every2")  # any level


@pytest.mark.parametrize("boundaries, checked", [("gumbel", True), ("entropy", True), ("whitespace", False),
                                                 ("routing", False), ("every4", False)])
def test_only_the_selected_predictors_settings_are_checked(boundaries, checked):
  """gumbel_temperature belongs to 'gumbel' (and 'entropy', which borrows it): a bad value is refused where one of
  them cuts, and left alone where it is not read; the base class's check runs for every predictor."""
  bad = dict(shorten="dynamic", upsample="repeat", boundaries=boundaries, gumbel_temperature=-1.0)
  if checked:
    with pytest.raises(ValueError, match=r"model.gumbel_temperature=-1.0 must be a finite number > 0"):
      small_config(**bad)
  else:
    assert small_config(**bad).boundaries == boundaries
  with pytest.raises(ValueError, match=r"model.boundary_loss_weight=-1.0 must be a finite number >= 0"):
    small_config(**dict(bad, gumbel_temperature=0.5, boundary_loss_weight=-1.0))


def test_a_predictor_whose_setting_clashes_with_anothers_is_refused_at_registration():
  """The predictors' settings are one namespace of config keys: a same-name setting with another default would
  silently replace the first one's, so `register` refuses it and leaves the registry as it was."""
  from hourglass_jax.model.hourglass.dynamic.predictors import base
  from hourglass_jax.model.layer_config import setting

  registered = dict(PREDICTORS)

  class Clashing(base.BoundaryPredictor):
    gumbel_temperature: float = setting(2.0)
    key = "clashing"
    module_name = "clashing"

  with pytest.raises(ValueError, match=r"predictor 'clashing': its setting 'gumbel_temperature' clashes with "
                                       r"'gumbel'.s setting of that name"):
    base.register(Clashing)
  assert PREDICTORS == registered
