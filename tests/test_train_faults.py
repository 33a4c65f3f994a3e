"""Faults keep earlier checkpoints intact: SIGTERM, Ctrl-C, kill -9, an unreadable checkpoint, divergence (also
right after resuming), another model's checkpoint, a full disk."""

import errno
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.checks import DiskFullError, TrainError
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.loop import train_and_evaluate
from hourglass_jax.train.loop.preemption import EXIT_INTERRUPTED, EXIT_PREEMPTED
from tests.helpers import command_env, quiet, tiny_config, train_command


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, EXIT_PREEMPTED, "SIGTERM/preemption"),
                                                 (signal.SIGINT, EXIT_INTERRUPTED, "Ctrl-C")])
@pytest.mark.slow
def test_sigterm_and_ctrl_c_checkpoint_the_current_step(tmp_path, signum, code, said):
  process = subprocess.Popen(train_command(tmp_path, "--config.train.steps=1000000"), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=command_env())
  lines = []
  reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
  reader.start()
  deadline = time.time() + 240
  while not any(line.startswith("compiled:") for line in lines) and time.time() < deadline:
    time.sleep(0.2)  # the line before the first step
  time.sleep(1.0)
  process.send_signal(signum)
  assert process.wait(timeout=120) == code  # not 0: a scheduler must not read the stop as "finished"
  reader.join(timeout=10)
  output = "".join(lines)
  match = re.search(said + r": saved checkpoint step (\d+)", output)
  assert match, output
  step = int(match.group(1))
  assert 0 < step < 1_000_000
  assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()] == [str(step)]
  assert not (tmp_path / "lock").exists()  # released on the way out


def test_a_second_ctrl_c_aborts_at_once():
  script = """
import os, signal
from hourglass_jax.train.loop.preemption import StopSignals
before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN when launched in the background
with StopSignals(log=print) as signals:
  os.kill(os.getpid(), signal.SIGINT)
  print("requested", signals.requested)
  try:
    os.kill(os.getpid(), signal.SIGINT)
    print("not aborted")
  except KeyboardInterrupt:
    print("aborted")
print("restored", signal.getsignal(signal.SIGINT) is before)
"""
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=command_env(1))
  assert out.returncode == 0, out.stderr
  assert out.stdout.split("\n")[1:] == ["Ctrl-C: saving a checkpoint after this step, then stopping (press Ctrl-C "
                                        "again to abort now, losing the steps since the last checkpoint).",
                                        "requested SIGINT", "aborted", "restored True", ""]


def _saved_steps(workdir) -> list[int]:
  directory = workdir / "checkpoints"
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


@pytest.mark.slow
def test_kill_9_loses_only_the_steps_since_the_last_save(tmp_path):
  process = subprocess.Popen(train_command(tmp_path, "--config.train.steps=1000000",
                                           "--config.checkpoint.every_steps=2"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=command_env())
  deadline = time.time() + 240
  while not [s for s in _saved_steps(tmp_path) if s >= 4] and time.time() < deadline:
    time.sleep(0.1)
  process.kill()  # SIGKILL: no handler runs, a save may be half-written
  process.wait(timeout=60)
  saved = _saved_steps(tmp_path)
  assert saved and saved[-1] >= 4 and all(s % 2 == 0 for s in saved), saved
  cfg = tiny_config(steps=saved[-1] + 2, checkpoint=dict(every_steps=2))
  resumed = train_and_evaluate(cfg, tmp_path, log=quiet)
  assert resumed["start_step"] == saved[-1]
  assert sorted(resumed["losses"]) == [saved[-1] + 1, saved[-1] + 2]


def test_unreadable_latest_checkpoint_is_moved_aside_and_the_previous_one_used(tmp_path):
  """Also: only the latest `checkpoint.keep` checkpoints stay (step 2 of 2, 4, 6 is pruned)."""
  cfg = tiny_config(steps=6, checkpoint=dict(every_steps=2, keep=2))
  train_and_evaluate(cfg, tmp_path, log=quiet)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["4", "6"]
  for path in (tmp_path / "checkpoints" / "6" / "state").rglob("*"):
    if path.is_file():
      path.write_bytes(b"garbage")
  messages = []
  resumed = train_and_evaluate(cfg, tmp_path, log=messages.append)
  assert resumed["start_step"] == 4 and sorted(resumed["losses"]) == [5, 6]
  assert any("checkpoint step 6" in m and "unreadable" in m and "falling back to step 4" in m for m in messages)
  assert sorted(p.name.split("-")[0] for p in (tmp_path / "checkpoints_unreadable").iterdir()) == ["6", "README.txt"]


def test_divergence_stops_before_writing_a_poisoned_checkpoint(tmp_path, monkeypatch):
  calls = []
  global_array = Trainer.global_array

  def poisoned(self, local):
    calls.append(1)
    if len(calls) == 3:  # step 3's tokens lie outside the vocabulary: NaN embeddings, NaN loss
      local = local + 10_000
    return global_array(self, local)

  monkeypatch.setattr(Trainer, "global_array", poisoned)
  cfg = tiny_config(steps=6, checkpoint=dict(every_steps=1))
  with pytest.raises(TrainError, match=r"diverged at step 3: loss nan.*last checkpoint \(step 2\) is intact"):
    train_and_evaluate(cfg, tmp_path, log=quiet)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]


def test_divergence_right_after_resuming_names_the_checkpoint_as_suspect(tmp_path, monkeypatch):
  train_and_evaluate(tiny_config(steps=4, checkpoint=dict(every_steps=2)), tmp_path, log=quiet)
  global_array = Trainer.global_array
  monkeypatch.setattr(Trainer, "global_array", lambda self, local: global_array(self, local + 10_000))
  with pytest.raises(TrainError, match=r"diverged at step 5.*1 step\(s\) after resuming from checkpoint step 4, so "
                                       r"that checkpoint is suspect.*checkpoints/4 into .*checkpoints_unreadable/ "
                                       r"to resume from step 2 instead") as error:
    train_and_evaluate(tiny_config(steps=6, checkpoint=dict(every_steps=2)), tmp_path, log=quiet)
  assert "Lower train.learning_rate" not in str(error.value)


def _trainer_and_zero_state(cfg):
  mesh = sharding.make_mesh(cfg.mesh)
  trainer = Trainer(run_config(cfg), mesh)
  state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype, device=a.sharding), trainer.abstract)
  return trainer, mesh, state


@pytest.mark.parametrize("section, change, message", [
    ("model", dict(d_model=64), r"different model shape \(model.d_model: checkpoint 32, config 64\)"),
    ("train", dict(grad_clip_norm=0.0), r"same model but a different optimizer state"),
])
def test_checkpoint_of_another_configuration_is_refused_before_compiling(tmp_path, section, change, message):
  cfg = tiny_config()
  trainer, mesh, state = _trainer_and_zero_state(cfg)
  with jax.set_mesh(mesh), Checkpoints(tmp_path / "checkpoints", 0, 2) as checkpoints:
    checkpoints.save(5, state, {"next_index": 5}, config_record(run_config(cfg)), force=True)
  cfg[section].update(change)
  with pytest.raises(TrainError, match=message + r".*new --workdir.*left untouched"):
    train_and_evaluate(cfg, tmp_path, log=quiet)
  assert (tmp_path / "checkpoints" / "5" / "state").is_dir()


def test_full_disk_names_the_problem_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
  cfg = tiny_config()
  trainer, mesh, state = _trainer_and_zero_state(cfg)
  with jax.set_mesh(mesh), Checkpoints(tmp_path / "checkpoints", 0, 2) as checkpoints:
    checkpoints.save(1, state, {"next_index": 1}, config_record(run_config(cfg)), force=True)
    checkpoints.wait()

    def no_space(*args, **kwargs):
      raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints.manager, "save", no_space)
    with pytest.raises(DiskFullError, match=r"saving checkpoint step 2 .* \(no space left on device\); checkpoint "
                                            r"step 1 is intact. Free disk space"):
      checkpoints.save(2, state, {"next_index": 2}, config_record(run_config(cfg)), force=True)
  assert (tmp_path / "checkpoints" / "1" / "state").is_dir()


def test_an_mfu_above_100_percent_is_named_with_the_setting_to_fix(tmp_path):
  """A configured peak below the device's real rate would report MFU > 100% without a word; it is named once."""
  messages = []
  low_peak = tiny_config(steps=4, train=dict(peak_flops_per_device=1.0))
  train_and_evaluate(low_peak, tmp_path / "low", log=messages.append)
  warnings = [m for m in messages if "above 100%" in m]
  assert len(warnings) == 1
  assert "train.peak_flops_per_device" in warnings[0] and "1e-12 TFLOP/s per device" in warnings[0]
  messages.clear()
  # The tests' peak, 1 PFLOP/s: no tiny step gets near it.
  train_and_evaluate(tiny_config(steps=4), tmp_path / "default", log=messages.append)
  assert not any("above 100%" in m for m in messages)
