"""A run interrupted after step k and resumed matches an uninterrupted run, on the same or another mesh."""

import shutil

import jax
import numpy as np
import pytest

from hourglass_jax.train.loop import train_and_evaluate
from tests.helpers import quiet, tiny_config


@pytest.mark.slow
def test_resume_is_exact_and_moves_between_meshes(tmp_path):
  cfg = tiny_config(steps=6, checkpoint=dict(every_steps=3))
  full = train_and_evaluate(cfg, tmp_path, log=quiet)  # 8 devices, data parallel
  assert sorted(full["losses"]) == list(range(1, 7)) and full["stopped"] == "done"

  shutil.rmtree(tmp_path / "checkpoints" / "6")  # as if the run had stopped after step 3
  resumed = train_and_evaluate(cfg, tmp_path, log=quiet)
  assert resumed["start_step"] == 3
  assert resumed["losses"] == {k: full["losses"][k] for k in (4, 5, 6)}  # bitwise: state, RNG and data order
  assert resumed["eval"]["loss"] == full["eval"]["loss"]

  shutil.rmtree(tmp_path / "checkpoints" / "6")
  cfg.mesh.data = 1  # saved on 8 devices, resumed on 1
  moved = train_and_evaluate(cfg, tmp_path, devices=jax.devices()[:1], log=quiet)
  assert moved["start_step"] == 3
  np.testing.assert_allclose([moved["losses"][k] for k in (4, 5, 6)], [full["losses"][k] for k in (4, 5, 6)],
                             rtol=1e-5)
  np.testing.assert_allclose(moved["eval"]["loss"], full["eval"]["loss"], rtol=1e-5)
