"""Causality by perturbation (every option) and by gradients (an independent second check)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.config import SHORTEN, UPSAMPLE
from hourglass_jax.model.lm import build_body
from hourglass_jax.testing import causality_violations
from tests.helpers import LENGTHS, SMALL, assert_causal, option_grid, small_config

SINGLE_LEVEL = "1@1 2@3 1@1"
MULTI_LEVEL = "1@1 1@2 1@4 1@2 1@1"


@pytest.mark.parametrize("shorten, upsample, hierarchy, length, position",
                         option_grid(SHORTEN, UPSAMPLE, [SINGLE_LEVEL, MULTI_LEVEL], LENGTHS, ["rope", "relative"]))
def test_hourglass_is_causal(shorten, upsample, hierarchy, length, position):
  """Every shorten x upsample pair, each option beside both hierarchies, lengths and position schemes."""
  assert_causal(small_config(hierarchy=hierarchy, shorten=shorten, upsample=upsample, position=position), length)


@pytest.mark.parametrize("position", ["rope", "relative"])
@pytest.mark.parametrize("length", LENGTHS)
def test_vanilla_is_causal(length, position):
  assert_causal(small_config(kind="vanilla", hierarchy="2@1", position=position), length)


@pytest.mark.parametrize("hierarchy, length", [pytest.param("1@1 1@5 1@1", 13, marks=pytest.mark.slow),
                                               pytest.param("0@1 1@2 2@6 0@2 1@1", 13, marks=pytest.mark.slow),
                                               ("2@1 1@3 1@1", 11)])
def test_other_factors_and_asymmetric_counts_are_causal(hierarchy, length):
  assert_causal(small_config(hierarchy=hierarchy, shorten="attention_linear", upsample="attention_linear"), length)


def test_the_perturbation_check_catches_a_leak():
  def leaky(tokens_BxL):  # position t sees token t+1
    shifted = jnp.roll(tokens_BxL, -1, axis=1)
    return jax.nn.one_hot(shifted, SMALL["vocab_size"])
  assert causality_violations(leaky, 9, SMALL["vocab_size"])


@pytest.mark.parametrize("position, shorten, upsample", [
    pytest.param("rope", "attention_avg", "attention_repeat", marks=pytest.mark.slow),  # 30 s, the others 13-19
    ("relative", "attention_avg", "attention_repeat"), ("rope", "linear", "linear"), ("relative", "linear", "linear")])
def test_body_gradients_are_causal(shorten, upsample, position):
  """d output[t] / d input[p] == 0 for every p > t, and != 0 for p == t."""
  cfg = small_config(hierarchy=MULTI_LEVEL, shorten=shorten, upsample=upsample, position=position)
  body = build_body(cfg)
  x_BxLxD = jnp.asarray(np.random.default_rng(0).normal(size=(1, 16, cfg.d_model)), jnp.float32)
  shapes = jax.eval_shape(lambda: body.init(jax.random.key(0), x_BxLxD, True))
  rng = np.random.default_rng(1)
  variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.3, s.dtype), shapes)
  f = lambda x: body.apply(variables, x, True)[0].sum(-1)  # [L]
  jacobian_LxLxD = np.asarray(jax.jit(jax.jacrev(f))(x_BxLxD))[:, 0]
  influence_LxL = np.abs(jacobian_LxLxD).max(-1)
  assert np.all(np.triu(influence_LxL, k=1) == 0.0), "an output depends on a later input"
  assert np.all(np.diag(influence_LxL) > 0.0)


BLOCK_CASES = [  # the multi-level hourglass and bottom-up cases take 31-33 s on 2 cores, the others < 20
    dict(hierarchy=SINGLE_LEVEL, shorten="attention_avg", upsample="attention_repeat", position="relative"),
    pytest.param(dict(hierarchy=MULTI_LEVEL, shorten="attention_linear", upsample="attention_linear"),
                 marks=pytest.mark.slow),
    dict(kind="vanilla", hierarchy="2@1", position="relative"),
    dict(kind="retina", hierarchy="1@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:2,2:5,5:12"),
    pytest.param(dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2",
                      position="relative"), marks=pytest.mark.slow),
]


@pytest.mark.parametrize("overrides", BLOCK_CASES,
                         ids=lambda o: f"{o.get('kind', 'hourglass')}-{o.get('position', 'rope')}")
def test_block_attention_models_are_causal(overrides, monkeypatch):
  """attention_impl='block' with blocks of 4 (so every mask has hidden, partial and full blocks) in every mask the
  models use: causal, shortening, upsampling, retina windows, bottom-up aggregation; Transformer-XL biases too."""
  import functools

  from hourglass_jax.ops import attention

  monkeypatch.setattr(attention, "block_attention", functools.partial(attention.block_attention, block_q=4,
                                                                      block_k=4))
  for length in LENGTHS:
    assert_causal(small_config(attention_impl="block", **overrides), length)
