"""The sharded train step of a small Hourglass (data x tensor; fsdp with gradient accumulation) computes what
one device computes."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.trainer import Trainer
from tests.helpers import HOURGLASS, tiny_config

STEPS = 3


def _run(cfg, devices, state0=None):
  """Losses and final state after STEPS steps from `state0` (placed onto this mesh) on the config's batches."""
  mesh = sharding.make_mesh(cfg.mesh, devices)
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh):
    state = trainer.init_state() if state0 is None else jax.device_put(state0, trainer.shardings)
    state0 = jax.device_get(state) if state0 is None else state0
    batches, losses = trainer.train_iterator(), []
    for _ in range(STEPS):
      state, metrics = trainer.train_step(state, trainer.global_array(next(batches)))
      losses.append(float(metrics["loss"]))
    return np.array(losses), state, state0


def test_sharded_steps_match_one_device():
  losses_1, state_1, state0 = _run(tiny_config(**HOURGLASS, mesh=dict(data=1)), jax.devices()[:1])
  params_1 = jax.device_get(state_1.params)
  for mesh, accum, shard_shape in [(dict(data=4, fsdp=1, tensor=2), 1, (1, 32, 32)),
                                   (dict(data=1, fsdp=8, tensor=1), 2, (1, 4, 64))]:
    cfg = tiny_config(**HOURGLASS, mesh=mesh)
    cfg.train.grad_accum_steps = accum  # two strided micro-batches of 8 make the same update as one batch of 16
    losses, state, _ = _run(cfg, jax.devices(), state0)
    np.testing.assert_allclose(losses, losses_1, rtol=1e-5, atol=1e-5, err_msg=str(mesh))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=str(mesh)),
                 jax.device_get(state.params), params_1)
    kernel = state.params["body"]["pre"]["blocks"]["mlp"]["wi"]["kernel"]  # (layers, embed, mlp): n x 32 x 64
    assert kernel.sharding.spec == P(None, "fsdp", "tensor")
    assert kernel.addressable_shards[0].data.shape == shard_shape
