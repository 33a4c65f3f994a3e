"""Hostile exports (issue 45): exports are written atomically, never replace another model's export without
overwrite, carry a checksum of every array that load_params verifies, and every load_params error names the file
and the fix. Issue 55: a downgraded card cannot switch the checksums off, a keyword cannot change the function, a
full disk names the folder, and Ctrl-C cannot split an export between its renames."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from hourglass_jax import weights
from hourglass_jax.model import build_model
from hourglass_jax.model.decode import unbox_params
from tests.helpers import small_config

AGAIN = "export it again with hourglass-export"


def _params(seed: int):
  cfg = small_config(kind="vanilla", hierarchy="1@1")
  return cfg, unbox_params(build_model(cfg).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """A folder holding the export of one model (seed 0), and the params of another (seed 1)."""
  folder = tmp_path_factory.mktemp("export") / "model"
  cfg, params = _params(0)
  card = weights.save_params(params, cfg, folder, step=3, seq_len=8)
  return folder, cfg, params, card, _params(1)[1]


def _copy(exported, tmp_path):
  return shutil.copytree(exported[0], tmp_path / "copy")


def test_the_card_holds_a_checksum_of_every_array(exported):
  folder, _, params, card, _ = exported
  assert card["format_version"] == 2 and set(card["checksums"]) == set(weights.flatten(params))
  _, loaded = weights.load_params(folder)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_flipped_bytes_in_an_array_are_caught(exported, tmp_path):
  folder = _copy(exported, tmp_path)
  data = bytearray((folder / "model.safetensors").read_bytes())
  header = 8 + int.from_bytes(data[:8], "little")
  start = header + json.loads(data[8:header])["embed/embedding"]["data_offsets"][0]
  data[start + 40:start + 44] = bytes(255 - b for b in data[start + 40:start + 44])
  (folder / "model.safetensors").write_bytes(bytes(data))
  with pytest.raises(ValueError, match=r"model.safetensors fails its checksums: 1 array\(s\) .*embed/embedding.*"
                                       + AGAIN):
    weights.load_params(folder)


def test_checksums_cannot_be_switched_off_by_editing_the_card(exported, tmp_path):
  folder = _copy(exported, tmp_path)
  card = json.loads((folder / "config.json").read_text())
  del card["checksums"]
  (folder / "config.json").write_text(json.dumps(card))
  weights.load_params(folder)  # the file's own card supplies them
  data = bytearray((folder / "model.safetensors").read_bytes())
  data[-4:] = b"\0\0\0\1"
  (folder / "model.safetensors").write_bytes(bytes(data))
  with pytest.raises(ValueError, match="fails its checksums"):
    weights.load_params(folder)


@pytest.mark.parametrize("damage, message", [
    (lambda data: data[:len(data) // 2], "not a readable safetensors file"),
    (lambda data: b"", "not a readable safetensors file"),
    (lambda data: b"\xff" * 64, "not a readable safetensors file"),
], ids=["truncated", "empty", "malformed"])
def test_a_damaged_weights_file_names_itself_and_the_fix(exported, tmp_path, damage, message):
  folder = _copy(exported, tmp_path)
  (folder / "model.safetensors").write_bytes(damage((folder / "model.safetensors").read_bytes()))
  with pytest.raises(ValueError, match=rf"{folder / 'model.safetensors'} is {message} .*{AGAIN}"):
    weights.load_params(folder)


@pytest.mark.parametrize("card, message", [
    ("{not json", "is not readable JSON"),
    ('{"model": {"kind": "vanilla"}, "seq_len": -5}', r"seq_len=-5 must be an integer >= 1"),
    ('{"model": {}, "format_version": 2}', None),
])
def test_a_broken_card_names_itself_and_the_fix(exported, tmp_path, card, message):
  folder = _copy(exported, tmp_path)
  if message is None:  # no checksums in either card of a format-2 export
    _, cfg, params, _, _ = exported
    weights.save_params(params, cfg, folder / "bare")
    flat = weights.flatten(params)
    import safetensors.numpy
    safetensors.numpy.save_file(flat, folder / "bare" / "model.safetensors")
    good = json.loads((folder / "config.json").read_text())
    del good["checksums"]
    (folder / "bare" / "config.json").write_text(json.dumps(good))
    with pytest.raises(ValueError, match="format_version 2 but its card has no 'checksums'"):
      weights.load_params(folder / "bare")
    return
  (folder / "config.json").write_text(card)
  with pytest.raises(ValueError, match=rf"{folder / 'config.json'}.*{message}"):
    weights.load_params(folder)


def test_another_models_export_is_not_replaced_without_overwrite(exported, tmp_path):
  folder = _copy(exported, tmp_path)
  _, cfg, params, card, other = exported
  weights.save_params(params, cfg, folder, step=3, seq_len=8)  # the same export again is fine
  before = (folder / "model.safetensors").read_bytes()
  with pytest.raises(ValueError, match=r"already holds model.safetensors and config.json of another export.*"
                                       "--overwrite"):
    weights.save_params(other, cfg, folder)
  assert (folder / "model.safetensors").read_bytes() == before
  weights.save_params(other, cfg, folder, overwrite=True)
  _, loaded = weights.load_params(folder)
  jax.tree.map(np.testing.assert_array_equal, loaded, other)


def test_a_failed_write_keeps_the_previous_export(exported, tmp_path, monkeypatch):
  folder = _copy(exported, tmp_path)
  _, cfg, params, _, other = exported
  before = {name: (folder / name).read_bytes() for name in ("model.safetensors", "config.json", "README.md")}
  real = epath.Path.write_bytes

  def full_disk(path, data):
    real(path, data[:100])  # a partial write, then the error
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(epath.Path, "write_bytes", full_disk)
  with pytest.raises(OSError, match="No space left"):
    weights.save_params(other, cfg, folder, overwrite=True)
  monkeypatch.undo()
  assert {name: (folder / name).read_bytes() for name in before} == before
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]  # no temporary
  _, loaded = weights.load_params(folder)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_new_weights_beside_an_old_card_are_refused(exported, tmp_path):
  """A kill between the two renames leaves the new weights beside the previous card."""
  folder = _copy(exported, tmp_path)
  _, cfg, _, _, other = exported
  weights.save_params(other, cfg, tmp_path / "new")
  shutil.copy(tmp_path / "new" / "model.safetensors", folder / "model.safetensors")
  with pytest.raises(ValueError, match="fails its checksums.*different exports"):
    weights.load_params(folder)


def _flip_a_byte(folder):
  data = bytearray((folder / "model.safetensors").read_bytes())
  data[-4:] = bytes(255 - b for b in data[-4:])
  (folder / "model.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize("checksums", [{}, None], ids=["empty", "null"])
def test_a_card_downgraded_to_format_1_does_not_switch_the_checksums_off(exported, tmp_path, checksums):
  """Issue 55: config.json edited to format_version 1 without checksums; the file's own card still holds them."""
  folder = _copy(exported, tmp_path)
  card = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps(dict(card, format_version=1, checksums=checksums)))
  weights.load_params(folder)  # intact: loads
  _flip_a_byte(folder)
  with pytest.raises(ValueError, match="fails its checksums"):
    weights.load_params(folder)


def test_an_export_without_checksums_anywhere_loads_named_unverified(exported, tmp_path):
  """A format-1 export (no checksums in either card) loads, with a warning that says it is unverified."""
  import safetensors.numpy

  _, _, params, card, _ = exported
  folder = tmp_path / "v1"
  folder.mkdir()
  old = {key: value for key, value in card.items() if key != "checksums"} | {"format_version": 1}
  safetensors.numpy.save_file(weights.flatten(params), folder / "model.safetensors",
                              metadata={"format": "hourglass_jax", "config": json.dumps(old)})
  (folder / "config.json").write_text(json.dumps(old))
  with pytest.warns(UserWarning, match="format_version 1 export: its arrays carry no checksums and are loaded "
                                       "unverified"):
    weights.load_params(folder)


def test_a_keyword_that_changes_the_function_is_refused_as_in_the_card(tmp_path):
  """load_params(path, hierarchy=...) with other factors keeps every shape but not the function: refused."""
  cfg = small_config(hierarchy="1@1 1@3 1@1", shorten="avg", upsample="repeat")
  params = unbox_params(jax.jit(build_model(cfg).init)(jax.random.key(0), jnp.zeros((1, 3), jnp.int32)))
  weights.save_params(params, cfg, tmp_path)
  with pytest.raises(ValueError, match=r"load_params\(hierarchy='1@1 1@2 1@1'\) changes what the weights of .* "
                                       r"compute \(model.hierarchy: config.json '1@1 1@3 1@1', keyword '1@1 1@2 "
                                       r"1@1'\).*Drop the keyword"):
    weights.load_params(tmp_path, hierarchy="1@1 1@2 1@1")
  model, _ = weights.load_params(tmp_path, attention_impl="xla")  # a setting that keeps the function
  assert model.cfg.attention_impl == "xla"


@pytest.mark.parametrize("into", ["new folder", "overwrite"])
def test_a_full_disk_names_the_output_folder_and_the_fix(exported, tmp_path, monkeypatch, into):
  """Issue 55: a full disk while exporting, into a new folder or over another export, in one line naming both."""
  _, cfg, params, _, other = exported
  folder = _copy(exported, tmp_path) if into == "overwrite" else tmp_path / "new"

  def full_disk(path, data):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(epath.Path, "write_bytes", full_disk)
  with pytest.raises(OSError, match=rf"^disk full: writing the export to {folder} failed \(No space left on device\); "
                                    r"nothing of it was kept .*Free disk space or pass another --output folder, then "
                                    r"rerun\.$"):
    weights.save_params(other, cfg, folder, overwrite=True)


def test_a_ctrl_c_between_the_renames_is_held_until_both_are_done(exported, tmp_path, monkeypatch):
  """Issue 55: Ctrl-C between the two renames of an --overwrite export left new weights beside the old card while
  hourglass-export said "nothing was lost"; the interrupt now waits for the second rename."""
  import os
  import signal

  folder = _copy(exported, tmp_path)
  _, cfg, _, _, other = exported
  path_type = type(epath.Path(folder))
  real_replace = path_type.replace

  def replace_then_ctrl_c(path, target):
    result = real_replace(path, target)
    os.kill(os.getpid(), signal.SIGINT)
    return result

  monkeypatch.setattr(path_type, "replace", replace_then_ctrl_c)
  with pytest.raises(KeyboardInterrupt):
    weights.save_params(other, cfg, folder, overwrite=True)
  monkeypatch.undo()
  _, loaded = weights.load_params(folder)  # the new export, whole
  jax.tree.map(np.testing.assert_array_equal, loaded, other)
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_rerunning_an_export_killed_between_its_renames_repairs_it(exported, tmp_path):
  """After a SIGKILL between the renames (new weights, the old or no card, a stray temporary), the same export again
  replaces the pair and removes the stray; a first export killed there is recognised as the same export."""
  folder = _copy(exported, tmp_path)
  _, cfg, params, _, other = exported
  weights.save_params(other, cfg, tmp_path / "new")
  shutil.copy(tmp_path / "new" / "model.safetensors", folder / "model.safetensors")
  (folder / ".config.json.0123abcd.tmp").write_text("{}")
  weights.save_params(other, cfg, folder, overwrite=True)
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
  jax.tree.map(np.testing.assert_array_equal, weights.load_params(folder)[1], other)
  (folder / "config.json").unlink()  # a first export killed after renaming its weights
  weights.save_params(other, cfg, folder)  # the same export: no --overwrite needed
  jax.tree.map(np.testing.assert_array_equal, weights.load_params(folder)[1], other)
