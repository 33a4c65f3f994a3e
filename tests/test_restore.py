"""One restore path: evaluation, sampling and export read the params alone (an Orbax partial restore) through the
checks training's resume makes, and build no optimizer, no train step and no train split to do it."""

import json

import numpy as np
import orbax.checkpoint as ocp
import pytest

from hourglass_jax.cli.sample import SampleOptions, sample
from hourglass_jax.config import run_config
from hourglass_jax.data.batches import sources
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.compiled import trainer as trainer_lib
from hourglass_jax.train.loop.evaluate import evaluate_checkpoint
from hourglass_jax.train.reporting.export import export_params
from tests.helpers import copy_checkpoints, quiet


@pytest.fixture
def params_only(monkeypatch):
  """Makes building an optimizer or a train step, or opening the train split, raise; records what each checkpoint
  restore asked of the state item."""
  def refuse(what):
    def raise_(*args, **kwargs):
      raise AssertionError(f"a params-only reader {what}")
    return raise_

  monkeypatch.setattr(trainer_lib, "make_optimizer", refuse("built an optimizer"))
  monkeypatch.setattr(trainer_lib, "make_train_step", refuse("built a train step"))
  make_source = sources.make_source

  def source(data_cfg, split, *args, **kwargs):
    assert split != "train", "a params-only reader opened the train split"
    return make_source(data_cfg, split, *args, **kwargs)

  monkeypatch.setattr(sources, "make_source", source)
  real_restore, asked = ocp.CheckpointManager.restore, []

  def restore(manager, step, *args, **kwargs):
    state = kwargs["args"].state
    asked.append((state.partial_restore, sorted(state.item)))
    return real_restore(manager, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
  return asked


@pytest.mark.slow
def test_evaluation_and_sampling_read_the_params_alone(trained, params_only, tmp_path):
  cfg = trained[1]
  workdir = copy_checkpoints(trained[0], tmp_path)  # evaluation records its score there: not in the shared run
  result = evaluate_checkpoint(run_config(cfg), workdir, log=quiet)
  assert result["step"] == 4 and np.isfinite(result["bits"])
  sampled = sample(run_config(cfg), workdir, SampleOptions(prompt=b"ab", num_samples=2, max_new_tokens=4), log=quiet)
  assert sampled["step"] == 4 and sampled["tokens"].shape == (2, 4)
  export = export_params(workdir, tmp_path / "params_only_export", log=quiet)
  assert export["step"] == 4
  assert params_only == [(True, ["params"])] * 3  # each read only the params subtree


@pytest.mark.slow
def test_params_are_verified_like_the_whole_state(trained, tmp_path):
  """Step 4's records say its head bias was saved otherwise: evaluation skips to step 2 saying why, export (which
  reads the step it is given) refuses, naming the array."""
  workdir, cfg, *_ = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  data_file = copy / "checkpoints" / "4" / "data" / "metadata"
  data = json.loads(data_file.read_text())
  data["record"]["fingerprints"]["params/head/bias"] = "00000000"
  data_file.write_text(json.dumps(data))
  metadata_file = copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA"  # its copy too: the two records agree
  metadata = json.loads(metadata_file.read_text())
  metadata["custom_metadata"]["fingerprints"]["params/head/bias"] = "00000000"
  metadata_file.write_text(json.dumps(metadata))
  messages = []
  assert evaluate_checkpoint(run_config(cfg), copy, log=messages.append)["step"] == 2
  assert any("checkpoint step 4" in m and "fails its integrity check: 1 of its arrays differ" in m
             and "params/head/bias" in m and "skipping and falling back to step 2" in m for m in messages), messages
  assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["2", "4"]  # read-only: nothing moved
  with pytest.raises(TrainError, match=r"checkpoint step 4 .* fails its integrity check: 1 of its arrays differ .*"
                                       r"params/head/bias.*pass another step \(it holds steps 2, 4\)"):
    export_params(copy, tmp_path / "out", log=quiet)
  assert export_params(copy, tmp_path / "out", step=2, log=quiet)["step"] == 2
