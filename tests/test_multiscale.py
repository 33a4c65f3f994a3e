"""Multi-scale models (top-down, bottom-up, retina): causality, shapes, retina windows, training, presets."""

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import flags
from ml_collections import config_flags

from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model import counting
from hourglass_jax.model.lm import build_body
from hourglass_jax.model.multiscale.attention import retina_mask
from hourglass_jax.testing import random_variables
from tests.helpers import CONFIGS, LENGTHS, SMALL, assert_causal

# Scales 4,2,1 keep the shapes of the causality tests (LENGTHS: 12 and 11 both pad to 12). The retina windows
# start exactly scale-1 tokens back, the tightest causal choice, so an off-by-one in a shift or mask shows up.
TOPDOWN = dict(kind="topdown", scales="4,2,1", layers_per_scale="1,1,1")
BOTTOMUP = dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2")
RETINA = dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:1,1:3,3:12")
KINDS = {"topdown": TOPDOWN, "bottomup": BOTTOMUP, "retina": RETINA}


def config(kind: str, **overrides) -> ModelConfig:
  values = dict(SMALL, **KINDS[kind])
  values.update(overrides)
  return ModelConfig(**values)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("downsampler", ["avg", "conv"])
@pytest.mark.parametrize("kind, upsampler", [("topdown", "transposed_conv"), ("topdown", "repeat"),
                                             ("bottomup", "transposed_conv"), ("retina", "transposed_conv")])
def test_multiscale_is_causal(kind, upsampler, downsampler, length):
  assert_causal(config(kind, downsampler=downsampler, upsampler=upsampler), length)


@pytest.mark.parametrize("kind", list(KINDS))
def test_multiscale_is_causal_with_relative_positions(kind):
  assert_causal(config(kind, position="relative", downsampler="conv"), 11)


@pytest.mark.parametrize("kind, overrides", [
    ("topdown", dict(scales="6,3,1", layers_per_scale="1,0,1")),
    ("retina", dict(scales="6,2,1", retina_windows="0:2,2:7,7:11")),
])
def test_other_scales_are_causal(kind, overrides):
  assert_causal(config(kind, downsampler="conv", **overrides), 11)


def test_topdown_gradients_are_causal():
  """d output[t] / d input[p] == 0 for every p > t, and != 0 for p == t."""
  cfg = config("topdown", downsampler="conv")
  module = build_body(cfg)
  x_BxLxD = jnp.asarray(np.random.default_rng(0).normal(size=(1, 16, cfg.d_model)), jnp.float32)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), x_BxLxD, True))
  rng = np.random.default_rng(1)
  variables = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.3, s.dtype), shapes)
  f = lambda x: module.apply(variables, x, True)[0].sum(-1)  # [L]
  influence_LxL = np.abs(np.asarray(jax.jit(jax.jacrev(f))(x_BxLxD))[:, 0]).max(-1)
  assert np.all(np.triu(influence_LxL, k=1) == 0.0), "an output depends on a later input"
  assert np.all(np.diag(influence_LxL) > 0.0)


def numpy_retina_mask(length: int, scale: int, start: int, stop: int) -> np.ndarray:
  """From the definition: q sees the complete key holding each token start..stop-1 back (key j: js-s+1 .. js)."""
  mask = np.zeros((length, length // scale), bool)
  for q in range(length):
    for back in range(start, stop):
      j = -(-(q - back) // scale)
      if 0 <= j < length // scale and j * scale <= q:
        mask[q, j] = True
  return mask


@pytest.mark.parametrize("scales, windows, length", [
    ((16, 4, 1), ((256, 512), (8, 256), (0, 8)), 512),
    ((4, 2, 1), ((3, 12), (1, 3), (0, 1)), 12),
    ((6, 2, 1), ((7, 11), (2, 7), (0, 2)), 12),
])
def test_retina_mask_equals_the_window_definition(scales, windows, length):
  for scale, (start, stop) in zip(scales, windows):
    np.testing.assert_array_equal(retina_mask(length, scale, start, stop),
                                  numpy_retina_mask(length, scale, start, stop), err_msg=f"scale {scale}")
  # Together the groups see every token up to the farthest window, each from the scale its window names.
  last = max(stop for _, stop in windows)
  for q in range(length):
    seen = set()
    for scale, (start, stop) in zip(scales, windows):
      for j in np.flatnonzero(retina_mask(length, scale, start, stop)[q]):
        seen.update(range(max(j * scale - scale + 1, 0), j * scale + 1))
    assert set(range(max(q - last + 1, 0), q + 1)) <= seen and max(seen) <= q


def test_retina_windows_longer_than_the_sequence_are_allowed_but_unreachable_ones_raise():
  model = build_model(config("retina"))
  variables = random_variables(model, jnp.zeros((1, 12), jnp.int32))
  assert jax.eval_shape(model.apply, variables, jnp.ones((2, 4), jnp.int32)).shape == (2, 4, SMALL["vocab_size"])
  with pytest.raises(ValueError, match=r"model.retina_windows='0:1,1:3,3:12': window 3:12 of the scale-4 heads"):
    model.apply(variables, jnp.ones((2, 3), jnp.int32))


# The smallest model of each kind (two scales, one layer each): XLA's CPU compile time dominates this test.
TRAIN = {"topdown": dict(scales="2,1", layers_per_scale="1,1"),
         "bottomup": dict(scales="2,1", layers_per_scale="1,1", heads_per_scale=""),
         "retina": dict(hierarchy="1@1", scales="2,1", heads_per_scale="", retina_windows="0:3,3:16")}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_model_trains(kind):
  """Shapes at lengths below, at and above the coarsest scale; then 15 Adam steps lower the loss."""
  model = build_model(config(kind, **TRAIN[kind]))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(np.tile(rng.integers(0, SMALL["vocab_size"], size=(4, 6)), (1, 3)), jnp.int32)  # [4, 18]
  params = random_variables(model, tokens[:, :-1], scale=0.1)["params"]
  for length in ((4, 17, 40) if kind == "retina" else (1, 17, 40)):
    shape = jax.eval_shape(model.apply, {"params": params}, jnp.ones((3, length), jnp.int32)).shape
    assert shape == (3, length, SMALL["vocab_size"])
  optimizer = optax.adam(1e-2)

  @jax.jit
  def step(params, opt_state):
    def loss_fn(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state, losses = optimizer.init(params), []
  for _ in range(15):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.5, losses


def test_param_tree_names_the_scales():
  shapes = lambda cfg: jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
  body = shapes(config("topdown", downsampler="conv"))["params"]["body"]
  assert sorted(body) == ["downsample_2", "downsample_4", "merge_1", "merge_2", "scale_1", "scale_2", "scale_4",
                          "upsample_2", "upsample_4"]
  body = shapes(config("bottomup"))["params"]["body"]
  assert sorted(body) == ["aggregate", "scale_1", "scale_2", "scale_4"]
  retina = shapes(config("retina"))["params"]["body"]
  attention = retina["blocks"]["attention"]  # blocks scanned: a leading layer axis
  assert attention["key_2"]["kernel"].value.shape == (2, SMALL["d_model"], 2,
                                                      SMALL["d_model"] // SMALL["num_heads"])


# ------------------------------------------------------------------------------------------ configs/bookcorpus.py
def bookcorpus():
  spec = importlib.util.spec_from_file_location("bookcorpus", CONFIGS / "bookcorpus.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_bookcorpus_presets_build_with_exact_analytic_param_counts():
  """Full-size counts are checked by benchmarks/multiscale_presets.py; here the tiny multi-scale ones."""
  module = bookcorpus()
  for name in module.NAMES:
    cfg = module.get_config(name)
    for section in ("model", "data", "train", "mesh", "checkpoint"):
      assert section in cfg
    model_cfg = ModelConfig.from_dict(cfg.model)
    assert model_cfg.kind == name.split("_")[0]
    assert (model_cfg.d_model, model_cfg.num_heads, model_cfg.d_ff) == ((32, 4, 64) if "tiny" in name else
                                                                        (512, 8, 2048))
    if name in ("topdown_64_16_4_1_tiny", "bottomup_64_16_4_1_tiny", "retina_16_4_1_tiny"):
      tokens = jnp.zeros((1, cfg.data.seq_len), jnp.int32)
      shapes = jax.eval_shape(build_model(model_cfg).init, jax.random.key(0), tokens)
      assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(model_cfg), name
  assert module.get_config().model.scales == "64,16,4,1"
  with pytest.raises(ValueError, match=r"unknown preset 'topdown'; choose one of vanilla, topdown_4_1, .*_tiny"):
    module.get_config("topdown")


def test_bookcorpus_preset_from_the_command_line_with_overrides():
  argv = ["prog", f"--config={CONFIGS / 'bookcorpus.py'}:retina_16_4_1_tiny", "--config.model.downsampler=conv"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  model = values.config.model
  assert (model.kind, model.scales, model.retina_windows, model.downsampler) == (
      "retina", "16,4,1", "0:8,8:64,64:128", "conv")
  assert ModelConfig.from_dict(model).parsed_scales.heads == (1, 1, 2)
