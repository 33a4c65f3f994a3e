"""The main job's command line runs end to end on the tiny config and learns."""

import subprocess
import sys

import numpy as np

from hourglass_jax.data.embedded import stdlib_bytes
from tests.test_model import CONFIGS, load_config


def test_embedded_corpus_is_real_text():
  corpus = stdlib_bytes(max_bytes=100_000)
  assert corpus.dtype == np.uint8 and len(corpus) == 100_000
  assert b"def " in corpus.tobytes()


def test_smoke_training_lowers_the_eval_loss():
  from hourglass_jax.train.smoke import train_smoke

  cfg = load_config("tiny")
  cfg.train.steps = 40
  result = train_smoke(cfg, log=lambda _: None)
  assert result["last_eval_loss"] < result["first_eval_loss"] - 0.5
  assert np.isfinite(result["tokens_per_second"])


def test_train_command_runs(tmp_path):
  command = [sys.executable, "-m", "hourglass_jax.main", f"--config={CONFIGS / 'tiny.py'}",
             f"--workdir={tmp_path}", "--config.train.steps=3", "--config.model.hierarchy=1@1 1@2 1@1"]
  run = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "68,288 params" not in run.stdout and "params" in run.stdout
  assert "eval bits/byte" in run.stdout


def test_train_command_rejects_a_bad_override(tmp_path):
  command = [sys.executable, "-m", "hourglass_jax.main", f"--config={CONFIGS / 'tiny.py'}",
             f"--workdir={tmp_path}", "--config.model.hierarchy=1@1 2@3 2@3 1@1"]
  run = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert run.returncode != 0
  assert "model.hierarchy='1@1 2@3 2@3 1@1'" in run.stderr
