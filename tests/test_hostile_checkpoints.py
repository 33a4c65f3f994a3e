"""Checkpoint integrity that one deletion cannot switch off (issue 45, case 1): format 2 keeps the fingerprints and
settings beside the data position, so deleting Orbax's _CHECKPOINT_METADATA neither loads altered arrays nor
skips the settings check; a format-2 checkpoint whose record is gone is treated as unreadable unless
checkpoint.allow_unverified. Issue 55: so is one rewritten in the older format without fingerprints, and one
whose two records disagree; the intact earlier step is used."""

import json
import shutil

import jax
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.train.checkpointing.checkpoint import FORMAT_KEY, Checkpoints, config_record
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.reporting.export import export_params
from tests.helpers import copy_checkpoints, quiet, restore_latest


def _flip_array_bytes(checkpoint):
  """Flips bytes in every array-data file of a checkpoint's state (what a disk or a hand can do)."""
  for path in (checkpoint / "state").rglob("*"):
    if path.is_file() and "/d/" in str(path):
      data = bytearray(path.read_bytes())
      data[len(data) // 2] ^= 0x10
      path.write_bytes(bytes(data))


def test_the_record_lives_beside_the_data(trained):
  data = json.loads((trained[0] / "checkpoints" / "4" / "data" / "metadata").read_text())
  assert data[FORMAT_KEY] == 2 and "fingerprints" in data["record"] and "model" in data["record"]
  assert data["iterator"] == trained[4]


def test_deleting_the_metadata_file_does_not_switch_off_verification(trained, tmp_path):
  workdir, cfg, trainer, state4, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  (copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()
  (state, data_state, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
  assert step == 4 and data_state == data4 and not any("without verifying" in m for m in messages), messages
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), state4)
  _flip_array_bytes(copy / "checkpoints" / "4")
  (_, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
  assert step == 2 and any("checkpoint step 4" in m and "falling back to step 2" in m for m in messages), messages


def test_deleting_the_metadata_file_does_not_skip_the_settings_check(trained, tmp_path):
  workdir, cfg, trainer, _, _ = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  for step in (2, 4):
    (copy / "checkpoints" / str(step) / "_CHECKPOINT_METADATA").unlink()
  changed = cfg.copy_and_resolve_references()
  changed.model.rope_base = 500.0  # same shapes, another function
  with pytest.raises(ValueError, match=r"step 4 was trained with other model settings .*model.rope_base: "
                                       r"checkpoint 10000.0, config 500.0"):
    restore_latest(trainer, changed, copy / "checkpoints")


def test_a_current_checkpoint_without_its_record_is_unreadable_unless_allowed(trained, tmp_path):
  workdir, cfg, trainer, state4, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  (copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()
  data_file = copy / "checkpoints" / "4" / "data" / "metadata"
  data = json.loads(data_file.read_text())
  data["record"] = {}
  data_file.write_text(json.dumps(data))
  backup = shutil.copytree(copy, tmp_path / "backup")
  (state, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints", allow_unverified=True)
  assert step == 4 and any("restored without verifying it (--config.checkpoint.allow_unverified=True)" in m
                           for m in messages), messages
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), state4)
  (_, _, step), messages = restore_latest(trainer, cfg, backup / "checkpoints")
  assert step == 2 and any("cannot be verified" in m and "allow_unverified=True" in m
                           and "falling back to step 2" in m for m in messages), messages
  assert (backup / "checkpoints_unreadable").is_dir()  # moved aside, not deleted


def test_export_reads_the_record_beside_the_data(trained, tmp_path):
  copy = copy_checkpoints(trained[0], tmp_path)
  (copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()
  card = export_params(copy, tmp_path / "out", log=quiet)
  assert card["step"] == 4
  _flip_array_bytes(copy / "checkpoints" / "4")
  with pytest.raises(TrainError, match="checkpoint step 4 .*(fails its integrity check|unreadable)"):
    export_params(copy, tmp_path / "out2", log=quiet)


def test_evaluation_beside_a_pruning_run_reads_the_newer_checkpoint(trained, tmp_path, monkeypatch):
  """Between listing and reading, the training run saves step 6 and prunes step 4 (issue 45, case 18): the reader
  says so and reads step 6, not 'unreadable' then 'no checkpoint'."""
  import orbax.checkpoint as ocp

  workdir, cfg, trainer, state4, _ = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  real_restore, pruned = ocp.CheckpointManager.restore, []

  def restore(manager, step, *args, **kwargs):
    if step == 4 and not pruned:
      pruned.append(step)
      (copy / "checkpoints" / "4").rename(copy / "checkpoints" / "6")
    return real_restore(manager, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
  messages = []
  with jax.set_mesh(trainer.mesh), Checkpoints(copy / "checkpoints", log=messages.append,
                                               read_only=True) as checkpoints:
    state, _, step = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)))
  assert step == 6 and pruned, messages
  assert any("step 4" in m and "was removed while being read" in m and "reading step 6 instead" in m
             for m in messages), messages
  assert not any("unreadable" in m for m in messages), messages
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), state4)


def test_a_checkpoint_downgraded_to_the_older_format_is_not_restored_unverified(trained, tmp_path):
  """Issue 55: step 4 rewritten with altered arrays in format 1's layout (a bare data position) and Orbax's metadata
  deleted: refused as unverifiable (naming why and the override), and the intact earlier step is used."""
  import orbax.checkpoint as ocp

  workdir, cfg, trainer, state4, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  altered = state4.replace(params=jax.tree.map(lambda x: x + 1, state4.params))
  with jax.set_mesh(trainer.mesh), Checkpoints(copy / "checkpoints", log=quiet) as checkpoints:
    shutil.rmtree(copy / "checkpoints" / "4")  # saved again, readable, in the older layout with no record
    checkpoints.manager.reload()
    checkpoints.manager.save(4, args=ocp.args.Composite(
        state=ocp.args.PyTreeSave(jax.device_put(altered, trainer.shardings)), data=ocp.args.JsonSave(data4)),
        force=True)
  (copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA").unlink()
  (_, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
  assert step == 2 and any("step 4" in m and "layout of checkpoint format 1 and Orbax's _CHECKPOINT_METADATA holds "
                           "none" in m and "cannot be verified" in m and "allow_unverified=True" in m
                           and "falling back to step 2" in m for m in messages), messages


def test_two_records_that_disagree_fall_back_to_the_intact_step(trained, tmp_path):
  """Issue 55: the record beside the data altered, Orbax's copy intact: whatever the config says, one message (the
  records disagree) and the intact step 2 is used, or refused for the config's own settings."""
  workdir, cfg, trainer, _, _ = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  data_file = copy / "checkpoints" / "4" / "data" / "metadata"
  data = json.loads(data_file.read_text())
  data["record"]["model"]["rope_base"] = 500.0
  data_file.write_text(json.dumps(data))
  disagree = ("step 4", "holds two records that disagree (data/metadata and _CHECKPOINT_METADATA differ in "
              "model.rope_base)")
  changed = cfg.copy_and_resolve_references()
  changed.model.rope_base = 500.0  # the altered record's settings: step 2 was not trained with them
  messages = []
  with pytest.raises(ValueError, match=r"step 2 was trained with other model settings .*model.rope_base: checkpoint "
                                       r"10000.0, config 500.0"):
    with jax.set_mesh(trainer.mesh), Checkpoints(copy / "checkpoints", log=messages.append,
                                                 read_only=True) as checkpoints:
      checkpoints.restore_latest(trainer.abstract, config_record(run_config(changed)))
  assert any(all(part in m for part in disagree) for m in messages), messages
  (_, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
  assert step == 2 and any(all(part in m for part in disagree) and "falling back to step 2" in m
                           for m in messages), messages
