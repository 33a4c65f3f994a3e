"""Nothing silent in the Python API: bad tokens, positions and configs raise one clear ValueError where the values
are concrete, and under jit give NaN logits (or -1 samples) instead of plausible numbers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import ModelConfig, build_model, decode, parse_hierarchy
from hourglass_jax.model.decode import sampling
from hourglass_jax.testing import random_variables
from tests.helpers import SMALL, small_config

VOCAB = SMALL["vocab_size"]
LENGTH = 6
TOKENS = np.random.default_rng(0).integers(0, VOCAB, size=(2, LENGTH)).astype(np.int32)
OUT_OF_RANGE = [VOCAB, 300, 2**31 - 1, -1]
KINDS = {
    "hourglass": dict(kind="hourglass", hierarchy="1@1 2@3 1@1"),
    "vanilla": dict(kind="vanilla", hierarchy="2@1"),
    "topdown": dict(kind="topdown", scales="2,1", layers_per_scale="1,1"),
    "bottomup": dict(kind="bottomup", scales="2,1", layers_per_scale="1,1", heads_per_scale="2,2"),
    "retina": dict(kind="retina", hierarchy="1@1", scales="2,1", heads_per_scale="2,2", retina_windows="0:2,2:6"),
}



@functools.cache
def model_and_variables(kind: str = "hourglass"):
  model = build_model(ModelConfig(**SMALL, **KINDS[kind]))
  return model, random_variables(model, jnp.zeros((1, LENGTH), jnp.int32))


def with_id(token: int):
  """TOKENS (int64, so that 2**31-1 and -1 survive as they are) with one id in row 1 replaced."""
  tokens = TOKENS.astype(np.int64)
  tokens[1, 3] = token
  return tokens


@pytest.mark.parametrize("token", OUT_OF_RANGE)
@pytest.mark.parametrize("as_jax", [False, True])
def test_forward_refuses_concrete_ids_outside_the_vocabulary(token, as_jax):
  model, variables = model_and_variables()
  tokens = with_id(token)
  tokens = jnp.asarray(tokens, jnp.int32) if as_jax else tokens
  with pytest.raises(ValueError, match=rf"tokens holds token id {token}, outside the vocabulary \[0, {VOCAB}\); "
                     "map ids into range or build the model with a larger model.vocab_size"):
    model.apply(variables, tokens)


@pytest.mark.parametrize("kind", list(KINDS))
def test_forward_under_jit_gives_nan_logits_for_every_position_of_a_row_with_a_bad_id(kind):
  model, variables = model_and_variables(kind)
  apply = jax.jit(model.apply)
  valid_BxLxV = np.asarray(apply(variables, TOKENS))
  for token in (-1, 300):
    logits_BxLxV = np.asarray(apply(variables, with_id(token).astype(np.int32)))
    np.testing.assert_array_equal(logits_BxLxV[0], valid_BxLxV[0])
    assert np.isnan(logits_BxLxV[1]).all(), f"{kind}: id {token} left finite logits in its row"


def test_valid_tokens_give_the_same_logits_as_numpy_list_jax_array_and_under_jit():
  model, variables = model_and_variables()
  expected = np.asarray(jax.jit(model.apply)(variables, TOKENS))
  assert np.isfinite(expected).all()
  for tokens in (TOKENS, TOKENS.tolist(), TOKENS.astype(np.uint8), jnp.asarray(TOKENS)):
    np.testing.assert_allclose(model.apply(variables, tokens), expected, atol=1e-5)


@pytest.mark.parametrize("shape, match", [
    ((LENGTH,), r"tokens must be a 2-D array \[batch, length\] of token ids, got shape \(6,\); add a batch axis"),
    ((1, LENGTH, 2), r"tokens must be a 2-D array \[batch, length\] of token ids, got shape \(1, 6, 2\)"),
])
def test_forward_refuses_token_arrays_of_the_wrong_rank(shape, match):
  model, variables = model_and_variables()
  with pytest.raises(ValueError, match=match):
    model.apply(variables, jnp.ones(shape, jnp.int32))
  with pytest.raises(ValueError, match=match):  # the rank is static: checked under jit too
    jax.jit(model.apply)(variables, jnp.ones(shape, jnp.int32))


def test_forward_refuses_float_tokens():
  model, variables = model_and_variables()
  with pytest.raises(ValueError, match=r"tokens must hold integer token ids, got dtype float32; convert with"):
    model.apply(variables, np.ones((1, LENGTH), np.float32))


def test_generate_refuses_a_prompt_with_ids_outside_the_vocabulary():
  cfg = small_config()
  params = decode.unbox_params(model_and_variables()[1])
  with pytest.raises(ValueError, match=rf"prompt holds token id 300, outside the vocabulary \[0, {VOCAB}\)"):
    sampling.generate(params, cfg, with_id(300), max_new_tokens=2, rng=0)


def test_generate_under_jit_returns_minus_one_for_a_row_with_a_bad_prompt_id():
  cfg = small_config()
  params = decode.unbox_params(model_and_variables()[1])
  run = jax.jit(lambda prompt: sampling.generate(params, cfg, prompt, max_new_tokens=2, rng=0, temperature=0.0))
  valid = np.asarray(run(TOKENS))
  out = np.asarray(run(with_id(300).astype(np.int32)))
  assert ((0 <= valid) & (valid < VOCAB)).all()
  np.testing.assert_array_equal(out[0], valid[0])
  np.testing.assert_array_equal(out[1], [-1, -1])


def prefilled(max_len: int = 4):
  """(cfg, params, cache) after a 3-token prompt; hierarchy factor 3, so a max_len of 4 holds 6 positions."""
  cfg = small_config()
  params = decode.unbox_params(model_and_variables()[1])
  cache, _ = decode.prefill(params, cfg, TOKENS[:, :3], max_len)
  return cfg, params, cache


@pytest.mark.parametrize("position", [6, 10, -1])
def test_decode_step_refuses_a_concrete_position_outside_the_cache(position):
  cfg, params, cache = prefilled()
  with pytest.raises(ValueError, match=rf"position={position} is outside the cache, which holds positions \[0, 6\); "
                     "init the cache \\(or prefill\\) with a larger max_len"):
    decode.decode_step(params, cfg, cache, TOKENS[:, 3], position)
  with pytest.raises(ValueError, match=rf"position={position} is outside the cache"):
    decode.decode_step(params, cfg, cache, TOKENS[:, 3], jnp.int32(position))


def test_decode_step_under_jit_gives_nan_logits_past_the_cache():
  cfg, params, cache = prefilled()
  step = jax.jit(lambda cache, token_B, t: decode.decode_step(params, cfg, cache, token_B, t))
  assert np.isfinite(np.asarray(step(cache, TOKENS[:, 3], 3)[1])).all()
  for position in (6, 7, -1):
    assert np.isnan(np.asarray(step(cache, TOKENS[:, 3], position)[1])).all(), position


def test_decoding_fills_the_whole_padded_cache_exactly():
  """max_len 4 rounds up to 6 positions: decoding to the last one still equals the full forward pass."""
  cfg, params, cache = prefilled()
  assert decode.cache_length(cache) == 6
  full_BxLxV = np.asarray(model_and_variables()[0].apply({"params": params}, TOKENS))
  for t in range(3, LENGTH):
    cache, logits_BxV = decode.decode_step(params, cfg, cache, TOKENS[:, t], t)
    np.testing.assert_allclose(logits_BxV, full_BxLxV[:, t], atol=1e-4)


def test_decode_step_checks_its_token_ids_and_shapes():
  cfg, params, cache = prefilled()
  with pytest.raises(ValueError, match=rf"token_B holds token id -1, outside the vocabulary \[0, {VOCAB}\)"):
    decode.decode_step(params, cfg, cache, np.array([1, -1]), 3)
  with pytest.raises(ValueError, match=r"token_B must be a 1-D array \[batch\] of token ids, got shape \(2, 1\)"):
    decode.decode_step(params, cfg, cache, TOKENS[:, 3:4], 3)
  with pytest.raises(ValueError, match=r"position=3.0 must be an integer scalar"):
    decode.decode_step(params, cfg, cache, TOKENS[:, 3], 3.0)
  step = jax.jit(lambda token_B: decode.decode_step(params, cfg, cache, token_B, 3)[1])
  assert np.isnan(np.asarray(step(np.array([1, 300], np.int32)))[1]).all()
  with pytest.raises(ValueError, match=r"prompt holds token id 300"):
    decode.prefill(params, cfg, with_id(300), 6)


def test_build_model_refuses_something_that_is_not_a_config():
  with pytest.raises(ValueError, match=r"a model config must be a mapping \(ConfigDict or dict\) or a ModelConfig, "
                     r"got int 5; pass a `model` section, e.g. build_model\(get_config\(\).model\)"):
    build_model(5)
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['data', 'model'\] \(this looks like a whole config"):
    build_model({"model": dict(SMALL), "data": {}})


def test_a_list_as_hierarchy_is_refused_as_not_a_string():
  with pytest.raises(ValueError, match=r"model.hierarchy=\['1@1', '2@3', '1@1'\] is a list; it must be a string "
                     "such as '5@1 24@3 5@1'"):
    build_model(dict(SMALL, hierarchy=["1@1", "2@3", "1@1"]))
  with pytest.raises(ValueError, match=r"model.hierarchy=\['1@1'\]: it is a list, not a string"):
    parse_hierarchy(["1@1"])


@pytest.mark.parametrize("field, value, match", [
    ("dropout", "0.1", r"model.dropout='0.1' is a str; it must be a number such as 0.0 \(unquoted\)"),
    ("attention_dropout", "0.1", r"model.attention_dropout='0.1' is a str; it must be a number \(unquoted\)"),
    ("rope_base", None, r"model.rope_base=None is a NoneType; it must be a number such as 10000.0"),
    ("dropout", True, r"model.dropout=True is a bool; it must be a number"),
    ("scales", (4, 1), r"model.scales=\(4, 1\) is a tuple; it must be a string such as '64,16,4,1'"),
])
def test_fields_of_the_wrong_type_are_refused_before_building(field, value, match):
  with pytest.raises(ValueError, match=match):
    build_model(dict(SMALL, hierarchy="1@1 2@3 1@1", **{field: value}))


def test_numbers_of_any_real_type_are_accepted():
  cfg = ModelConfig(**SMALL, hierarchy="1@1 2@3 1@1", dropout=np.float32(0.25), attention_dropout=0, rope_base=500)
  assert cfg.attention_dropout_rate == 0.0 and float(cfg.dropout) == 0.25
