"""Incremental decoding: prefill + cached steps, and K-token extensions, equal the full forward pass for every kind
and option; sampling; errors. The parity grid covers every combination of options; a sample of it in which each
option runs once is unmarked, the rest is marked slow (`make test` and CI run it all, `make test-fast` the sample).
Each case prefills one prompt length besides 0 and extends by one K of 1, 2, 3, 5, 8 (by case);
HOURGLASS_FULL_DECODE_TESTS=1 takes every length (1, 5, 7 and a multiple) and every K."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import build_model, decode
from hourglass_jax.model.decode import sampling
from hourglass_jax.model.config import DOWNSAMPLERS, SHORTEN, UPSAMPLE, UPSAMPLERS
from hourglass_jax.model.decode.filters import filter_logits, sample_logits
from hourglass_jax.model.hourglass import BOUNDARY_PREDICTORS
from tests.helpers import (BATCH, BOTTOMUP, DYNAMIC, DYNAMIC_GEN, GEN_CASE, GEN_CFG, LENGTH, MULTI_LEVEL,
                           NESTED_CASES, RETINA, SINGLE_LEVEL, TOKENS, TOPDOWN, VOCAB,
                           assert_decoding_matches_forward, describe, dynamic_variables, eval_boundaries, extend_sizes,
                           jitted_apply, jitted_step, level_rates, model_and_params, multiscale_config, option_grid,
                           prompt_lengths, reference_program, run_reference, schedules, small_config)


def slow_unless(sampled: bool):
  return () if sampled else (pytest.mark.slow,)


def hourglass_cases():
  """Every pair of shorten x upsample x hierarchy x position values (`option_grid`: 20 cases, the product of 80
  with HOURGLASS_FULL_GRID=1); unmarked: a sample in which every shorten and every upsample option runs, with
  both hierarchies and both position schemes across it."""
  variants = list(itertools.product([SINGLE_LEVEL, MULTI_LEVEL], ["rope", "relative"]))
  sample = {(SHORTEN[i % len(SHORTEN)], upsample, *variants[i % len(variants)]) for i, upsample in enumerate(UPSAMPLE)}
  cases = option_grid(SHORTEN, UPSAMPLE, [SINGLE_LEVEL, MULTI_LEVEL], ["rope", "relative"])
  cases += sorted(sample - set(cases))
  return [pytest.param(*case, i, marks=slow_unless(case in sample)) for i, case in enumerate(cases)]


@pytest.mark.parametrize("shorten, upsample, hierarchy, position, case", hourglass_cases())
def test_hourglass_decoding_matches_forward(shorten, upsample, hierarchy, position, case):
  assert_decoding_matches_forward(small_config(hierarchy=hierarchy, shorten=shorten, upsample=upsample,
                                               position=position), case)


@pytest.mark.parametrize("position", ["rope", pytest.param("relative", marks=pytest.mark.slow)])
def test_vanilla_decoding_matches_forward(position):
  assert_decoding_matches_forward(small_config(kind="vanilla", hierarchy="2@1", position=position))


@pytest.mark.slow
@pytest.mark.parametrize("hierarchy", ["0@1 1@2 1@6 0@2 1@1", "1@1 1@5 1@1"])
def test_other_hierarchies_decoding_matches_forward(hierarchy):
  assert_decoding_matches_forward(small_config(hierarchy=hierarchy, shorten="attention_linear",
                                               upsample="attention_linear"))


@pytest.mark.parametrize("pooling", ["mean", "linear"])
def test_dynamic_decoding_past_the_segment_capacity_matches_forward(pooling):
  """segment_capacity 0.5 keeps 3 segments of the 12-position cache: most rows fill them and go on in the merged
  tail, whose tokens read the last completed segment and close nothing."""
  cfg = small_config(**DYNAMIC, boundaries="whitespace", segment_capacity=0.5, segment_pooling=pooling)
  model, params = model_and_params(cfg)
  closed_B = eval_boundaries(model, {"params": params}).sum(axis=1)
  assert (closed_B > 2).mean() > 0.5 and (closed_B <= 2).any()
  assert_decoding_matches_forward(cfg)


# Three rows of text (vocab 256) that every predictor cuts at different steps: the batch of the issue 45 report, where
# each decoding step closes a segment in some rows and not in others.
TEXT_ROWS = np.array([list(b"the cat sat "), list(b"hello, world"), list(b"def f(x):\n  ")], np.int32)


def text_rows_params(cfg):
  """The first draw of variables under which each of TEXT_ROWS closes some segments and leaves others open, and no
  two rows close at the same steps (so every step runs the shortened level for some rows only)."""
  model = build_model(cfg)
  for seed in range(40):
    params = decode.unbox_params(dynamic_variables(model, jnp.zeros((1, 12), jnp.int32), seed=seed))
    _, sown = jitted_apply(model)({"params": params}, TEXT_ROWS, mutable=("intermediates",))
    cuts = np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])
    if (0 < cuts.sum(axis=1)).all() and (cuts.sum(axis=1) < 11).all() and len({r.tobytes() for r in cuts}) == 3:
      return model, params
  raise AssertionError(f"no draw of variables cuts TEXT_ROWS at different steps for {describe(cfg)}")


@pytest.mark.parametrize("predictor", [pytest.param(p, marks=slow_unless(p == "entropy")) for p in BOUNDARY_PREDICTORS])
def test_text_rows_that_close_segments_at_different_steps_decode_like_the_forward_pass(predictor):
  """Every predictor, three rows, from an empty cache and after a prompt of 5: the logits of prefill + decode_step
  equal the forward pass's."""
  cfg = small_config(**DYNAMIC, boundaries=predictor, vocab_size=256)
  model, params = text_rows_params(cfg)
  full_BxLxV = np.asarray(jax.jit(model.apply)({"params": params}, TEXT_ROWS))
  step = jax.jit(lambda params, cache, token_B, t: decode.decode_step(params, cfg, cache, token_B, t))
  for prompt_len in (0, 5):
    if prompt_len:
      cache, first_BxV = decode.prefill(params, cfg, TEXT_ROWS[:, :prompt_len], 12)
      out = [np.asarray(first_BxV)]
    else:
      cache, out = decode.init_cache(cfg, 3, 12, params), []
    for t in range(prompt_len, 12):
      cache, logits_BxV = step(params, cache, TEXT_ROWS[:, t], t)
      out.append(np.asarray(logits_BxV))
    np.testing.assert_allclose(np.stack(out, axis=1), full_BxLxV[:, max(prompt_len - 1, 0):], atol=1e-4, rtol=0,
                               err_msg=f"{predictor} prompt {prompt_len}")


NESTED_QUICK = {0, 1}


@pytest.mark.parametrize("case", [pytest.param(i, marks=slow_unless(i in NESTED_QUICK), id=describe(cfg))
                                  for i, cfg in enumerate(NESTED_CASES)])
def test_nested_dynamic_decoding_matches_forward(case):
  """Two dynamic levels: the inner one advances when the outer one closes a segment (each row at its own steps)
  and closes its own segments among the outer segments; its prefill reads only each row's completed segments."""
  cfg = NESTED_CASES[case]
  model, params = model_and_params(cfg)
  assert all(0 < rate < 1 for rate in level_rates(model, {"params": params}))
  assert_decoding_matches_forward(cfg, case)


def test_dynamic_greedy_generation_matches_repeated_full_forwards():
  cfg = DYNAMIC_GEN
  _, params = model_and_params(cfg)
  prompt_len = prompt_lengths(cfg, 3)[0]  # the parity test's prefill, compiled already
  cached = sampling.generate(params, cfg, TOKENS[:, :prompt_len], max_new_tokens=LENGTH - prompt_len, rng=0,
                             temperature=0.0)
  np.testing.assert_array_equal(cached, greedy_by_full_forward(cfg, 3, params, prompt_len))


def multiscale_cases():
  """Bottom-up and retina x downsampler x position, top-down over every pair of downsampler, upsampler and
  position, and other scales (a scale with no layers, factors 3 and 6). Unmarked: every downsampler and upsampler
  through top-down (with both position schemes), and bottom-up and retina once each (relative / rope, learned
  pooling; 'avg' pooling is the same code)."""
  sample = [multiscale_config(TOPDOWN, downsampler="avg", upsampler="transposed_conv", position="rope"),
            multiscale_config(TOPDOWN, downsampler="conv", upsampler="repeat", position="relative"),
            multiscale_config(BOTTOMUP, downsampler="conv", position="relative"),
            multiscale_config(RETINA, downsampler="conv", position="rope")]
  cases = [multiscale_config(TOPDOWN, downsampler=down, upsampler=up, position=position)
           for down, up, position in option_grid(DOWNSAMPLERS, UPSAMPLERS, ["rope", "relative"])]
  for fields in (BOTTOMUP, RETINA):
    for down, position in itertools.product(DOWNSAMPLERS, ["rope", "relative"]):
      cases.append(multiscale_config(fields, downsampler=down, upsampler=UPSAMPLERS[0], position=position))
  cases += [multiscale_config(TOPDOWN, scales="6,3,1", layers_per_scale="1,0,1", downsampler="conv"),
            multiscale_config(RETINA, scales="6,2,1", retina_windows="0:2,2:7,7:11", downsampler="conv",
                              position="relative")]
  return sample + [cfg for cfg in cases if cfg not in sample], len(sample)


MULTISCALE_CASES, NUM_SAMPLED = multiscale_cases()


@pytest.mark.parametrize("case", [pytest.param(i, marks=slow_unless(i < NUM_SAMPLED), id=describe(cfg))
                                  for i, cfg in enumerate(MULTISCALE_CASES)])
def test_multiscale_decoding_matches_forward(case):
  """Prefill + steps equal the forward pass; then greedy decoding with the same compiled prefill and step equals
  greedy decoding by repeated full forwards (generate's loop is kind-agnostic and tested below)."""
  cfg = MULTISCALE_CASES[case]
  assert_decoding_matches_forward(cfg, case)
  _, params = model_and_params(cfg)
  prompts = prompt_lengths(cfg, case)
  _, _, prefills, _ = run_reference(cfg, params, prompts, extend_sizes(case))
  cache, logits_BxV = prefills[0]
  tokens = TOKENS.copy()
  for t in range(prompts[0], LENGTH):
    tokens[:, t] = np.argmax(np.asarray(logits_BxV), axis=-1)
    cache, logits_BxV = jitted_step(cfg)(params, cache, tokens[:, t], t)
  np.testing.assert_array_equal(tokens[:, prompts[0]:], greedy_by_full_forward(cfg, case, params, prompts[0]))


def conds(eqns):
  """The cond equations of `eqns`, looking inside scans (stacks of blocks run as one scan)."""
  found = []
  for eqn in eqns:
    if eqn.primitive.name == "cond":
      found.append(eqn)
    elif eqn.primitive.name == "scan":
      found += conds(eqn.params["jaxpr"].jaxpr.eqns)
  return found


def nested_conds(eqns):
  """Depth of the cond nesting and the number of conds at each depth (all branches)."""
  counts, level = [], conds(eqns)
  while level:
    counts.append(len(level))
    level = [inner for eqn in level for branch in eqn.params["branches"] for inner in conds(branch.jaxpr.eqns)]
  return counts


@pytest.mark.parametrize("cfg, expected", [
    (small_config(hierarchy=MULTI_LEVEL), [1, 1]),  # factor 2 under one cond, factor 4 inside its taken branch
    (multiscale_config(TOPDOWN), [1, 1]),            # scale 2, then scale 4 inside it
    (multiscale_config(BOTTOMUP), [1, 1]),
    (multiscale_config(RETINA), [1, 1]),             # the same chain in the scanned block
], ids=["hourglass", "topdown", "bottomup", "retina"])
def test_coarse_levels_run_under_nested_conds(cfg, expected):
  """A step runs a level (scale) of factor F only under lax.cond(position % F == 0), nested by factor."""
  _, params = model_and_params(cfg)
  cache = decode.init_cache(cfg, BATCH, LENGTH, params)
  jaxpr = jax.make_jaxpr(lambda c, t: decode.decode_step(params, cfg, c, TOKENS[:, 0], t))(cache, 3)
  # Each cond has an identity branch with no conds, so count per level over all branches.
  assert nested_conds(jaxpr.eqns) == expected


def greedy_by_full_forward(cfg, case, params, prompt_len):
  """Greedy continuation of TOKENS[:, :prompt_len] to LENGTH by one full forward per token."""
  prompts, sizes = prompt_lengths(cfg, case), extend_sizes(case)
  forward = reference_program(cfg, prompts, sizes)  # later tokens cannot affect position t
  tokens = TOKENS.copy()
  for t in range(prompt_len - 1, LENGTH - 1):
    logits_BxLxV = np.asarray(forward(params, tokens, [s[:2] for s in schedules(prompts, sizes)])[0])
    tokens[:, t + 1] = np.argmax(logits_BxLxV[:, t], axis=-1)
  return tokens[:, prompt_len:]


def test_greedy_generation_matches_repeated_full_forwards():
  _, params = model_and_params(GEN_CFG)
  prompt_len = 4
  cached = sampling.generate(params, GEN_CFG, TOKENS[:, :prompt_len], max_new_tokens=LENGTH - prompt_len, rng=0,
                             temperature=0.0)
  assert cached.shape == (BATCH, LENGTH - prompt_len) and cached.dtype == jnp.int32
  np.testing.assert_array_equal(cached, greedy_by_full_forward(GEN_CFG, GEN_CASE, params, prompt_len))


def test_generation_stops_at_the_end_token():
  _, params = model_and_params(GEN_CFG)
  prompt, num_new = TOKENS[:, :4], LENGTH - 4  # the greedy test's program
  greedy = np.asarray(sampling.generate(params, GEN_CFG, prompt, max_new_tokens=num_new, rng=0, temperature=0.0))
  end = int(greedy[0, 2])
  stopped = np.asarray(sampling.generate(params, GEN_CFG, prompt, max_new_tokens=num_new, rng=0, temperature=0.0,
                                       end_token=end))
  for row, out in zip(greedy, stopped):
    hits = np.flatnonzero(row == end)
    stop = hits[0] + 1 if hits.size else num_new
    np.testing.assert_array_equal(out[:stop], row[:stop])
    assert np.all(out[stop:] == end)


def test_sampled_generation_is_reproducible_for_a_seed():
  cfg = small_config(kind="vanilla", hierarchy="2@1")
  _, params = model_and_params(cfg)
  sample = lambda seed: np.asarray(sampling.generate(params, cfg, TOKENS[:, :3], max_new_tokens=LENGTH - 3, rng=seed,
                                                   temperature=1.5, top_k=20, top_p=0.95))
  first = sample(7)
  np.testing.assert_array_equal(first, sample(7))
  assert not np.array_equal(first, sample(8))
  assert first.min() >= 0 and first.max() < VOCAB


# A fixed logits vector: probabilities 0.4, 0.25, 0.15, 0.1, 0.06, 0.04 at shuffled token ids.
PROBS = np.array([0.1, 0.4, 0.04, 0.15, 0.25, 0.06])
LOGITS = jnp.asarray(np.log(PROBS), jnp.float32)[None]


def draws(top_k=0, top_p=1.0, temperature=1.0, seed=0, num=4000):
  logits_NxV = jnp.tile(LOGITS, (num, 1))
  return np.asarray(sample_logits(jax.random.key(seed), logits_NxV, temperature=temperature, top_k=top_k,
                                  top_p=top_p))


@pytest.mark.parametrize("top_k, top_p, allowed", [
    (3, 1.0, {1, 4, 3}), (1, 1.0, {1}), (0, 0.7, {1, 4, 3}), (0, 0.6, {1, 4}), (0, 0.3, {1}), (2, 0.9, {1, 4}),
    (0, 1.0, {0, 1, 2, 3, 4, 5})])
def test_top_k_and_top_p_allow_exactly_the_right_tokens(top_k, top_p, allowed):
  kept = np.flatnonzero(np.isfinite(np.asarray(filter_logits(LOGITS, top_k=top_k, top_p=top_p)[0])))
  assert set(kept.tolist()) == allowed
  assert set(np.unique(draws(top_k, top_p)).tolist()) == allowed


def test_filtered_sampling_renormalises_the_kept_probabilities():
  counts = np.bincount(draws(top_k=3), minlength=len(PROBS)) / 4000
  np.testing.assert_allclose(counts[[1, 4, 3]], PROBS[[1, 4, 3]] / 0.8, atol=0.03)


def test_sampling_is_reproducible_and_temperature_zero_is_greedy():
  np.testing.assert_array_equal(draws(seed=3), draws(seed=3))
  assert not np.array_equal(draws(seed=3), draws(seed=4))
  assert set(np.unique(draws(temperature=0.0)).tolist()) == {1}
  assert np.mean(draws(temperature=0.05) == 1) > 0.99


def test_errors_are_clear():
  cfg = small_config()
  _, params = model_and_params(cfg)
  with pytest.raises(ValueError, match="max_len"):
    decode.prefill(params, cfg, TOKENS, LENGTH - 1)
  with pytest.raises(ValueError, match="at least 1 token"):
    decode.prefill(params, cfg, TOKENS[:, :0], LENGTH)
  with pytest.raises(ValueError, match="BOS"):
    sampling.generate(params, cfg, TOKENS[:, :0], max_new_tokens=3, rng=0)
  with pytest.raises(ValueError, match="window 3:12 of the scale-4 heads starts beyond"):
    decode.init_cache(multiscale_config(RETINA), BATCH, 3)
  with pytest.raises(ValueError, match="needs `params`"):
    decode.init_cache(small_config(position="relative"), BATCH, LENGTH)
  with pytest.raises(ValueError, match="top_p"):
    filter_logits(LOGITS, top_p=0.0)


def test_decoding_follows_a_change_to_a_block(monkeypatch):
  """One model definition: a change to the residual tail every block shares (here its attention branch halved)
  changes the forward pass, and cached decoding follows it without a second edit."""
  from hourglass_jax.model import layers
  from hourglass_jax.model.resampling import attention as resampling
  cfg = small_config(hierarchy=SINGLE_LEVEL, shorten="attention_linear", upsample="attention_linear",
                     position="relative")
  _, params = model_and_params(cfg)
  prompt = 5

  def forward_and_decoded():
    full_BxLxV = jax.jit(lambda p: build_model(cfg).apply({"params": p}, TOKENS))(params)
    cache, first_BxV = jax.jit(lambda p: decode.prefill(p, cfg, TOKENS[:, :prompt], LENGTH))(params)
    step = jax.jit(lambda p, c, token_B, t: decode.decode_step(p, cfg, c, token_B, t))
    out = [first_BxV]
    for t in range(prompt, LENGTH):
      cache, logits_BxV = step(params, cache, TOKENS[:, t], t)
      out.append(logits_BxV)
    return np.asarray(full_BxLxV)[:, prompt - 1:], np.stack([np.asarray(x) for x in out], axis=1)

  before, _ = forward_and_decoded()
  tail = layers.feed_forward_residual
  halved = lambda cfg, x_BxLxD, h_BxLxD, deterministic: tail(cfg, x_BxLxD, 0.5 * h_BxLxD, deterministic)
  monkeypatch.setattr(layers, "feed_forward_residual", halved)
  monkeypatch.setattr(resampling, "feed_forward_residual", halved)
  full, decoded = forward_and_decoded()
  assert np.abs(full - before).max() > 1e-2  # the change reached the forward pass
  np.testing.assert_allclose(decoded, full, atol=1e-4, rtol=0)
