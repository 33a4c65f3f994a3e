"""A checkpoint is restored as it was saved or not at all: altered bytes in any of its files, an emptied data
position or another function of the same shapes are noticed, never loaded silently."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.checkpointing import integrity
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.evaluate import evaluate_checkpoint
from hourglass_jax.train.loop.loop import train_and_evaluate
from tests.helpers import HOURGLASS, copy_checkpoints, quiet, restore_latest, tiny_config


@pytest.mark.slow
def test_a_flipped_byte_in_any_file_is_noticed_or_harmless(trained, tmp_path):
  """One bit flipped in the middle of each file of the newest checkpoint, in turn: the restore either falls back to
  step 2 saying why, or returns step 4 exactly as saved (the byte did not matter); never altered values."""
  workdir, cfg, trainer, state4, data4 = trained
  files = sorted(p.relative_to(workdir) for p in (workdir / "checkpoints" / "4").rglob("*") if p.is_file())
  outcomes = {}
  for relative in files:
    copy = copy_checkpoints(trained[0], tmp_path / str(len(outcomes)))
    target = copy / relative
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    try:
      (state, data_state, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
    except (TrainError, ValueError) as error:  # refused, naming the checkpoint: loud, and nothing was loaded
      outcomes[str(relative)] = "refused"
      assert "checkpoints" in str(error)
      continue
    if step == 2:
      assert any("checkpoint step 4" in m and "falling back to step 2" in m for m in messages), messages
      outcomes[str(relative)] = "fell back"
    else:
      jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), state4)
      assert data_state == data4
      outcomes[str(relative)] = "harmless"
  # Files of array bytes (some are B-tree nodes that the newest manifest no longer reads) and metadata both count.
  assert any(outcome == "fell back" for name, outcome in outcomes.items() if "/d/" in name), outcomes
  assert outcomes["checkpoints/4/data/metadata"] == "fell back"
  # The record is checked where the data is (format 2): Orbax's metadata file is no longer the only copy.
  assert outcomes["checkpoints/4/_CHECKPOINT_METADATA"] in ("fell back", "harmless")


@pytest.mark.slow
def test_changed_array_values_fail_the_fingerprint_check(trained, tmp_path):
  """Bytes that still decode (here: one optimizer moment rewritten through Orbax itself) are caught by the
  fingerprints recorded at save time, in training and in read-only evaluation alike."""
  workdir, cfg, trainer, state4, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  altered = state4.replace(opt_state=jax.tree.map(lambda x: x + 1 if x.dtype == np.float32 else x, state4.opt_state))
  with jax.set_mesh(trainer.mesh), Checkpoints(copy / "checkpoints", log=quiet) as checkpoints:
    record = checkpoints.manager.metadata(4).custom_metadata
    shutil.rmtree(copy / "checkpoints" / "4")
    checkpoints.manager.reload()
    saved = jax.device_put(altered, trainer.shardings)
    checkpoints.manager.save(4, args=_composite(saved, data4), custom_metadata=record, force=True)
  for read_only in (True, False):
    (_, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints", read_only)
    assert step == 2
    assert any(f"checkpoint step 4 under {copy / 'checkpoints'} fails its integrity check" in m and "opt_state" in m
               and ("skipping" if read_only else "moving it aside") in m for m in messages), messages
  assert (copy / "checkpoints_unreadable").is_dir()


def _composite(state, data_state):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  return ocp.args.Composite(state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data_state))


@pytest.mark.parametrize("position, problem", [({}, "holds no data-iterator position"),
                                               (None, "fails its integrity check")])
@pytest.mark.slow
def test_an_emptied_or_changed_data_position_is_not_a_silent_restart(trained, tmp_path, position, problem):
  workdir, cfg, trainer, _, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  position = position if position is not None else {k: v + 1 for k, v in data4.items()}
  (copy / "checkpoints" / "4" / "data" / "metadata").write_text(json.dumps(position))
  (_, data_state, step), messages = restore_latest(trainer, cfg, copy / "checkpoints")
  assert step == 2 and data_state != position
  assert any(problem in m and "falling back to step 2" in m for m in messages), messages


@pytest.mark.slow
def test_checkpoints_without_fingerprints_restore_only_when_allowed(trained, tmp_path):
  """A checkpoint of the older format (a bare data position, fingerprints only in Orbax's metadata) that records
  none: skipped as unverifiable, or restored with a notice under checkpoint.allow_unverified; format 2 is tested in
  test_hostile_checkpoints.py."""
  workdir, cfg, trainer, state4, data4 = trained
  copy = copy_checkpoints(trained[0], tmp_path)
  (copy / "checkpoints" / "4" / "data" / "metadata").write_text(json.dumps(data4))
  metadata = copy / "checkpoints" / "4" / "_CHECKPOINT_METADATA"
  record = json.loads(metadata.read_text())
  del record["custom_metadata"]["fingerprints"]
  metadata.write_text(json.dumps(record))
  (_, _, step), messages = restore_latest(trainer, cfg, copy / "checkpoints", read_only=True)
  assert step == 2 and any("records no fingerprints" in m and "cannot be verified" in m for m in messages)
  with jax.set_mesh(trainer.mesh), Checkpoints(copy / "checkpoints", log=messages.append) as checkpoints:
    state, _, step = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)), allow_unverified=True)
  assert step == 4 and any("records no fingerprints" in m and "without verifying" in m for m in messages)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), state4)


def test_fingerprints_see_every_bit_and_not_the_mesh():
  values = np.random.RandomState(0).randn(16, 24).astype(np.float32)
  mesh = jax.make_mesh((8,), ("d",))
  by_rows = jax.device_put(values, jax.NamedSharding(mesh, jax.P("d", None)))
  by_columns = jax.device_put(values, jax.NamedSharding(mesh, jax.P(None, "d")))
  tree = dict(a=by_rows, b=by_columns, c=jnp.asarray(values), h=jnp.asarray(values, jnp.bfloat16))
  prints = integrity.array_fingerprints(tree)
  assert prints["a"] == prints["b"] == prints["c"] != prints["h"]
  seen = {prints["a"]}
  for index, bit in [((0, 0), 0), ((5, 7), 13), ((15, 23), 31), ((5, 7), 0), ((7, 5), 13)]:
    flipped = values.copy()
    flipped.view(np.uint32)[index] ^= np.uint32(1 << bit)
    seen.add(integrity.array_fingerprints(dict(a=jnp.asarray(flipped)))["a"])
  assert len(seen) == 6  # each single-bit change gives its own fingerprint
  assert integrity.json_fingerprint({"b": 1, "a": 2}) == integrity.json_fingerprint({"a": 2, "b": 1})


def _zero_hourglass_checkpoint(tmp_path):
  cfg = tiny_config(**HOURGLASS)
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype, device=a.sharding), trainer.abstract)
  with jax.set_mesh(trainer.mesh), Checkpoints(tmp_path / "checkpoints", 0, 2) as checkpoints:
    checkpoints.save(5, state, {"next_index": 5}, config_record(run_config(cfg)), force=True)
  return cfg


@pytest.mark.slow
def test_settings_that_change_the_function_but_no_shape_are_refused_by_train_and_eval(tmp_path):
  cfg = _zero_hourglass_checkpoint(tmp_path)
  cfg.model.hierarchy = "1@1 1@3 1@1"  # another shortening factor: the same parameters
  message = r"model.hierarchy: checkpoint '1@1 1@2 1@1', config '1@1 1@3 1@1'.*allow_settings_change=True"
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(cfg, tmp_path, log=quiet)  # before compiling
  with pytest.raises(ValueError, match=message):
    evaluate_checkpoint(run_config(cfg), tmp_path, log=quiet)
  cfg.checkpoint.allow_settings_change = True  # on purpose: the parameters are loaded into the changed model
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh), Checkpoints(tmp_path / "checkpoints", read_only=True, log=quiet) as checkpoints:
    assert checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)), True)[2] == 5
  assert not (tmp_path / "lock").exists()
