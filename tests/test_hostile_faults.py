"""Hostile workdirs and faults (issue 45): a dangling link as the lock, a full disk while taking the lock or while
training, Ctrl-C during evaluation, and a --data_dir that names a file end in one line naming the path and the
fix. Issue 55: the heartbeat never writes through a planted link; Ctrl-C and a full disk in hourglass-data
prepare, a build finished by another run meanwhile, and a second Ctrl-C during a save end in one line."""

import contextlib
import errno
import os
import re
import shutil
import subprocess

import jax
import numpy as np
import pytest

from hourglass_jax import paths
from hourglass_jax.train import preemption
from hourglass_jax.train.checkpoint import Checkpoints, config_record
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.workdir_lock import WorkdirLock
from tests.helpers import quiet, run, train_command, trained_run


@pytest.mark.parametrize("target", ["missing", "elsewhere"])
def test_a_link_as_the_lock_is_refused_in_one_line(tmp_path, target):
  (tmp_path / "elsewhere").write_text("{}")
  (tmp_path / "lock").symlink_to(tmp_path / target)
  with pytest.raises(TrainError, match=r"lock is a symbolic link .*delete the link and rerun"):
    with WorkdirLock(tmp_path, quiet):
      pass
  assert (tmp_path / "elsewhere").read_text() == "{}"  # the link's target is left alone


def test_the_heartbeat_never_writes_through_a_planted_link(tmp_path, monkeypatch):
  """A link planted where a heartbeat could write its temporary file (issue 55): the file outside the workdir is
  left alone and the lock stays a regular file holding this run's record."""
  from hourglass_jax.train import workdir_lock

  monkeypatch.setattr(workdir_lock, "HEARTBEAT_SECONDS", 3600.0)  # heartbeats driven by hand below
  outside = tmp_path / "outside.txt"
  outside.write_text("precious")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / f"lock.{os.getpid()}.tmp").symlink_to(outside)
  with WorkdirLock(workdir, quiet) as lock:
    assert lock.refresh()
    assert not os.path.islink(workdir / "lock") and lock._is_ours(lock._holder())
  assert outside.read_text() == "precious"
  assert sorted(p.name for p in workdir.iterdir()) == [f"lock.{os.getpid()}.tmp"]  # the link, and no temporary


def test_a_full_disk_while_locking_names_the_lock_and_leaves_none(tmp_path, monkeypatch):
  real_fdopen = os.fdopen

  class FullDisk:
    def __init__(self, fd, mode):
      self.file = real_fdopen(fd, mode)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.file.close()

    def write(self, text):
      raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "fdopen", FullDisk)
  with pytest.raises(TrainError, match=rf"cannot write the lock file {tmp_path / 'lock'} \(No space left on device\)"
                                       ".*free disk space"):
    with WorkdirLock(tmp_path, quiet):
      pass
  monkeypatch.undo()
  assert not os.path.lexists(tmp_path / "lock")


@pytest.mark.parametrize("under", [False, True])
def test_a_data_dir_that_is_a_file_names_the_flag(tmp_path, under):
  (tmp_path / "file").write_text("x")
  given = tmp_path / "file" / "sub" if under else tmp_path / "file"
  with pytest.raises(ValueError, match=rf"--data_dir={given} (is a file|lies under the file .*file); pass a folder"):
    paths.check_local_data_dir(str(given), "--data_dir")
  paths.check_local_data_dir(str(tmp_path / "new" / "data"), "--data_dir")
  paths.check_local_data_dir("", "--config.data.data_dir")  # unset: the default folder


def test_ctrl_c_in_a_reading_command_is_one_line_and_exit_130(capsys):
  from hourglass_jax.cli import main

  def interrupted():
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as exit_:
    main._run_reader(interrupted, "hourglass-eval")
  assert exit_.value.code == 130
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: hourglass-eval interrupted (Ctrl-C)") and "\n" not in err


@pytest.mark.parametrize("fault, expected", [
    (KeyboardInterrupt(), r"error: hourglass-data prepare interrupted \(Ctrl-C\); nothing was lost: rerun"),
    (RuntimeError('Failed to finalize writing of split "train": write() failed: No space left on device; writing '
                  'x.array_record'), r"error: disk full: building text_files under .*data failed \(No space left on "
                                     r"device\); the partial build is not kept\. Free disk space .*then rerun\."),
], ids=["ctrl-c", "full disk"])
def test_prepare_ends_ctrl_c_and_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys, fault, expected):
  """Issue 55: hourglass-data prepare interrupted, or out of space (array_record's RuntimeError), in one line."""
  import types

  import tensorflow_datasets as tfds

  from hourglass_jax.cli import main

  def fail(builder, **kwargs):
    raise fault

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
  (tmp_path / "corpus.txt").write_text("some text\n" * 20)
  monkeypatch.setattr(main, "_MANUAL_DIR", types.SimpleNamespace(value=str(tmp_path / "corpus.txt")))
  monkeypatch.setattr(main, "_DATA_DIR", types.SimpleNamespace(value=str(tmp_path / "data")))
  with pytest.raises(SystemExit) as exit_:
    main._data(["hourglass-data", "prepare", "text_files"])  # what `hourglass-data prepare text_files` runs
  code = exit_.value.code
  err = code if isinstance(code, str) else capsys.readouterr().err.strip()
  assert re.fullmatch(expected + ".*", err) and "\n" not in err, err
  assert code == 130 if isinstance(fault, KeyboardInterrupt) else isinstance(code, str)


def test_a_dataset_prepared_by_another_run_meanwhile_is_not_reported_as_built(tmp_path, monkeypatch):
  """Issue 55: two hourglass-data prepare of text_files on one --data_dir: the second waits for the first's build
  lock, then finds the first one's corpus there and says so instead of "built"."""
  from hourglass_jax.data import prepare, tfds_io

  for name in ("first", "second"):
    (tmp_path / name).mkdir()
    for i in range(3):
      (tmp_path / name / f"{i}.txt").write_text(f"{name} corpus, file {i}\n" * 10)
  real_lock = tfds_io._build_lock

  def the_other_run_builds_first(root, name):
    monkeypatch.setattr(tfds_io, "_build_lock", real_lock)
    tfds_io.prepare("text_files", str(root), str(tmp_path / "first"), progress=False, log=quiet)
    return real_lock(root, name)

  monkeypatch.setattr(tfds_io, "_build_lock", the_other_run_builds_first)
  with pytest.raises(ValueError, match=r"text_files was prepared at .*text_files.1.0.0 by another hourglass-data run "
                                       r"while this one waited for it: .*not necessarily --manual_dir=.*second, and "
                                       r"nothing was built here\. Use another --data_dir, or delete"):
    prepare.prepare_command("text_files", str(tmp_path / "data"), str(tmp_path / "second"), log=quiet)


def test_an_archive_with_the_wrong_checksum_is_one_line(tmp_path, monkeypatch):
  """cifar10 / downsampled ImageNet archives whose checksum does not match: TFDS's error, as one line with the fix."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.download.download_manager import NonMatchingChecksumError

  from hourglass_jax.data import tfds_io

  def wrong_checksum(builder, **kwargs):
    raise NonMatchingChecksumError(f"Artifact https://x/cifar-10.tar.gz, downloaded to {tmp_path}/c.tar.gz, has "
                                   "wrong checksum:\n* Expected: ...\n* Got: ...")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", wrong_checksum)
  with pytest.raises(ValueError, match=r"digits: Artifact .* has wrong checksum: a truncated, damaged or wrong file\. "
                                       "Delete it, download it again") as error:
    tfds_io.prepare("digits", str(tmp_path / "data"), progress=False, log=quiet)
  assert "\n" not in str(error.value)


def test_orbax_disk_full_tracebacks_are_left_to_the_one_line_report(tmp_path):
  """A full disk during an async save: Orbax's threads log a traceback each; while checkpoints are open those
  records are dropped (Checkpoints raises one TrainError naming the folder), other records pass."""
  import logging

  from absl import logging as absl_logging

  from hourglass_jax.train.checkpoint import Checkpoints

  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  try:
    with Checkpoints(tmp_path / "checkpoints", log=quiet):
      try:
        raise OSError(errno.ENOSPC, "No space left on device")
      except OSError:
        absl_logging.exception("_SignalingThread.run() raised an exception")
      absl_logging.error("some other failure")
  finally:
    logger.removeHandler(handler)
  assert [r.getMessage() for r in records] == ["some other failure"]


def test_writes_abandoned_by_a_failed_save_print_nothing(tmp_path):
  """TensorStore writes that complete after Orbax closed the event loop of a failed save report "Event loop is
  closed" as unraisable errors, dozens per save: dropped while checkpoints are open (and after a save ran out of
  space); other unraisable errors reach the previous hook."""
  import sys
  import types

  seen = []
  previous, sys.unraisablehook = sys.unraisablehook, seen.append
  try:
    with Checkpoints(tmp_path / "checkpoints", log=quiet):
      for error in (RuntimeError("Event loop is closed"), ValueError("other")):
        sys.unraisablehook(types.SimpleNamespace(exc_value=error, object=None))
    assert sys.unraisablehook == seen.append  # removed on closing, as no save failed
  finally:
    sys.unraisablehook = previous
  assert [str(u.exc_value) for u in seen] == ["other"]


def test_a_second_ctrl_c_during_a_save_ends_in_one_line(tmp_path, monkeypatch, capsys):
  """Issue 55: a Ctrl-C that interrupts a save leaves Orbax's record of it (a traceback) and abandoned writes that
  each report "Event loop is closed", hundreds of lines: both are dropped after checkpoints close on the interrupt,
  and hourglass-train prints its one line and exits 130 at once (os._exit: no shutdown runs the abandoned writes)."""
  import logging
  import sys
  import types

  from absl import logging as absl_logging

  from hourglass_jax.cli import main

  records, seen = [], []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  previous, sys.unraisablehook = sys.unraisablehook, seen.append
  try:
    with pytest.raises(KeyboardInterrupt), Checkpoints(tmp_path / "checkpoints", log=quiet):
      try:
        raise KeyboardInterrupt
      except KeyboardInterrupt:
        absl_logging.exception("[wait_until_finished] Save Finalize thread (save_finalize) failed.")
      raise KeyboardInterrupt
    for error in (RuntimeError("Event loop is closed"), ValueError("other")):
      sys.unraisablehook(types.SimpleNamespace(exc_value=error, object=None))
  finally:
    sys.unraisablehook = previous
    logger.removeHandler(handler)
  assert not records and [str(u.exc_value) for u in seen] == ["other"]

  def interrupted(fn):
    raise KeyboardInterrupt

  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(main, "_run", interrupted)
  monkeypatch.setattr(os, "_exit", exit_now)
  with pytest.raises(SystemExit) as exit_:
    main._train()
  err = capsys.readouterr().err.strip()
  assert exit_.value.code == preemption.EXIT_INTERRUPTED and "\n" not in err
  assert err.startswith("error: aborted by a second Ctrl-C; the steps since the last checkpoint are lost.")


# Run as `python -c FULL_CHECKPOINTS ROOT ARGS...`: every Python-level write under ROOT fails with ENOSPC (Orbax
# writes its metadata and the data position this way; TensorStore's array writes are native and unaffected),
# then hourglass-train runs with ARGS. Stands in for a full disk where tmpfs cannot be mounted.
FULL_CHECKPOINTS = """
import builtins, errno, io, os, sys
root = os.path.realpath(sys.argv.pop(1))
real_open = io.open

def open_(file, mode="r", *args, **kwargs):
  if (set(mode) & set("wax+") and isinstance(file, (str, os.PathLike))
      and os.path.realpath(file).startswith(root + os.sep)):
    raise OSError(errno.ENOSPC, "No space left on device", os.fspath(file))
  return real_open(file, mode, *args, **kwargs)

builtins.open = io.open = open_
from hourglass_jax.cli.main import train_entry
train_entry()
"""


@contextlib.contextmanager
def full_disk(workdir):
  """Yields a function that fills the disk under `workdir` (which holds a finished run) and returns how to start
  hourglass-train there: a small tmpfs mounted on `workdir`, or, where mounting is not permitted, the patched
  writer of FULL_CHECKPOINTS."""
  mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(workdir)], capture_output=True).returncode == 0

  def fill(*flags):
    command = train_command(workdir, *flags)
    if mounted:  # leave room for the lock and the summaries, not for another checkpoint
      (workdir / "filler").write_bytes(b"\0" * (shutil.disk_usage(workdir).free - 256 * 1024))
      return command
    return [command[0], "-c", FULL_CHECKPOINTS, str(workdir / "checkpoints"), *command[3:]]

  try:
    yield fill
  finally:
    if mounted:
      subprocess.run(["umount", "--lazy", str(workdir)], check=True)


def test_a_full_disk_during_training_ends_in_one_line_and_keeps_the_last_checkpoint(tmp_path):
  """A run that resumes from step 2 and finds no room for step 4's checkpoint: one line naming the folder, the
  step that failed, the one intact and the fix; exit 74; no traceback; the lock gone; step 2 restores unchanged."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  with full_disk(workdir) as fill:
    cfg, trainer, saved, _ = trained_run(workdir, steps=2, every_steps=2)
    result = run(fill("--config.train.steps=8", "--config.checkpoint.every_steps=2"))
    assert result.returncode == preemption.EXIT_DISK_FULL, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Event loop is closed" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr[-3000:]
    assert re.fullmatch(rf"error: disk full: saving checkpoint step 4 under {re.escape(str(workdir))}/checkpoints "
                        r"failed \(no space left on device\); checkpoint step 2 is intact\. Free disk space .*point "
                        r"--workdir there\), then rerun the same command to resume from step 2\.", errors[0])
    assert not os.path.lexists(workdir / "lock")
    with jax.set_mesh(trainer.mesh), Checkpoints(workdir / "checkpoints", read_only=True, log=quiet) as checkpoints:
      state, _, step = checkpoints.restore_latest(trainer.abstract, config_record(cfg))
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), saved)
