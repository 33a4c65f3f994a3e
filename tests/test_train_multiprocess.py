"""Two processes on localhost (2 CPU devices each, jax.distributed with a 127.0.0.1 coordinator) train together
and match one process."""

import re
import socket
import subprocess

import jax
import numpy as np

from hourglass_jax import sharding
from hourglass_jax.train.checkpoint import Checkpoints, config_record
from hourglass_jax.train.loop import train_and_evaluate
from hourglass_jax.train.trainer import Trainer
from tests.train_util import command_env, quiet, tiny_config, train_command

STEPS = 4


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _params(cfg, workdir):
  mesh = sharding.make_mesh(cfg.mesh)
  trainer = Trainer(cfg, mesh)
  with jax.set_mesh(mesh), Checkpoints(workdir / "checkpoints", 0, 2) as checkpoints:
    state, data_state, step = checkpoints.restore_latest(trainer.abstract, config_record(cfg))
  return jax.device_get(state.params), data_state, step


def test_two_processes_match_one(tmp_path):
  port, workdir = _free_port(), tmp_path / "two"
  processes = [subprocess.Popen(
      train_command(workdir, f"--config.train.steps={STEPS}", f"--coordinator_address=127.0.0.1:{port}",
                    "--num_processes=2", f"--process_id={i}"),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env(devices=2)) for i in range(2)]
  try:
    outputs = [p.communicate(timeout=420) for p in processes]
  finally:
    for p in processes:
      p.kill()
  for p, (out, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  assert "devices: 4 x cpu in 2 process(es)" in outputs[0][0]
  assert "model:" not in outputs[1][0] and "bits/byte" not in outputs[1][0]  # only process 0 reports

  cfg = tiny_config(steps=STEPS)
  single = train_and_evaluate(cfg, tmp_path / "one", log=quiet)  # one process, 8 devices
  bits = float(re.search(rf"step {STEPS}: valid bits/byte ([0-9.]+)", outputs[0][0]).group(1))
  assert abs(bits - single["eval"]["bits"]) < 2e-4
  params_two, data_two, step_two = _params(cfg, workdir)
  params_one, data_one, step_one = _params(cfg, tmp_path / "one")
  assert step_two == step_one == STEPS and data_two == data_one
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params_two, params_one)
