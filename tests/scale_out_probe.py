"""Test instrumentation for multi-process runs (tests/test_scale_out.py): records, per process, a hash of every
training row it feeds and, per step, the loss, into `<dir>/probe-<process>.txt`. Appends, so a killed and resumed
run keeps both attempts. Not a test module; imported by the subprocesses before hourglass_jax.cli.main runs."""

import hashlib
import os
import pathlib
import time

import jax
import numpy as np

from hourglass_jax.train.compiled.trainer import Trainer


def _replicated_value(x) -> float:
  return float(np.asarray(x.addressable_shards[0].data))


def row_hash(row: np.ndarray) -> str:
  return hashlib.sha1(np.ascontiguousarray(row, np.int32).tobytes()).hexdigest()[:12]


class _Recording:
  """A train iterator that writes the hashes of the rows it yields (get_state / set_state pass through)."""

  def __init__(self, batches, write):
    self.batches, self.write = batches, write

  def __iter__(self):
    return self

  def __next__(self):
    local = next(self.batches)
    self.write("rows " + " ".join(row_hash(r) for r in np.asarray(local)))
    return local

  def get_state(self):
    return self.batches.get_state()

  def set_state(self, state):
    self.write("resume")
    self.batches.set_state(state)


class _RecordingStep:
  """A compiled train step that writes each step's loss; other attributes (cost / memory analysis) pass through."""

  def __init__(self, compiled, write, pause_after, slow_after):
    self.compiled, self.write, self.pause_after, self.slow_after = compiled, write, pause_after, slow_after

  def __call__(self, state, tokens):
    state, metrics = self.compiled(state, tokens)
    step = int(_replicated_value(state.step))
    self.write(f"loss {step} {_replicated_value(metrics['loss']):.9g}")
    if step == self.pause_after:
      self.write("paused")
      time.sleep(3600)  # every process stops here, so the test can kill the run mid-way, at a known step
    if self.slow_after is not None and step >= self.slow_after:
      time.sleep(1.0)  # slow enough that a SIGTERM sent now lands mid-run
    return state, metrics

  def __getattr__(self, name):
    return getattr(self.compiled, name)


def install(directory, pause_after: int | None = None, slow_after: int | None = None, set_attribute=setattr) -> None:
  """Wraps Trainer.train_iterator and Trainer.compile_train_step to record rows and losses under `directory`, to
  sleep for good after step `pause_after` and for a second after each step from `slow_after` on (pass pytest's
  monkeypatch.setattr to undo it after a test)."""
  directory = pathlib.Path(directory)

  def write(line: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"probe-{jax.process_index()}.txt", "a") as f:
      f.write(line + "\n")
      f.flush()
      os.fsync(f.fileno())

  train_iterator, compile_train_step = Trainer.train_iterator, Trainer.compile_train_step

  def recording_iterator(self):
    return _Recording(train_iterator(self), write)

  def recording_compile(self):
    return _RecordingStep(compile_train_step(self), write, pause_after, slow_after)

  set_attribute(Trainer, "train_iterator", recording_iterator)
  set_attribute(Trainer, "compile_train_step", recording_compile)


def paused(path) -> bool:
  path = pathlib.Path(path)
  return path.exists() and "paused" in path.read_text().split()


def last_step(path) -> int:
  path = pathlib.Path(path)
  steps = [int(line.split()[1]) for line in path.read_text().splitlines() if line.startswith("loss ")
           and len(line.split()) == 3] if path.exists() else []
  return max(steps, default=0)


def read(path) -> tuple[list[list[list[str]]], dict[int, list[float]]]:
  """(row hashes of each batch, per attempt (a resumed run starts a new one), {step: [loss of each attempt]}) from
  one probe file."""
  attempts, losses = [[]], {}
  for line in pathlib.Path(path).read_text().splitlines():
    kind, *rest = line.split() or [""]
    if kind == "resume":
      attempts.append([])
    elif kind == "rows":
      attempts[-1].append(rest)
    elif kind == "loss" and len(rest) == 2 and rest[1]:
      losses.setdefault(int(rest[0]), []).append(float(rest[1]))
  return attempts, losses
