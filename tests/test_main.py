"""The command lines run end to end: hourglass-train trains, checkpoints and logs; hourglass-eval scores it."""

import numpy as np

from hourglass_jax.data.embedded import stdlib_bytes
from tests.train_util import run, train_command


def test_embedded_corpus_is_real_text():
  corpus = stdlib_bytes(max_bytes=100_000)
  assert corpus.dtype == np.uint8 and len(corpus) == 100_000
  assert b"def " in corpus.tobytes()


def test_train_then_eval_commands(tmp_path):
  train = run(train_command(tmp_path, "--config.train.steps=3"))
  assert train.returncode == 0, train.stderr[-3000:]
  for expected in ("params", "GFLOPs/step", "MiB/device", "step 3: valid bits/byte", "tokens/s"):
    assert expected in train.stdout, train.stdout
  assert (tmp_path / "checkpoints" / "3" / "state").is_dir()
  assert list(tmp_path.glob("events.out.tfevents.*"))

  evaluate = run(train_command(tmp_path, "--split=test", entry="eval_entry"))
  assert evaluate.returncode == 0, evaluate.stderr[-3000:]
  assert "step 3: test bits/byte" in evaluate.stdout


def test_train_command_rejects_a_bad_override(tmp_path):
  bad = run(train_command(tmp_path, "--config.model.kind=hourglass", "--config.model.hierarchy=1@1 2@3 2@3 1@1"))
  assert bad.returncode != 0
  assert "model.hierarchy='1@1 2@3 2@3 1@1'" in bad.stderr
