"""Checkpoints of the per-block layout (before scanned stacks) are refused with the fix, and hourglass-convert
turns them into the scanned layout with every array, the step and the data position kept."""

import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hourglass_jax.train.checkpoint import array_shapes
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.convert import has_per_block_layout, stack_blocks, unstack_blocks
from hourglass_jax.train.loop import train_and_evaluate
from tests.helpers import quiet, run, tiny_config


def test_stack_and_unstack_blocks_are_inverse_and_leave_other_entries():
  rng = np.random.default_rng(0)
  old = {"pre": {f"block_{i}": {"w": rng.normal(size=(2, 3)), "b": rng.normal(size=3)} for i in range(3)}
         | {"final_norm": {"scale": np.ones(3)}}, "opt": [{"block_0": {"w": np.zeros(2)}}, 5]}
  new = stack_blocks(old)
  assert sorted(new["pre"]) == ["blocks", "final_norm"] and new["pre"]["blocks"]["w"].shape == (3, 2, 3)
  np.testing.assert_array_equal(new["pre"]["blocks"]["w"][1], old["pre"]["block_1"]["w"])
  assert new["opt"][0]["blocks"]["w"].shape == (1, 2) and new["opt"][1] == 5
  back = unstack_blocks(new)
  jax.tree.map(np.testing.assert_array_equal, back, old)
  assert has_per_block_layout(["params/body/pre/block_0/mlp/wi/kernel"])
  assert not has_per_block_layout(["params/body/pre/blocks/mlp/wi/kernel"])


def _handlers():
  return dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler())


def _rewrite_in_old_layout(directory, step):
  """Replaces checkpoint `step` with the same arrays in the per-block layout hourglass_jax 0.1 wrote."""
  with ocp.CheckpointManager(directory, item_handlers=_handlers()) as manager:
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                             data=ocp.args.JsonRestore()))
    metadata = manager.metadata(step).custom_metadata
  shutil.rmtree(directory)
  state = jax.tree.map(np.asarray, dict(restored.state))
  with ocp.CheckpointManager(directory, item_handlers=_handlers()) as manager:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(unstack_blocks(state)),
                                               data=ocp.args.JsonSave(restored.data)), custom_metadata=metadata)
  return state


@pytest.mark.slow
def test_old_layout_is_refused_then_converted_and_resumes(tmp_path):
  cfg = tiny_config(steps=2, model=dict(hierarchy="2@1"))
  train_and_evaluate(cfg, tmp_path, log=quiet)
  state = _rewrite_in_old_layout(tmp_path / "checkpoints", 2)
  assert has_per_block_layout(saved_names(tmp_path / "checkpoints", 2))

  cfg.train.steps = 3
  with pytest.raises(TrainError, match=r"per-block parameter layout.*hourglass-convert --workdir="):
    train_and_evaluate(cfg, tmp_path, log=quiet)

  result = run([sys.executable, "-c", "from hourglass_jax.cli.main import convert_entry; convert_entry()",
                f"--workdir={tmp_path}"])
  assert result.returncode == 0, result.stderr
  assert "1 checkpoint(s) converted" in result.stdout
  assert (tmp_path / "checkpoints_per_block" / "2").is_dir()
  assert not has_per_block_layout(saved_names(tmp_path / "checkpoints", 2))
  with ocp.CheckpointManager(tmp_path / "checkpoints", item_handlers=_handlers()) as manager:
    converted = manager.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                           data=ocp.args.JsonRestore()))
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, dict(converted.state)), state)

  summary = train_and_evaluate(cfg, tmp_path, log=quiet)
  assert summary["start_step"] == 2 and summary["step"] == 3


def saved_names(directory, step) -> list[str]:
  with ocp.CheckpointManager(directory, item_handlers=_handlers()) as manager:
    return list(array_shapes(manager.item_metadata(step)["state"].tree))


def test_convert_names_a_wrong_workdir(tmp_path):
  result = run([sys.executable, "-c", "from hourglass_jax.cli.main import convert_entry; convert_entry()",
                f"--workdir={tmp_path / 'missing'}"])
  assert result.returncode != 0 and "does not exist" in result.stderr and "Traceback" not in result.stderr
