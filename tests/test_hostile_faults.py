"""Hostile workdirs and faults (issue 45): a dangling link as the lock, a full disk while taking the lock, Ctrl-C
during evaluation, and a --data_dir that names a file end in one line naming the path and the fix."""

import errno
import os

import pytest

from hourglass_jax import paths
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.workdir_lock import WorkdirLock
from tests.helpers import quiet


@pytest.mark.parametrize("target", ["missing", "elsewhere"])
def test_a_link_as_the_lock_is_refused_in_one_line(tmp_path, target):
  (tmp_path / "elsewhere").write_text("{}")
  (tmp_path / "lock").symlink_to(tmp_path / target)
  with pytest.raises(TrainError, match=r"lock is a symbolic link .*delete the link and rerun"):
    with WorkdirLock(tmp_path, quiet):
      pass
  assert (tmp_path / "elsewhere").read_text() == "{}"  # the link's target is left alone


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
