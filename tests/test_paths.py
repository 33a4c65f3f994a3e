import importlib.util
import os
import socket
import time

import pytest

from hourglass_jax.runtime import files, paths
from tests.helpers import free_port, run, train_command


def test_bucket_urls_keep_their_scheme_and_local_paths_become_absolute():
  assert os.fspath(paths.as_path("gs://bucket/run") / "checkpoints") == "gs://bucket/run/checkpoints"
  assert os.fspath(paths.as_path("gs://bucket/run").parent) == "gs://bucket"
  assert os.fspath(paths.as_path("~/run")) == os.path.expanduser("~/run")
  assert os.fspath(paths.as_path("run")) == os.path.join(os.getcwd(), "run")
  assert paths.is_remote("gs://bucket/x") and not paths.is_remote("/tmp/gs:/bucket")


def test_a_failed_start_removes_only_the_empty_folders_it_made(tmp_path):
  """hourglass-train removes first_missing(workdir) after a failed start: the folders it made, as far as empty."""
  assert paths.first_missing(tmp_path) is None and paths.first_missing("gs://bucket/run") is None
  made = paths.first_missing(tmp_path / "a" / "b" / "run")
  assert made == str(tmp_path / "a")
  (tmp_path / "a" / "b" / "run" / "checkpoints").mkdir(parents=True)
  paths.remove_empty_folders(made)
  assert not (tmp_path / "a").exists() and tmp_path.is_dir()
  (tmp_path / "a" / "b" / "run" / "checkpoints").mkdir(parents=True)
  (tmp_path / "a" / "b" / "log.txt").write_text("kept")
  paths.remove_empty_folders(made)  # a file stays, with the folders above it; the empty ones beside it go
  assert (tmp_path / "a" / "b" / "log.txt").read_text() == "kept" and not (tmp_path / "a" / "b" / "run").exists()


def test_a_url_this_install_cannot_open_is_refused_with_the_fix(monkeypatch):
  files.check_writable_location("/tmp/run", "--workdir")  # local: nothing to check
  with pytest.raises(ValueError, match="unsupported URL scheme 'ftp'"):
    files.check_writable_location("ftp://host/run", "--workdir")
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in ("gcsfs", "tensorflow") else find_spec(name, *a))
  with pytest.raises(ValueError, match=r"--workdir=gs://b/run: gs:// paths need the gcsfs package.*\[gcs\]"):
    files.check_writable_location("gs://b/run", "--workdir")


def test_train_refuses_an_unusable_workdir_url_before_touching_devices():
  done = run(train_command("ftp://host/run"), timeout=120)
  assert done.returncode != 0 and "--workdir=ftp://host/run: unsupported URL scheme 'ftp'" in done.stderr
  assert "devices:" not in done.stdout


def test_an_unreachable_bucket_service_fails_fast_in_one_line(monkeypatch):
  pytest.importorskip("gcsfs", reason="the [gcs] extra installs gcsfs")
  dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: what an offline host sees, without its 86 s of retries
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)
  with pytest.raises(ValueError, match=rf"--workdir=gs://b/run: cannot reach 127.0.0.1:\d+ \(Connection refused\); "
                                       r"check the network \(or \$STORAGE_EMULATOR_HOST\)"):
    files.check_writable_location("gs://b/run", "--workdir")

  def hang(*_, **__):  # a name lookup that hangs: socket timeouts do not cover it
    time.sleep(3)
    raise OSError("too late")

  monkeypatch.setattr(socket, "create_connection", hang)
  assert paths._unreachable("storage.googleapis.com", 443, seconds=1) == "no answer in 1 s"
  monkeypatch.undo()  # the subprocess below reads STORAGE_EMULATOR_HOST from os.environ
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)

  begin = time.monotonic()
  done = run(train_command("gs://b/run"), timeout=120, devices=1)
  assert time.monotonic() - begin < 60 and done.returncode != 0 and "Traceback" not in done.stderr
  assert [line for line in done.stderr.splitlines() if line.strip()] == [
      f"error: --workdir=gs://b/run: cannot reach {dead[7:]} (Connection refused); check the network (or "
      "$STORAGE_EMULATOR_HOST) and retry, or pass a local folder."]


def test_a_bucket_data_dir_is_refused_with_the_way_to_copy_or_mount_it():
  paths.check_local_data_dir("/data/tfds", "--data_dir")
  with pytest.raises(ValueError, match=r"array_record files, which are read and written as local files only.*gcsfuse"):
    paths.check_local_data_dir("gs://b/tfds", "--data_dir")
  train = run(train_command("/tmp/unused", "--config.data.data_dir=gs://b/tfds"), timeout=120)
  assert train.returncode != 0
  assert "error: --config.data.data_dir=gs://b/tfds: datasets are array_record" in train.stderr
  assert "devices:" not in train.stdout
  prepare = run(train_command("/tmp/unused", entry="data_entry")[:3] + ["prepare", "digits", "--data_dir=gs://b/tfds"],
                timeout=120)
  assert prepare.returncode != 0 and "error: --data_dir=gs://b/tfds: datasets are array_record" in prepare.stderr
