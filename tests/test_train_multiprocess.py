"""Two processes on localhost whose device list interleaves the hosts, as jax.make_mesh orders a multi-host TPU
slice along its torus: sharding.make_mesh must group the devices by process so each feeds one block of rows, and
the run must match one process."""

import jax
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.loop import train_and_evaluate
from tests.helpers import quiet, run_two_processes, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS = 4

_PROCESS = """
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from hourglass_jax.train.loop.loop import train_and_evaluate
from tests.helpers import quiet, tiny_config
by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(2)]
interleaved = [d for pair in zip(*by_process) for d in pair]  # p0, p1, p0, p1: no process holds a block
summary = train_and_evaluate(tiny_config(steps=int(sys.argv[4])), sys.argv[3], devices=interleaved, log=quiet)
print(json.dumps({"order": [d.process_index for d in interleaved], "losses": summary["losses"]}))
"""


def _params(cfg, workdir):
  mesh = sharding.make_mesh(cfg.mesh)
  trainer = Trainer(run_config(cfg), mesh)
  with jax.set_mesh(mesh), Checkpoints(workdir / "checkpoints", 0, 2) as checkpoints:
    state, data_state, step = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)))
  return jax.device_get(state.params), data_state, step


def test_two_processes_with_interleaved_devices_match_one(tmp_path):
  workdir = tmp_path / "two"
  reports = run_two_processes(_PROCESS, str(workdir), str(STEPS))
  assert reports[0]["order"] == [0, 1, 0, 1]

  cfg = tiny_config(steps=STEPS)
  single = train_and_evaluate(cfg, tmp_path / "one", log=quiet)  # one process, 8 devices
  for report in reports:
    np.testing.assert_allclose([report["losses"][str(s)] for s in range(1, STEPS + 1)],
                               [single["losses"][s] for s in range(1, STEPS + 1)], atol=2e-4)
  params_two, data_two, step_two = _params(cfg, workdir)
  params_one, data_one, step_one = _params(cfg, tmp_path / "one")
  assert step_two == step_one == STEPS and data_two == data_one
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), params_two, params_one)
