"""A run interrupted after step k and resumed matches an uninterrupted run, on the same or another mesh; its
metrics.jsonl keeps one line per logged step through the resumes, and hourglass-plot draws it."""

import math
import pathlib
import shutil

import jax
import numpy as np
import pytest

from hourglass_jax.train.loop.loop import train_and_evaluate
from hourglass_jax.train.reporting import curves, run_files
from tests.helpers import quiet, tiny_config


@pytest.mark.slow
def test_resume_is_exact_and_moves_between_meshes(tmp_path):
  cfg = tiny_config(steps=6, checkpoint=dict(every_steps=3))
  full = train_and_evaluate(cfg, tmp_path, log=quiet)  # 8 devices, data parallel
  assert sorted(full["losses"]) == list(range(1, 7)) and full["stopped"] == "done"

  logged = run_files.read_metrics(tmp_path)
  assert [(r["step"], r["split"]) for r in logged] == [(2, "train"), (4, "train"), (6, "train"), (6, "valid")]
  train = {r["step"]: r for r in logged if r["split"] == "train"}
  assert [train[s]["tokens_seen"] for s in (2, 4, 6)] == [n * cfg.data.batch_size * cfg.data.seq_len for n in (2, 4, 6)]
  assert train[6]["loss"] == pytest.approx((full["losses"][5] + full["losses"][6]) / 2, rel=1e-6)
  assert train[6]["bits_per_byte"] == pytest.approx(train[6]["loss"] / math.log(2))
  assert all(r["tokens_per_second"] > 0 and r["grad_norm"] > 0 for r in train.values())
  assert 0 < train[2]["learning_rate"] < train[4]["learning_rate"] == pytest.approx(1e-2)  # warmup, then constant
  assert logged[-1]["loss"] == full["eval"]["loss"] and logged[-1]["whole_split"] is False

  shutil.rmtree(tmp_path / "checkpoints" / "6")  # as if the run had stopped after step 3
  resumed = train_and_evaluate(cfg, tmp_path, log=quiet)
  assert resumed["start_step"] == 3
  assert resumed["losses"] == {k: full["losses"][k] for k in (4, 5, 6)}  # bitwise: state, RNG and data order
  assert resumed["eval"]["loss"] == full["eval"]["loss"]
  # The lines of steps 4-6, written before, went with the checkpoint the run fell back from: no step twice.
  assert [(r["step"], r["split"]) for r in run_files.read_metrics(tmp_path)] == [
      (r["step"], r["split"]) for r in logged]
  assert run_files.read_metrics(tmp_path)[-1]["tokens_seen"] == logged[-1]["tokens_seen"]
  png = pathlib.Path(curves.plot_runs([tmp_path], tmp_path / "plots" / "curves.png", x="tokens"))
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

  shutil.rmtree(tmp_path / "checkpoints" / "6")
  cfg.mesh.data = 1  # saved on 8 devices, resumed on 1
  moved = train_and_evaluate(cfg, tmp_path, devices=jax.devices()[:1], log=quiet)
  assert moved["start_step"] == 3
  np.testing.assert_allclose([moved["losses"][k] for k in (4, 5, 6)], [full["losses"][k] for k in (4, 5, 6)],
                             rtol=1e-5)
  np.testing.assert_allclose(moved["eval"]["loss"], full["eval"]["loss"], rtol=1e-5)
