"""Every model kind trains through the trainer (the code behind hourglass-train), and bfloat16 compute keeps
float32 parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.trainer import Trainer
from tests.helpers import tiny_config

KINDS = {
    "vanilla": dict(kind="vanilla", hierarchy="2@1"),
    "hourglass_bfloat16": dict(kind="hourglass", hierarchy="1@1 1@3 1@1", dtype="bfloat16"),
    "topdown": dict(kind="topdown", scales="4,2,1", layers_per_scale="1,1,1"),
    "bottomup": dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2"),
    "retina": dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2",
                   retina_windows="0:1,1:3,3:12"),
}
STEPS = 5


def _train(model: dict) -> tuple[list[float], object]:
  cfg = tiny_config(model=model, mesh=dict(data=1))
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    state = trainer.init_state()
    batch = trainer.global_array(next(trainer.train_iterator()))
    losses = []
    for _ in range(STEPS):  # one batch, repeated: the loss must fall
      state, metrics = trainer.train_step(state, batch)
      losses.append(float(metrics["loss"]))
  return losses, state


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_trains(name):
  losses, state = _train(dict(KINDS[name], dropout=0.0))
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.9 * losses[0], losses
  assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="the device battery's bfloat16 run on a GPU")
@pytest.mark.parametrize("name", KINDS)
def test_every_kind_trains_in_bfloat16_with_dropout_on_gpu(name):
  # attention_impl='auto' with probability dropout in bfloat16 on a GPU: the Pallas flash kernel (ops/flash_dropout)
  losses, _ = _train(dict(KINDS[name], dropout=0.1, dtype="bfloat16"))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
