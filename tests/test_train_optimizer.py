"""Schedules, weight-decay masks, and per-block rematerialisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.optimizer import decay_mask, make_optimizer, make_schedule
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.reporting import metrics
from tests.helpers import tiny_config


@pytest.mark.parametrize("schedule, at_500, at_1000", [
    ("cosine", 0.5e-3 * (1 + np.cos(np.pi * 400 / 900)), 0.0),
    ("rsqrt", 1e-3 * np.sqrt(100 / 500), 1e-3 * np.sqrt(100 / 1000)),
    ("constant", 1e-3, 1e-3),
])
def test_warmup_then_decay(schedule, at_500, at_1000):
  cfg = tiny_config(train=dict(schedule=schedule, learning_rate=1e-3, warmup_steps=100, steps=1000))
  lr = make_schedule(cfg.train)
  assert float(lr(0)) == 0.0 and float(lr(50)) == pytest.approx(0.5e-3) and float(lr(100)) == pytest.approx(1e-3)
  assert float(lr(500)) == pytest.approx(at_500, rel=1e-5) and float(lr(1000)) == pytest.approx(at_1000, abs=1e-9)


def test_weight_decay_skips_norms_and_biases():
  params = {"mlp": {"wi": {"kernel": 1, "bias": 1}}, "norm": {"scale": 1, "bias": 1}, "embed": {"embedding": 1}}
  assert decay_mask(params) == {"mlp": {"wi": {"kernel": True, "bias": False}},
                                "norm": {"scale": False, "bias": False}, "embed": {"embedding": True}}


def test_gradients_are_clipped_before_adamw():
  """Clipping acts on the gradients, not on AdamW's updates: two steps against a NumPy transcription of Adam fed
  the clipped gradients (a learning rate of 1, so the updates themselves exceed the clip norm)."""
  b1, b2, eps, clip = 0.9, 0.95, 1e-8, 1.0
  cfg = tiny_config(train=dict(schedule="constant", learning_rate=1.0, warmup_steps=0, weight_decay=0.0, b1=b1,
                               b2=b2, eps=eps, grad_clip_norm=clip))
  optimizer, _ = make_optimizer(cfg.train)
  params = {"w": {"kernel": jnp.zeros(2)}}
  state, m, v = optimizer.init(params), np.zeros(2), np.zeros(2)
  for t, g in enumerate((np.array([100.0, 0.0]), np.array([0.5, -0.25])), start=1):
    updates, state = optimizer.update({"w": {"kernel": jnp.asarray(g, jnp.float32)}}, state, params)
    g = g * min(1.0, clip / np.linalg.norm(g))
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    expected = -(m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(np.asarray(updates["w"]["kernel"]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_remat_keeps_the_step_and_lowers_memory():
  """Three scanned blocks: the scan stores each block's activations for the backward pass unless remat recomputes
  them (nothing_saveable) or keeps only the matmul outputs (dots_saveable)."""
  results = []
  for policy in ("none", "nothing_saveable", "dots_saveable"):
    cfg = tiny_config(mesh=dict(data=1), model=dict(hierarchy="3@1", remat_policy=policy))
    mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
    trainer = Trainer(run_config(cfg), mesh)
    with jax.set_mesh(mesh):
      compiled = trainer.compile_train_step()
      state = trainer.init_state()
      _, out = compiled(state, trainer.global_array(next(trainer.train_iterator())))
      results.append((compiled.memory_analysis().temp_size_in_bytes, float(out["loss"]),
                      float(out["grad_norm"]), metrics.cost_flops(compiled)))
  (temp, loss, grad, flops), (temp_n, loss_n, grad_n, flops_n), (temp_d, loss_d, grad_d, flops_d) = results
  for loss_r, grad_r in ((loss_n, grad_n), (loss_d, grad_d)):
    assert loss_r == pytest.approx(loss, rel=1e-6) and grad_r == pytest.approx(grad, rel=1e-5)
  assert temp_n < temp_d < temp  # recompute everything < keep the dots < keep everything
  # Recomputing everything repeats the matmuls; keeping the dots repeats only elementwise work (norms, GELU, the
  # dropout hash), whose XLA count can land on either side of the program without remat.
  assert flops_n > max(flops_d, flops) and flops_n - flops_d > 0.1 * flops


def test_an_unknown_remat_policy_is_refused_before_compiling():
  cfg = tiny_config(model=dict(remat_policy="everything"), mesh=dict(data=1))
  with pytest.raises(ValueError, match=r"model.remat_policy='everything' is not supported; choose one of .*dots_sav"):
    run_config(cfg)
