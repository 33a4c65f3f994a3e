"""Hostile exports (issue 45): exports are written atomically, never replace another model's export without
overwrite, carry a checksum of every array that load_params verifies, and every load_params error names the file
and the fix. Issue 55: a downgraded card cannot switch the checksums off, a keyword cannot change the function, a
full disk names the folder, and Ctrl-C cannot split an export. Issue 64: an export replaces its folder whole (a kill
never leaves new weights beside an old card), never through a planted link, the file-size limit is a full disk
naming the folder and the fix, and a card is checked field by field, naming the card and the field."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax import weights
from hourglass_jax.model import build_model
from hourglass_jax.model.decode import unbox_params
from hourglass_jax.runtime import files
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


@pytest.mark.parametrize("field, value, message", [
    ("format_version", True, r"format_version=True must be an integer, 1 to 2 \(this hourglass_jax reads up to 2\)"),
    ("format_version", "2", r"format_version='2' must be an integer, 1 to 2"),
    ("format_version", 2.0, r"format_version=2.0 must be an integer, 1 to 2"),
    ("format_version", 3, r"is format_version 3, newer than this hourglass_jax reads \(2\); upgrade"),
    ("seq_len", 10**12, r"the card's seq_len=1000000000000 must be an integer >= 1 and <= 16,777,216 \(or null\)"),
    ("seq_len", 8.0, r"the card's seq_len=8.0 must be an integer"),
    ("step", "3", r"the card's step='3' must be an integer >= 0"),
    ("num_params", -1, r"the card's num_params=-1 must be an integer >= 0"),
    ("weights_dtype", 32, r"the card's weights_dtype=32 must be a string"),
    ("checksums", ["abc"], r"the card's checksums must map array names to SHA-256 strings"),
    ("format", "gguf", r"the card's format='gguf' is not 'hourglass_jax'"),
    ("model", dict(dropout=2.0), r"the card's model section is not a valid model \(model.dropout=2.0 must be in"),
])
def test_each_card_field_is_checked_naming_the_card_and_the_field(exported, tmp_path, field, value, message):
  """Issue 64: a card field of the wrong type or out of range (format_version true or "2", seq_len 10**12, which
  ran out of memory building the model) is refused before anything is built, naming the card and the field."""
  folder = _copy(exported, tmp_path)
  card = json.loads((folder / "config.json").read_text())
  card[field] = dict(card["model"], **value) if field == "model" else value
  (folder / "config.json").write_text(json.dumps(card))
  with pytest.raises(ValueError, match=rf"^{folder / 'config.json'}:? .*{message}") as error:
    weights.load_params(folder)
  assert "\n" not in str(error.value)


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
  real = files._write_all

  def full_disk(fd, data):
    real(fd, data[:100])  # a partial write, then the error
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(files, "_write_all", full_disk)
  with pytest.raises(OSError, match="no space left"):
    weights.save_params(other, cfg, folder, overwrite=True)
  monkeypatch.undo()
  assert {name: (folder / name).read_bytes() for name in before} == before
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]  # no temporary
  assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]  # nor a new folder beside it
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


@pytest.mark.parametrize("into, code, cause, fix", [
    ("new folder", 28, r"no space left on device", r"Free disk space \(or pass another --output folder\)"),
    ("overwrite", 28, r"no space left on device", r"Free disk space \(or pass another --output folder\)"),
    ("overwrite", 27, r"file too large: this process's file-size limit, ulimit -f, was reached",
     r"Raise the file-size limit \(ulimit -f unlimited, or ask your administrator\)"),
], ids=["new folder", "overwrite", "file-size limit"])
def test_a_full_disk_names_the_output_folder_and_the_fix(exported, tmp_path, monkeypatch, into, code, cause, fix):
  """Issue 55: a full disk while exporting, into a new folder or over another export, in one line naming both.
  Issue 64: the file-size limit (EFBIG, `ulimit -f`) is met the same way, with its own fix."""
  _, cfg, params, _, other = exported
  folder = _copy(exported, tmp_path) if into == "overwrite" else tmp_path / "new"

  def full_disk(fd, data):
    raise OSError(code, "No space left on device" if code == 28 else "File too large")

  monkeypatch.setattr(files, "_write_all", full_disk)
  with pytest.raises(OSError, match=rf"^disk full: writing the export to {folder} failed \({cause}; the export is "
                                    rf"[0-9.]+ MiB\); nothing of it was kept .*{fix}, then rerun\.$"):
    weights.save_params(other, cfg, folder, overwrite=True)


def test_a_ctrl_c_while_the_export_takes_its_folders_place_is_held_until_done(exported, tmp_path, monkeypatch):
  """Issue 55: Ctrl-C while an --overwrite export replaced its files left new weights beside the old card; the
  interrupt now waits until the new folder has taken the old one's place and the old one is gone."""
  import os
  import signal

  folder = _copy(exported, tmp_path)
  _, cfg, _, _, other = exported
  real_exchange = files._exchange

  def exchange_then_ctrl_c(a, b):
    result = real_exchange(a, b)
    os.kill(os.getpid(), signal.SIGINT)
    return result

  monkeypatch.setattr(files, "_exchange", exchange_then_ctrl_c)
  with pytest.raises(KeyboardInterrupt):
    weights.save_params(other, cfg, folder, overwrite=True)
  monkeypatch.undo()
  _, loaded = weights.load_params(folder)  # the new export, whole
  jax.tree.map(np.testing.assert_array_equal, loaded, other)
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchanged", "moved aside"])
def test_an_export_replaces_its_folder_whole_and_clears_a_killed_ones_leftovers(exported, tmp_path, monkeypatch,
                                                                                exchange):
  """Issue 64: the files are written into a new folder beside the export, which then takes its place in one rename
  (or, where the file system cannot exchange two folders, after moving the old one aside): a kill at any point
  leaves the old export or the new one, whole. A killed export's folder (and an older version's stray temporaries)
  are removed by the next export; a folder holding other files than an export's is refused, not replaced."""
  folder = _copy(exported, tmp_path)
  _, cfg, params, _, other = exported
  (tmp_path / ".copy.0123abcd.tmp").mkdir()  # a killed export's new folder
  (tmp_path / ".copy.0123abcd.tmp" / "model.safetensors").write_bytes(b"partial")
  (folder / ".config.json.0123abcd.tmp").write_text("{}")  # an older version's stray temporary
  if not exchange:
    monkeypatch.setattr(files, "_exchange", lambda a, b: False)
  weights.save_params(other, cfg, folder, overwrite=True)
  assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]
  jax.tree.map(np.testing.assert_array_equal, weights.load_params(folder)[1], other)
  (folder / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=rf"{folder} holds files that are not an export's \(notes.txt\); .*pass a new "
                                       "or empty folder"):
    weights.save_params(params, cfg, folder, overwrite=True)
  assert (folder / "notes.txt").read_text() == "mine"


def test_an_export_never_writes_through_a_planted_link(exported, tmp_path, monkeypatch):
  """Issue 64: links planted at the export folder's name, and at the name its new folder would take (made
  predictable here), never carry the export elsewhere: the first is refused in one line, the second is skipped."""
  _, cfg, params, _, _ = exported
  victim = tmp_path / "victim"
  victim.mkdir()
  (victim / "config.json").write_text("precious")
  (tmp_path / "link").symlink_to(victim)
  with pytest.raises(files.RefusedPath, match=rf"^{tmp_path / 'link'} is a symbolic link \(to {victim}\), not a "
                                              "folder.*Delete the link and rerun"):
    weights.save_params(params, cfg, tmp_path / "link")
  (tmp_path / ".out.0123abcd.tmp").symlink_to(victim)
  planted, real_token = ["0123abcd", "0123abcd"], files.secrets.token_hex
  monkeypatch.setattr(files.secrets, "token_hex", lambda n: planted.pop() if planted else real_token(n))
  weights.save_params(params, cfg, tmp_path / "out")
  monkeypatch.undo()
  assert sorted(p.name for p in victim.iterdir()) == ["config.json"] and (victim / "config.json").read_text() == \
      "precious"
  jax.tree.map(np.testing.assert_array_equal, weights.load_params(tmp_path / "out")[1], params)
