"""Shared settings for the training-system tests. One config (batch 8, dropout, constant learning rate after
warmup, a one-layer model unless the test is about the Hourglass itself) so runs of any length compile the same
programs and share the persistent compilation cache, in-process and in subprocesses (8 CPU devices each)."""

import os
import socket
import subprocess
import sys

import jax
import ml_collections

from hourglass_jax import sharding
from hourglass_jax.train.checkpoint import Checkpoints, config_record
from hourglass_jax.train.loop import train_and_evaluate
from hourglass_jax.train.trainer import Trainer
from tests.test_model import CONFIGS, load_config

ONE_LAYER = dict(kind="vanilla", hierarchy="1@1")
# The Hourglass tests' settings: a small Hourglass (shift, shorten, upsample) that compiles quickly, batch 16.
HOURGLASS = dict(model=dict(kind="hourglass", hierarchy="1@1 1@2 1@1", shorten="avg", upsample="repeat",
                            dropout=0.0), data=dict(batch_size=16))
FLAGS = ("--config.model.kind=vanilla", "--config.model.hierarchy=1@1", "--config.model.dropout=0.1",
         "--config.data.batch_size=8", "--config.data.eval_batches=1", "--config.train.schedule=constant",
         "--config.train.learning_rate=0.01", "--config.train.eval_every=0", "--config.train.log_every=2",
         "--config.train.peak_flops_per_device=1e9", "--config.checkpoint.every_steps=0")


def tiny_config(steps: int = 6, **sections) -> ml_collections.ConfigDict:
  """configs/tiny.py as FLAGS set it (one vanilla layer), with per-section overrides."""
  cfg = load_config("tiny")
  cfg.model.update(dropout=0.1, **ONE_LAYER)
  cfg.data.update(batch_size=8, eval_batches=1)
  cfg.train.update(steps=steps, schedule="constant", learning_rate=1e-2, eval_every=0, log_every=2,
                   peak_flops_per_device=1e9)
  cfg.checkpoint.update(every_steps=0)
  for section, values in sections.items():
    cfg[section].update(values)
  return cfg


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on (for a coordinator or a local server)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def command_env(devices: int = 8) -> dict:
  """Environment for a subprocess with `devices` CPU devices (the compilation cache dir is inherited)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CONFIGS.parent), env.get("PYTHONPATH")]))
  return env


def train_command(workdir, *flags: str, entry: str = "train_entry") -> list[str]:
  """`hourglass-train` (or `hourglass-eval` with entry='eval_entry') on the shared config."""
  return [sys.executable, "-c", f"from hourglass_jax.main import {entry}; {entry}()",
          f"--config={CONFIGS / 'tiny.py'}", f"--workdir={workdir}", *FLAGS, *flags]


def run(command, timeout: int = 300, devices: int = 8) -> subprocess.CompletedProcess:
  return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=command_env(devices))


def quiet(_message: str) -> None:
  pass


def trained_run(workdir, steps: int = 4, every_steps: int = 2):
  """Trains the shared config with checkpoints every `every_steps` steps into `workdir` (the integrity and export
  tests share this run, so their programs hit the same cached compiles); returns the config, its trainer, and
  the newest checkpoint's state (on the host) and data state."""
  cfg = tiny_config(steps=steps, checkpoint=dict(every_steps=every_steps))
  train_and_evaluate(cfg, workdir, log=quiet)
  trainer = Trainer(cfg, sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh), Checkpoints(workdir / "checkpoints", read_only=True, log=quiet) as checkpoints:
    state, data_state, step = checkpoints.restore_latest(trainer.abstract, config_record(cfg))
  assert step == steps
  return cfg, trainer, jax.device_get(state), data_state
