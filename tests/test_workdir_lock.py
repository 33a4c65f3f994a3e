"""One writer per workdir: a live run's lock refuses a second hourglass-train, naming it; a stale lock is taken over
with a message; readers work beside a run."""

import json
import re
import socket
import subprocess
import time

import pytest

from hourglass_jax.config import run_config
from hourglass_jax.train.checkpointing import workdir_lock
from hourglass_jax.train.checkpointing.workdir_lock import WorkdirLock
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.loop.evaluate import evaluate_checkpoint
from hourglass_jax.train.loop.loop import train_and_evaluate
from tests.helpers import quiet, tiny_config


def _write_lock(workdir, host: str, pid: int, age: float = 0.0, slurm_job: str | None = None) -> dict:
  now = time.time()
  record = dict(host=host, pid=pid, started=now - age, heartbeat=now - age, slurm_job=slurm_job)
  (workdir / "lock").write_text(json.dumps(record))
  return record


@pytest.fixture
def live_pid():
  process = subprocess.Popen(["sleep", "120"])
  yield process.pid
  process.kill()
  process.wait()


def _dead_pid() -> int:
  process = subprocess.Popen(["true"])
  process.wait()
  return process.pid


def test_a_live_run_refuses_a_second_writer_but_not_readers(tmp_path, live_pid):
  messages = []
  train_and_evaluate(tiny_config(steps=2), tmp_path, log=messages.append)  # takes and releases the lock
  assert not (tmp_path / "lock").exists()
  record = _write_lock(tmp_path, socket.gethostname(), live_pid)
  with pytest.raises(TrainError, match=rf"is in use by another hourglass-train run \(host {socket.gethostname()}, "
                                       rf"pid {live_pid}, .*Use another --workdir, or stop that run first"):
    train_and_evaluate(tiny_config(steps=4), tmp_path, log=quiet)
  assert json.loads((tmp_path / "lock").read_text()) == record  # untouched
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
  reader = evaluate_checkpoint(run_config(tiny_config(steps=2)), tmp_path, log=quiet)
  assert reader["step"] == 2  # a reader is not refused


@pytest.mark.parametrize("holder, reason", [
    (lambda: dict(host=socket.gethostname(), pid=_dead_pid()), r"its process \d+ on this host is no longer running"),
    (lambda: dict(host="other-host", pid=1, age=3600), r"its last heartbeat was 60 minutes ago"),
    (lambda: dict(host="other-host", pid=1, slurm_job="77"), r"it belongs to this SLURM job \(77\), requeued"),
])
def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, monkeypatch, holder, reason):
  monkeypatch.setenv("SLURM_JOB_ID", "77")
  _write_lock(tmp_path, **holder())
  messages = []
  with WorkdirLock(tmp_path, messages.append):
    mine = json.loads((tmp_path / "lock").read_text())
  assert any(m.startswith(f"taking over the stale lock {tmp_path / 'lock'}") and re.search(reason, m)
             for m in messages), messages
  assert mine["host"] == socket.gethostname() and mine["slurm_job"] == "77"
  assert not (tmp_path / "lock").exists()


def test_another_hosts_recent_lock_is_respected(tmp_path):
  _write_lock(tmp_path, "other-host", 1, age=30)
  with pytest.raises(TrainError, match=r"host other-host, pid 1.*alive 30 s ago.*If that run is gone \(its host "
                                       r"died\), delete .*lock and rerun"):
    with WorkdirLock(tmp_path, quiet):
      pass


def test_the_holder_keeps_its_heartbeat_fresh(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_SECONDS", 0.05)
  with WorkdirLock(tmp_path, quiet):
    first = json.loads((tmp_path / "lock").read_text())
    time.sleep(0.5)
    later = json.loads((tmp_path / "lock").read_text())
  assert later["heartbeat"] > first["heartbeat"] and later["started"] == first["started"]
  assert not (tmp_path / "lock").exists()


def test_a_holder_whose_lock_was_taken_over_neither_rewrites_nor_deletes_it(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_SECONDS", 3600.0)  # heartbeats driven by hand below
  messages = []
  with WorkdirLock(tmp_path, messages.append) as lock:
    assert lock.refresh()
    taker = _write_lock(tmp_path, "other-host", 2)  # taken over meanwhile (e.g. this host looked dead)
    assert not lock.refresh()
  assert json.loads((tmp_path / "lock").read_text()) == taker
  assert any("was taken over by host other-host, pid 2" in m for m in messages), messages
