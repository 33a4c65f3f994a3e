"""'every<N>', AU-Net's nested splits (Videau et al. 2025): exact causality by perturbation at the first and the
nested levels, boundaries every N segments of the level above, cached decoding equal to the forward pass with rows
that close segments at different steps, its CPU preset and its names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.cli.boundaries import level_boundaries
from hourglass_jax.model import ModelConfig, build_model, counting, decode
from hourglass_jax.model.hourglass.dynamic.predictors import resolve
from hourglass_jax.testing import causality_violations, random_variables
from tests.helpers import BATCH, SMALL, load_config, small_config

DYNAMIC = dict(shorten="dynamic", upsample="repeat")
THREE_LEVELS = "1@1 1@2 1@4 1@8 1@4 1@2 1@1"  # every2 at the inner levels: factor 2 each
TEXT = b"the cat sat on a mat, and a dog ran by; then it sat too"


@pytest.mark.parametrize("boundaries, hierarchy, length", [("every3", "1@1 2@3 1@1", 11),
                                                           ("whitespace,every2", "1@1 1@2 1@4 1@2 1@1", 12),
                                                           ("whitespace,every2,every2", THREE_LEVELS, 11)])
def test_nested_splits_are_causal(boundaries, hierarchy, length):
  model = build_model(small_config(**DYNAMIC, hierarchy=hierarchy, boundaries=boundaries))
  variables = random_variables(model, jnp.zeros((1, length), jnp.int32))
  apply = jax.jit(lambda tokens: model.apply(variables, tokens))
  problems = causality_violations(apply, length, SMALL["vocab_size"], batch_size=BATCH)
  assert not problems, problems[:3]


def test_each_nested_level_closes_after_every_n_segments_of_the_level_above():
  """Words, pairs of words, groups of four words: a level's n-th closing byte is the 2n-th of the level above."""
  cfg = small_config(**DYNAMIC, hierarchy=THREE_LEVELS, boundaries="whitespace,every2,every2", vocab_size=256)
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


# Three rows of text whose words end at different bytes: each decoding step closes segments in some rows only.
ROWS = np.array([list(b"the cat sat on it "), list(b"hello, world: a b "), list(b"def f(x):\n  y = x ")],
                np.int32)


@pytest.mark.parametrize("boundaries, hierarchy", [("whitespace,every2", "1@1 1@2 1@4 1@2 1@1"),
                                                   ("whitespace,every2,every2", THREE_LEVELS),
                                                   ("every2", "1@1 1@2 1@1")])
def test_nested_splits_decode_like_the_forward_pass(boundaries, hierarchy):
  """Prefill (0 or 5 tokens) and decode_step give the forward pass's logits, rows closing at their own steps."""
  cfg = small_config(**DYNAMIC, hierarchy=hierarchy, boundaries=boundaries, vocab_size=256)
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
  assert tuple(map(str, cfg.level_predictors)) == ("whitespace", "every2", "every2")
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 16), jnp.int32))["params"]
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)
  assert load_config("dynamic", "every3").model.hierarchy == "2@1 4@3 2@1"  # its level's factor is N


def test_every_n_names_are_parsed_and_checked():
  assert dict(resolve("every5").named) == {"count": 5} and resolve("every5").segment_length == 5
  with pytest.raises(ValueError, match="2 <= N <= "):
    small_config(**DYNAMIC, hierarchy="1@1 2@3 1@1", boundaries="every1")
  with pytest.raises(ValueError, match="choose one of whitespace, gumbel, routing, entropy, every<N>"):
    small_config(**DYNAMIC, hierarchy="1@1 2@3 1@1", boundaries="everytwo")
  small_config(**DYNAMIC, hierarchy="1@1 1@2 1@4 1@2 1@1", boundaries="gumbel,every2")  # any level
