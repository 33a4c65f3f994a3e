import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model import counting
from hourglass_jax.testing import random_variables
from tests.helpers import SMALL, load_config, small_config


@pytest.mark.slow
def test_any_length_gives_logits_for_every_position():
  model = build_model(small_config(hierarchy="1@1 1@2 1@4 1@2 1@1"))
  variables = random_variables(model, jnp.zeros((1, 4), jnp.int32))
  apply = jax.jit(model.apply)
  for length in (1, 2, 7, 40):
    logits = apply(variables, jnp.ones((3, length), jnp.int32))
    assert logits.shape == (3, length, SMALL["vocab_size"])
    assert logits.dtype == jnp.float32
    assert np.isfinite(np.asarray(logits)).all()


def test_padding_is_invisible_to_real_positions():
  model = build_model(small_config(hierarchy="1@1 2@3 1@1"))
  variables = random_variables(model, jnp.zeros((1, 9), jnp.int32))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, size=(2, 9)), jnp.int32)
  apply = jax.jit(model.apply)
  np.testing.assert_allclose(apply(variables, tokens[:, :7]), apply(variables, tokens)[:, :7], atol=1e-5)


def test_vanilla_equals_the_center_stack_of_hourglass_code():
  cfg = small_config(kind="vanilla", hierarchy="3@1")
  variables = jax.jit(build_model(cfg).init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  stack = variables["params"]["body"]["layers"]
  assert sorted(stack) == ["blocks", "final_norm"]
  kernel = stack["blocks"]["mlp"]["wi"]["kernel"]  # the 3 blocks' params stacked on a leading 'layers' axis
  assert kernel.names == ("layers", "embed", "mlp") and kernel.value.shape[0] == 3
  assert counting.total_params(cfg) == sum(x.size for x in jax.tree.leaves(variables))


def test_dropout_is_active_only_when_not_deterministic():
  model = build_model(small_config(dropout=0.3))
  tokens = jnp.ones((2, 12), jnp.int32)
  variables = random_variables(model, tokens)
  evaluate = jax.jit(model.apply)
  eval_a, eval_b = evaluate(variables, tokens), evaluate(variables, tokens)
  np.testing.assert_array_equal(eval_a, eval_b)
  apply_train = jax.jit(lambda v, t, key: model.apply(v, t, deterministic=False, rngs={"dropout": key}))
  train = lambda seed: apply_train(variables, tokens, jax.random.key(seed))
  np.testing.assert_array_equal(train(1), train(1))
  assert not np.allclose(train(1), train(2))
  assert not np.allclose(train(1), eval_a)


@pytest.mark.slow
def test_attention_dropout_defaults_to_dropout_and_can_be_set_apart():
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 12)), jnp.int32)
  variables = random_variables(build_model(small_config()), tokens)

  def train(**dropouts):
    model = build_model(small_config(**dropouts))
    return jax.jit(lambda v: model.apply(v, tokens, deterministic=False, rngs={"dropout": jax.random.key(3)}))(
        variables)

  assert small_config(dropout=0.3).attention_dropout_rate == 0.3
  np.testing.assert_array_equal(train(dropout=0.3), train(dropout=0.3, attention_dropout=0.3))
  assert not np.allclose(train(dropout=0.3), train(dropout=0.3, attention_dropout=0.0))
  # Attention-probability dropout alone: residual and FFN paths untouched, the output still changes.
  evaluate = jax.jit(build_model(small_config()).apply)(variables, tokens)
  np.testing.assert_allclose(train(dropout=0.0, attention_dropout=0.0), evaluate, atol=1e-6)
  assert not np.allclose(train(dropout=0.0, attention_dropout=0.5), evaluate, atol=1e-3)
  with pytest.raises(ValueError, match=r"model.attention_dropout=1.5 must be in \[0, 1\)"):
    small_config(attention_dropout=1.5)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = build_model(small_config(dtype="bfloat16"))
  tokens = jnp.ones((2, 12), jnp.int32)
  variables = jax.jit(model.init)(jax.random.key(0), tokens)
  assert {x.dtype for x in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
  logits = jax.jit(model.apply)(variables, tokens)
  assert logits.dtype == jnp.float32
  reference = jax.jit(build_model(small_config()).apply)(variables, tokens)
  np.testing.assert_allclose(logits, reference, atol=0.1, rtol=0.1)


def test_params_carry_logical_axis_names():
  model = build_model(small_config())
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
  names = {box.names for box in jax.tree.leaves(shapes, is_leaf=lambda x: hasattr(x, "names"))}
  assert ("vocab", "embed") in names and ("embed", "heads", "kv") in names and ("embed", "mlp") in names


def test_build_model_accepts_config_dict_dict_and_dataclass():
  section = load_config("tiny").model
  for form in (section, dict(section), ModelConfig.from_dict(section)):
    assert build_model(form).cfg == ModelConfig.from_dict(section)


@pytest.mark.parametrize("name", ["default", "tiny", "enwik8", "imagenet32", "imagenet64", "cifar10", "digits"])
def test_config_files_have_every_section_and_exact_analytic_param_count(name):
  cfg = load_config(name)
  for section in ("model", "data", "train", "mesh", "checkpoint"):
    assert section in cfg
  model_cfg = ModelConfig.from_dict(cfg.model)
  model = build_model(model_cfg)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 24), jnp.int32))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(model_cfg)


def test_paper_configs_match_the_paper_table():
  expected = {
      "enwik8": ("5@1 24@3 5@1", 512, 8, 2048, "attention_avg", "attention_repeat", 0.2, 2049),
      "imagenet32": ("3@1 24@3 3@1", 512, 8, 2048, "attention_linear", "attention_linear", 0.01, 3072),
      "imagenet64": ("3@1 12@3 3@1", 768, 8, 3072, "linear", "linear", 0.0, 12288),
      "cifar10": ("1@1 8@3 1@1", 512, 8, 2048, "attention_linear", "attention_linear", 0.0, 3072),
  }
  for name, row in expected.items():
    cfg = load_config(name)
    m = cfg.model
    assert (m.hierarchy, m.d_model, m.num_heads, m.d_ff, m.shorten, m.upsample, m.dropout, cfg.data.seq_len) == row
    assert (cfg.train.b1, cfg.train.b2, cfg.train.eps, cfg.train.weight_decay) == (0.9, 0.98, 1e-9, 0.0)
