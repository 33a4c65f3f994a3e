"""The command lines run end to end: hourglass-train trains, checkpoints and logs; hourglass-eval scores it."""

import json
import re
import sys

import numpy as np
import pytest

from hourglass_jax.data.builders.embedded import stdlib_bytes
from tests.helpers import CONFIGS, run, train_command


def test_embedded_corpus_is_real_text():
  corpus = stdlib_bytes(max_bytes=100_000)
  assert corpus.dtype == np.uint8 and len(corpus) == 100_000
  assert b"def " in corpus.tobytes()


@pytest.mark.slow
def test_train_then_eval_commands(tmp_path):
  train = run(train_command(tmp_path, "--config.train.steps=3"))
  assert train.returncode == 0, train.stderr[-3000:]
  for expected in ("params", "GFLOPs/step", "MiB/device", "step 3: valid bits/byte", "tokens/s"):
    assert expected in train.stdout, train.stdout
  assert (tmp_path / "checkpoints" / "3" / "state").is_dir()
  assert list(tmp_path.glob("events.out.tfevents.*"))
  sample, evaluate = (next(line for line in train.stdout.splitlines() if f"hourglass-{name} --config=" in line)
                      for name in ("sample", "eval"))
  assert f"--workdir={tmp_path} " in sample and "--config.model.hierarchy=1@1" in sample and "--config.data." in sample
  assert "--config.train." not in sample + evaluate  # training settings are no business of sampling or scoring
  assert re.search(r" --prompt='[^\W\d_]{2,} '$", sample), sample  # a word of the data (stdlib_text), not 'def '
  assert re.search(r" --prompt='the '$", sample), sample  # the eval split's most frequent word
  assert f"TensorBoard logs in {tmp_path}" in train.stdout
  assert "step 3: valid bits/byte" in train.stdout and "partial: first 1 of " in train.stdout

  evaluate = run(train_command(tmp_path, "--split=test", entry="eval_entry"))
  assert evaluate.returncode == 0, evaluate.stderr[-3000:]
  (line,) = [line for line in evaluate.stdout.splitlines() if line.startswith("step 3: test bits/byte")]
  assert line.endswith("whole split)") and "partial" not in line  # not the config's eval_batches=1
  assert json.loads((tmp_path / "evaluations" / "3_test.json").read_text())["whole_split"] is True


def test_train_command_rejects_a_bad_override_leaving_no_workdir(tmp_path):
  workdir = tmp_path / "new" / "run"
  bad = run(train_command(workdir, "--config.model.kind=hourglass", "--config.model.hierarchy=1@1 2@3 2@3 1@1"))
  assert bad.returncode != 0
  assert "model.hierarchy='1@1 2@3 2@3 1@1'" in bad.stderr
  assert not (tmp_path / "new").exists() and tmp_path.is_dir()  # the failed start removed the folders it made


def _one_error_line(done, *expected: str) -> None:
  """Failed with one `error:` line holding each of `expected`, and no traceback."""
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert len(errors) == 1 and all(e in errors[0] for e in expected), done.stderr[-3000:]


@pytest.mark.parametrize("config, expected", [
    ("nope.py", ("--config=nope.py: cannot read nope.py (No such file or directory)", "configs/enwik8.py")),
    ("{tmp}/broken.py", ("--config={tmp}/broken.py: invalid syntax at {tmp}/broken.py line 1; fix the file",)),
    (str(CONFIGS), (f"--config={CONFIGS}: {CONFIGS} is a folder; name a config file in it",)),
    (f"{CONFIGS}/enwik8.py:nope", ("unknown preset 'nope'; choose one of pod, pod_fsdp, pod_tensor",)),
    (f"{CONFIGS}/tiny.py:pod", (f"{CONFIGS}/tiny.py has no presets; drop ':pod'",)),
])
def test_a_config_file_that_cannot_be_loaded_ends_in_one_line(tmp_path, config, expected):
  (tmp_path / "broken.py").write_text("def get_config(:\n")
  config, expected = config.format(tmp=tmp_path), [e.format(tmp=tmp_path) for e in expected]
  done = run([sys.executable, "-c", "from hourglass_jax.cli.main import train_entry; train_entry()", f"--config={config}",
              f"--workdir={tmp_path / 'run'}"], timeout=120)
  _one_error_line(done, *expected)


@pytest.mark.parametrize("workdir, expected", [
    ("{tmp}/file", "--workdir={tmp}/file is a file; pass a folder"),
    ("{tmp}/file/run", "--workdir={tmp}/file/run lies under the file {tmp}/file; pass a folder in a writable"),
    ("/proc/hourglass/run", "--workdir=/proc/hourglass/run cannot be created (No such file or directory)"),
])
def test_a_workdir_that_cannot_be_a_folder_ends_in_one_line(tmp_path, workdir, expected):
  (tmp_path / "file").write_text("not a folder")
  done = run(train_command(workdir.format(tmp=tmp_path)), timeout=120, devices=1)
  _one_error_line(done, expected.format(tmp=tmp_path))
  assert "devices:" not in done.stdout
