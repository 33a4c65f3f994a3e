"""`hourglass-data prepare NAME`: builds, says what was built and where, and ends bad input with its message."""

import subprocess
import sys


def _data(*args):
  return subprocess.run([sys.executable, "-c", "from hourglass_jax.cli.main import data_entry; data_entry()", *args],
                        capture_output=True, text=True, timeout=120)


def test_prepare_builds_and_reports_splits_and_location(tmp_path):
  folder = tmp_path / "docs"
  folder.mkdir()
  for i in range(4):
    (folder / f"{i}.txt").write_text(f"text number {i}\n" * 50)
  stale = tmp_path / "tfds" / "text_files" / "incomplete.K1LLED_1.0.0"  # what a killed build leaves behind
  stale.mkdir(parents=True)
  (stale / "text_files-train.array_record-00000-of-00001").write_bytes(b"partial")
  done = _data("prepare", "text_files", f"--manual_dir={folder}", f"--data_dir={tmp_path / 'tfds'}")
  assert done.returncode == 0, done.stderr
  assert f"removed {stale}, left by an interrupted build of text_files" in done.stdout and not stale.exists()
  assert f"text_files at {tmp_path / 'tfds' / 'text_files' / '1.0.0'}" in done.stdout
  assert "train: " in done.stdout and "validation: " in done.stdout and " bytes in " in done.stdout
  assert "--config.data.name=text_files" in done.stdout
  # Four documents of the same size: one each for test and validation, far from 90/5/5 (one warning line).
  (warning,) = [line for line in done.stdout.splitlines() if line.startswith("warning:")]
  assert warning.startswith("warning: text_files split by document holds 50% / 25% / 25% of its bytes in train / "
                            "validation / test, far from the 90% / 5% / 5% asked") and "split -C 1M" in warning
  assert "--config.data.name=text_file " in warning
  again = _data("prepare", "text_files", f"--manual_dir={folder}", f"--data_dir={tmp_path / 'tfds'}")
  assert "already prepared" in again.stdout


def test_prepare_ends_bad_input_with_the_fix(tmp_path):
  missing = _data("prepare", "enwik8", f"--manual_dir={tmp_path / 'manual'}", f"--data_dir={tmp_path / 'tfds'}")
  assert missing.returncode != 0
  assert "error: enwik8: enwik8.zip is not in the manual directory" in missing.stderr
  assert "Download http://mattmahoney.net/dc/enwik8.zip" in missing.stderr
  imagenet = _data("prepare", "downsampled_imagenet/32x32", f"--data_dir={tmp_path / 'tfds'}")
  assert "cannot be downloaded automatically: get train_32x32.tar and valid_32x32.tar" in imagenet.stderr
  usage = _data("prepare")
  assert usage.returncode != 0 and "usage: hourglass-data prepare NAME" in usage.stderr
