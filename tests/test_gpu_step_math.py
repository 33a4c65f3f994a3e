"""configs/gpu.py's train step as rewritten for fewer HBM bytes and launches computes what the plain program computed.

The rewrite: ops/dropout.dropout (the backward pass recomputes the keep mask from its seed instead of storing it),
ops/layer_norm (a written-out backward pass that keeps the input and two numbers per row), each preset's remat
policy and scan unroll. Per preset shape at a tiny size (device_check's dry-run dimensions), in float32 and with
the preset's dropout, one step's loss and gradients equal those of the program with flax's LayerNorm, the plain
dropout expression, no remat and rolled scans, to 1e-5; and the bfloat16 program keeps no full-size mask and no
float32 copy of a stream for its backward pass.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

from benchmarks import device_check
from hourglass_jax.config import run_config
from hourglass_jax.model import build_model, layers
from hourglass_jax.ops import dropout as dropout_module
from hourglass_jax.train.compiled.step import token_losses_and_sown

BATCH = 2


def plain_dropout(x, rng, rate):
  """The dropout expression as JAX differentiates it: the keep mask is kept for the backward pass."""
  keep = dropout_module.stream_keep_mask(jax.random.bits(rng, (), jnp.uint32), rate, x.shape)
  return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


def flax_layer_norm(x, scale, bias, epsilon, dtype):
  return nn.LayerNorm(epsilon=epsilon, dtype=dtype).apply({"params": dict(scale=scale, bias=bias)}, x)


def preset_model(preset: str, dtype: str = "float32"):
  """The preset's model at device_check's dry-run size, with the preset's remat policy and scan unroll."""
  cfg = device_check.train_config(preset, dict(dtype=dtype), dry_run=True)
  return run_config(cfg).model, cfg.data.seq_len


def tokens_for(model_cfg, length: int):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, model_cfg.vocab_size, (BATCH, length + 1))
  tokens[rng.random(tokens.shape) < 0.2] = ord(" ")  # whitespace boundaries for the learned level
  return jnp.asarray(tokens, jnp.int32)


def loss_and_grads(model_cfg, params, tokens):
  model = build_model(model_cfg)

  def loss(params):
    return token_losses_and_sown(model, params, tokens, (), rng=jax.random.key(3))[0].mean()

  return jax.jit(jax.value_and_grad(loss))(params)


# enwik8's shape in the quick suite; the others (about 30 s each on 2 cores) with the slow tests
@pytest.mark.parametrize("preset", ["", *(pytest.param(p, marks=pytest.mark.slow) for p in ("large", "dynamic",
                                                                                           "fixed"))])
def test_one_step_matches_the_plain_program(preset, monkeypatch):
  model_cfg, length = preset_model(preset)
  assert model_cfg.dropout > 0  # the masks are the plain program's, so dropout stays on
  tokens = tokens_for(model_cfg, length)
  params = jax.jit(build_model(model_cfg).init)(jax.random.key(0), tokens[:, :-1])["params"]
  loss, grads = loss_and_grads(model_cfg, params, tokens)
  plain = dataclasses.replace(model_cfg, remat_policy="none", scan_unroll=1)
  monkeypatch.setattr(dropout_module, "dropout", plain_dropout)
  monkeypatch.setattr(layers, "fused_layer_norm", flax_layer_norm)
  plain_loss, plain_grads = loss_and_grads(plain, params, tokens)
  np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(plain_grads))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale), grads, plain_grads)


@pytest.mark.parametrize("remat_policy", ["none", "dots_saveable"])
def test_the_backward_pass_keeps_no_mask_and_no_float32_stream(remat_policy):
  model_cfg, length = preset_model("")
  model_cfg = dataclasses.replace(model_cfg, dtype="bfloat16", remat_policy=remat_policy)
  tokens = tokens_for(model_cfg, length)
  model = build_model(model_cfg)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens[:, :-1])["params"]
  params = jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), nn.meta.unbox(params))
  residuals = saved_residuals(
      lambda p: token_losses_and_sown(model, p, tokens, (), rng=jax.random.key(3))[0].mean(), params)
  rows = BATCH * length
  full = lambda aval: aval.ndim >= 2 and int(np.prod(aval.shape)) >= rows * model_cfg.d_model
  # one full-size bool is the embedding's, once per step: the rows of out-of-range ids (model/checks.py)
  masks = [(a, source) for a, source in residuals if a.dtype == jnp.bool_ and full(a)
           and "nan_rows_with_bad_ids" not in source]
  assert not masks, masks
  streams = [(a, source) for a, source in residuals
             if a.dtype == jnp.float32 and full(a) and a.shape[-1] == model_cfg.d_model]
  assert not streams, streams


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_has_flax_s_values_and_gradients(dtype):
  x = (jax.random.normal(jax.random.key(1), (4, 16, 64)) * 3 + 1).astype(dtype)
  params = {"params": dict(scale=jax.random.normal(jax.random.key(2), (64,)) + 1,
                           bias=jax.random.normal(jax.random.key(3), (64,)))}
  weights = jax.random.normal(jax.random.key(4), x.shape)
  ours, theirs = layers.LayerNorm(epsilon=1e-6, dtype=dtype), nn.LayerNorm(epsilon=1e-6, dtype=dtype)
  loss = lambda module: lambda params, x: (module.apply(params, x).astype(jnp.float32) * weights).sum()
  np.testing.assert_array_equal(ours.apply(params, x), theirs.apply(params, x))
  grads, flax_grads = (jax.grad(loss(m), argnums=(0, 1))(params, x) for m in (ours, theirs))
  ulp = 1e-6 if dtype == jnp.float32 else 2 ** -6  # a bfloat16 dx may round the other way
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                                       rtol=ulp, atol=ulp * 4), grads, flax_grads)
  assert jax.tree.structure(nn.meta.unbox(ours.init(jax.random.key(0), x))) == jax.tree.structure(params)
