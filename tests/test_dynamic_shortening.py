"""shorten='dynamic' in the model: causality past the segment capacity and of 'gumbel' sample evaluation, gradients
reaching the learned predictor through the straight-through segments, the boundary prior in the train step's loss
and metrics, and clear errors. Every predictor's causality, decoding, counts and presets: test_predictors.py."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model import build_model
from hourglass_jax.model.hourglass import whitespace_boundaries
from hourglass_jax.model.hourglass.dynamic.predictors.gumbel import evaluation_noise
from hourglass_jax.runtime import sharding
from hourglass_jax.testing import causality_violations, random_variables
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop import loop
from hourglass_jax.train.loop.evaluate import describe, evaluate
from hourglass_jax.train.reporting.metrics import boundary_rates_apart
from tests.helpers import (BATCH, SMALL, assert_causal, jitted_apply, load_config, mixed_variables, small_config, sown,
                           tiny_config)

DYNAMIC = dict(hierarchy="1@1 2@3 1@1", shorten="dynamic", upsample="repeat")


def test_segments_past_the_capacity_stay_causal():
  """segment_capacity 0.5 keeps 3 segments of a 12-token row: later positions share the merged tail."""
  cfg = small_config(**DYNAMIC, boundaries="whitespace", segment_capacity=0.5)
  model = build_model(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 12)), jnp.int32)
  assert float(sown(model, random_variables(model, tokens), tokens)["metrics"]["body"]["shorten"]
               ["segment_overflow"][0]) > 0
  assert_causal(cfg, 12)


def _rate(model, variables, tokens, **kwargs):
  return float(sown(model, variables, tokens, **kwargs)["metrics"]["body"]["shorten"]["boundary_rate"][0])


def test_gumbel_sample_evaluation_cuts_at_the_training_rate_the_same_way_every_time():
  """With every logit at log-odds(1/4) (an unsure predictor), 'threshold' evaluation never cuts, while 'sample'
  cuts about as often as training does, and the same places on every call and in every row."""
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, SMALL["vocab_size"], (4, 256)), jnp.int32)
  models = {e: build_model(small_config(**DYNAMIC, boundaries="gumbel", gumbel_evaluation=e))
            for e in ("threshold", "sample")}
  variables = {"params": nn.meta.unbox(jax.jit(models["sample"].init)(jax.random.key(0), tokens[:, :12]))["params"]}
  logit = variables["params"]["body"]["shorten"]["predictor"]["logit"]
  logit["kernel"], logit["bias"] = jnp.zeros_like(logit["kernel"]), jnp.full_like(logit["bias"], np.log(1 / 3))
  assert _rate(models["threshold"], variables, tokens) == 0.0
  sampled = _rate(models["sample"], variables, tokens)
  trained = _rate(models["sample"], variables, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert abs(sampled - 0.25) <= 3 / 256 and abs(trained - 0.25) < 0.05, (sampled, trained)
  cuts = [jitted_apply(models["sample"])(variables, tokens, mutable=("intermediates",))[1]["intermediates"]["body"]["shorten"]
          ["boundaries"][0] for _ in range(2)]
  np.testing.assert_array_equal(cuts[0], cuts[1])
  assert (cuts[0] == cuts[0][:1]).all()  # noise by position: every row cuts alike when the logits are alike


@pytest.mark.parametrize("start, length", [(0, 256), (0, 37), (1000, 100), (123457, 256), (2 ** 31 - 100, 200)])
def test_gumbel_evaluation_noise_spreads_every_window_as_training_draws_do_on_average(start, length):
  """'sample' evaluation's fixed noise cuts any window of positions at the rate a constant logit's training draws
  have on average, within 3 / length (one independent draw per position missed by 6 / 256 at the first 256)."""
  noise_L = np.asarray(evaluation_noise(jnp.arange(start, start + length, dtype=jnp.uint32)))
  assert np.isfinite(noise_L).all()
  for rate in (0.1, 0.25, 0.5):
    assert abs(np.mean(noise_L > -np.log(rate / (1 - rate))) - rate) <= 3 / length, rate


@pytest.mark.parametrize("length", [12, pytest.param(11, marks=pytest.mark.slow)])
def test_gumbel_sample_evaluation_is_causal(length):
  model = build_model(small_config(**DYNAMIC, boundaries="gumbel", gumbel_evaluation="sample"))
  variables = mixed_variables(model, length)
  problems = causality_violations(lambda tokens: jitted_apply(model)(variables, tokens), length, SMALL["vocab_size"],
                                  batch_size=BATCH)
  assert not problems, problems[:3]


@pytest.mark.parametrize("boundaries, module, leaves", [("gumbel", "predictor", (("hidden", "kernel"), ("logit", "bias"))),
                                                       ("routing", "router", (("query", "kernel"), ("key", "kernel"))),
                                                       ("entropy", "entropy", (("threshold",),))])
def test_the_predictor_learns_from_the_language_model_loss(boundaries, module, leaves):
  """The straight-through segment weights (and for 'routing' the smoothing) carry the LM loss's gradient to the
  predictor's parameters (its own loss off); the entropy head is trained by its own loss alone."""
  cfg = small_config(**DYNAMIC, boundaries=boundaries, boundary_loss_weight=0.0)
  model = build_model(cfg)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)), jnp.int32)
  params = nn.meta.unbox(mixed_variables(model, 12))["params"]

  def lm_loss(params):
    logits = jitted_apply(model)({"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.key(0)})
    return -jax.nn.log_softmax(logits)[..., 0].mean()

  grads = jax.jit(jax.grad(lm_loss))(params)["body"]["shorten"][module]
  for path in leaves:
    leaf = functools.reduce(lambda tree, key: tree[key], path, grads)
    assert float(jnp.abs(leaf).max()) > 1e-6, path
  if boundaries == "entropy":
    assert float(jnp.abs(grads["head"]["kernel"]).max()) == 0.0


def test_linear_pooling_starts_as_the_mean_and_learns_a_matrix_per_segment_position():
  """Its matrices start at the identity: the model equals the mean-pooling one with the same other parameters.
  The LM loss reaches every matrix, each position's through the positions of its index."""
  linear = build_model(small_config(**DYNAMIC, boundaries="whitespace", segment_pooling="linear"))
  mean = build_model(small_config(**DYNAMIC, boundaries="whitespace"))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, SMALL["vocab_size"], (2, 12)), jnp.int32)
  tokens = tokens.at[:, ::2].set(ord(" "))  # segments of 2 positions: indexes 0 and 1 of the 3 matrices
  tokens = tokens.at[0, 1:8].set(ord("#"))  # and one of 8 positions: index 2 for its positions 2 to 7
  init = nn.meta.unbox(jax.jit(linear.init)(jax.random.key(0), tokens))["params"]["body"]["shorten"]["pool"]
  identity = np.broadcast_to(np.eye(SMALL["d_model"], dtype=np.float32), (3, SMALL["d_model"], SMALL["d_model"]))
  np.testing.assert_array_equal(init["kernel"], identity)
  np.testing.assert_array_equal(init["bias"], 0.0)
  params = nn.meta.unbox(random_variables(linear, tokens))["params"]  # random, but for the matrices as initialised
  params["body"]["shorten"]["pool"] = init
  without_pool = {**params, "body": {**params["body"], "shorten": {}}}
  np.testing.assert_allclose(jitted_apply(linear)({"params": params}, tokens),
                             jitted_apply(mean)({"params": without_pool}, tokens),
                             atol=1e-5)

  def lm_loss(params):
    return -jax.nn.log_softmax(jitted_apply(linear)({"params": params}, tokens))[..., 0].mean()

  kernel_grad = jax.grad(lm_loss)(params)["body"]["shorten"]["pool"]["kernel"]
  assert all(float(jnp.abs(kernel_grad[s]).max()) > 1e-6 for s in range(3))


def test_the_entropy_head_learns_to_predict_the_next_token():
  """Its loss is the cross-entropy of the next token, sown beside the prior; its gradient reaches the head."""
  cfg = small_config(**DYNAMIC, boundaries="entropy")
  model = build_model(cfg)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 12)), jnp.int32)
  params = nn.meta.unbox(random_variables(model, tokens))["params"]

  def head_loss(params):
    return sown(model, {"params": params}, tokens)["losses"]["body"]["shorten"]["entropy_head"][0]

  loss, grads = jax.value_and_grad(head_loss)(params)
  assert 0 < float(loss) < 2 * np.log(cfg.vocab_size)
  assert params["body"]["shorten"]["entropy"]["head"]["kernel"].shape == (cfg.d_model, cfg.vocab_size)
  assert float(jnp.abs(grads["body"]["shorten"]["entropy"]["head"]["kernel"]).max()) > 1e-6
  assert float(jnp.abs(grads["body"]["pre"]["final_norm"]["scale"]).max()) == 0.0  # a probe: no gradient upstream


def test_the_train_step_adds_the_boundary_prior_and_reports_the_rates():
  cfg = tiny_config(model=dict(dropout=0.0, kind="hourglass", **DYNAMIC, boundaries="gumbel"), mesh=dict(data=1))
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    state = trainer.init_state()
    batch = trainer.global_array(next(trainer.train_iterator()))
    _, metrics = trainer.train_step(state, batch)
  metrics = {name: float(value) for name, value in metrics.items()}
  assert metrics["aux_loss"] > 0
  assert 1.0 <= metrics["body/shorten/shortening_rate"] <= cfg.data.seq_len
  assert 0.0 <= metrics["body/shorten/segment_overflow"] < 1.0
  # 'loss' is the LM loss alone: about ln(256) at initialisation, whatever the prior adds to the gradient.
  assert abs(metrics["loss"] - np.log(256)) < 0.5


def test_evaluation_reports_the_boundary_rate_it_decoded_with():
  """The evaluation boundary rate is what the model cut in evaluation mode: for 'whitespace', the fraction of
  input bytes in the boundary set, batch by batch."""
  cfg = tiny_config(model=dict(kind="hourglass", **DYNAMIC, boundaries="whitespace"), mesh=dict(data=1))
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    result = evaluate(trainer, trainer.init_state().params, cfg.data.eval_split, 2)
  source = trainer.eval_source(cfg.data.eval_split)
  rates = [np.asarray(whitespace_boundaries(jnp.asarray(tokens[:, :-1]))).mean()
           for tokens, _ in pipeline.eval_iterator(source, trainer.batch_size, trainer.rows, 2)]
  assert len(rates) == 2 and 0 < np.mean(rates) < 1
  np.testing.assert_allclose(result["metrics"]["body/shorten/boundary_rate"], np.mean(rates), rtol=1e-6)
  assert "body/shorten/boundary_rate" in describe(result, cfg.data.eval_split)


def test_evaluation_rates_count_the_real_windows_and_not_the_last_batchs_padding(tmp_path):
  """A split of 9 windows at batch 8: the second batch holds one real window. Its boundary rate counts as one
  window's, not as a batch's, and the padding (copies of that window) adds no rate of its own."""
  text = (b"To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer\n" * 40)
  cfg = tiny_config(model=dict(kind="hourglass", **DYNAMIC, boundaries="whitespace"), mesh=dict(data=1),
                    data=dict(name="text_file", seq_len=48, eval_batches=0, batch_size=8))
  for size in range(2000, 20000, 7):  # a corpus whose validation split has 9 windows, the last one mostly text
    path = tmp_path / f"corpus{size}.txt"
    path.write_bytes((text * 6)[:size])
    cfg.data.path = str(path)
    source = sources.make_source(DataSettings.of(cfg.data), cfg.data.eval_split, cfg.model.vocab_size, 0,
                                 eval_windows=True)
    if len(source) == 9 and np.count_nonzero(source[8]) > 40:
      break
  assert len(source) == 9 and np.count_nonzero(source[8]) > 40
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    result = evaluate(trainer, trainer.init_state().params, cfg.data.eval_split)
  rows = np.stack([source[i][:-1] for i in range(len(source))])
  rates = np.asarray(whitespace_boundaries(jnp.asarray(rows))).mean(axis=1)
  assert rates[-1] != rates[:8].mean()  # else the weighting would not show
  np.testing.assert_allclose(result["metrics"]["body/shorten/boundary_rate"], rates.mean(), rtol=1e-6)
  np.testing.assert_allclose(result["metrics"]["body/shorten/shortening_rate"],
                             (8 / rates[:8].mean() + 1 / rates[-1]) / 9, rtol=1e-5)


def test_a_level_that_cuts_otherwise_in_evaluation_than_in_training_is_named():
  train = {"body/shorten/boundary_rate": 0.24, "body/inner/shorten/boundary_rate": 0.2, "aux_loss": 0.1}
  assert boundary_rates_apart(train, {"body/shorten/boundary_rate": 0.13, "body/inner/shorten/boundary_rate": 0.39,
                                      "body/shorten/shortening_rate": 9.0}) == {}  # within 2x either way
  apart = boundary_rates_apart(train, {"body/shorten/boundary_rate": 0.024, "body/inner/shorten/boundary_rate": 0.5})
  assert sorted(apart) == ["body/inner/shorten/boundary_rate", "body/shorten/boundary_rate"]
  assert "0.024 in evaluation against 0.24 in training: the level cuts 10.0x less often" in apart[
      "body/shorten/boundary_rate"]
  assert "cuts 2.5x more often" in apart["body/inner/shorten/boundary_rate"]
  assert "does not cut at all" in boundary_rates_apart(train, {"body/shorten/boundary_rate": 0.0})[
      "body/shorten/boundary_rate"]
  assert boundary_rates_apart({}, {"body/shorten/boundary_rate": 0.0}) == {}  # evaluation alone: nothing to compare


def test_training_warns_once_when_gumbel_evaluation_does_not_cut(tmp_path, monkeypatch):
  """A 'gumbel' level whose logits sit below 1/2 everywhere cuts nothing under the default threshold evaluation,
  while training's draw cut about 1/3 of the positions: the run says so, once, beside the evaluation."""
  def unsure_predictor(trainer, params, *args):
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x - 10.0 if "logit" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path)
        else x, params)
    return evaluate(trainer, params, *args)

  monkeypatch.setattr(loop, "evaluate", unsure_predictor)
  cfg = tiny_config(steps=2, model=dict(kind="hourglass", **DYNAMIC, boundaries="gumbel"), mesh=dict(data=1),
                    train=dict(eval_every=1, warmup_steps=0))
  messages = []
  summary = loop.train_and_evaluate(cfg, tmp_path, devices=jax.devices()[:1], log=messages.append)
  assert summary["eval"]["metrics"]["body/shorten/boundary_rate"] == 0.0
  warnings = [m for m in messages if m.startswith("warning:")]
  assert len(warnings) == 1, warnings  # two evaluations, one warning
  assert "body/shorten/boundary_rate is 0 in evaluation" in warnings[0] and "does not cut at all" in warnings[0]
  assert "model.gumbel_evaluation='sample'" in warnings[0]


def test_the_train_step_adds_the_weighted_ratio_loss_for_routing():
  def first_step(weight):
    cfg = tiny_config(model=dict(dropout=0.0, kind="hourglass", **DYNAMIC, boundaries="routing",
                                 boundary_loss_weight=weight), mesh=dict(data=1))
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    trainer = Trainer(run_config(cfg), mesh)
    with jax.set_mesh(mesh):
      _, metrics = trainer.train_step(trainer.init_state(), trainer.global_array(next(trainer.train_iterator())))
    return {name: float(value) for name, value in metrics.items()}

  half, full = first_step(0.5), first_step(1.0)
  assert full["aux_loss"] > 0 and abs(full["aux_loss"] - 2 * half["aux_loss"]) < 1e-5
  assert full["loss"] == half["loss"] and 0.0 <= full["body/shorten/boundary_rate"] <= 1.0


def test_only_models_that_sow_losses_report_an_auxiliary_loss():
  cfg = tiny_config(mesh=dict(data=1))
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    _, metrics = trainer.train_step(trainer.init_state(), trainer.global_array(next(trainer.train_iterator())))
  assert set(metrics) == {"loss", "grad_norm", "update_norm", "learning_rate"}


@pytest.mark.parametrize("overrides, message", [
    (dict(boundaries="gumbel,routing"), "names 2 predictors for 1 shortened levels"),
    (dict(upsample="attention_repeat"), "upsample='repeat'"),
    (dict(boundaries="spaces"), "model.boundaries='spaces' is not supported"),
    (dict(boundaries="whitespace", boundary_bytes=""), "boundary_bytes"),
    (dict(boundaries="whitespace", boundary_bytes="\u2014"), "boundary_bytes"),
    (dict(segment_capacity=0.0), "segment_capacity"),
    (dict(segment_pooling="max"), "model.segment_pooling='max' is not supported; choose one of mean, linear"),
    (dict(gumbel_evaluation="argmax"), "model.gumbel_evaluation='argmax' is not supported"),
    (dict(gumbel_temperature=-1.0), "gumbel_temperature"),
    (dict(boundary_loss_weight=-1.0), "boundary_loss_weight"),
])
def test_bad_dynamic_settings_are_named(overrides, message):
  with pytest.raises(ValueError, match=message):
    small_config(**dict(DYNAMIC, **overrides))


def test_the_presets_default_to_the_best_predictor_at_a_fixed_levels_cost():
  """Without :NAME the learned-shortening presets pick 'whitespace' (the study's lowest bits per byte), and every
  preset meant for a fixed budget keeps segment capacity 1.0 (a fixed level's slots and FLOPs)."""
  for cfg in (load_config("dynamic"), load_config("enwik8_dynamic"), load_config("gpu", "dynamic")):
    assert (cfg.model.boundaries, cfg.model.segment_capacity) == ("whitespace", 1.0)
  assert load_config("enwik8_dynamic", "gumbel").model.segment_capacity == 1.0
