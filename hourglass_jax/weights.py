"""Parameters as a safetensors file plus a JSON model card, for use outside a training workdir: `save_params` writes
`model.safetensors` (flat '/'-joined keys such as 'body/pre/blocks/attention/query/kernel'), `config.json` (the
model section, what the weights are and each array's SHA-256) and the same card as a Hugging Face Hub `README.md`
(hub_card.py), all atomically; `load_params` builds the model from the card and checks every array's name, shape
and checksum."""

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import traverse_util

from hourglass_jax import __version__, hub_card
from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model.config import function_changes
from hourglass_jax.runtime import files, paths

WEIGHTS_FILE, CARD_FILE = "model.safetensors", "config.json"
FORMAT, FORMAT_VERSION = "hourglass_jax", 2  # 2: the card holds 'checksums', which load_params requires
CARD_KEY = "config"  # the safetensors metadata entry holding the card, so the file alone is enough
DTYPES = ("float32", "bfloat16")


def flatten(params) -> dict[str, np.ndarray]:
  """Nested params -> {'body/.../kernel': array}, values unboxed from their logical-axis metadata."""
  return {key: np.asarray(value) for key, value in traverse_util.flatten_dict(nn.meta.unbox(params), sep="/").items()}


def checksum(array) -> str:
  """SHA-256 of an array's bytes as the file stores them (C order), its dtype and shape."""
  array = np.ascontiguousarray(array)
  digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
  digest.update(array.view(np.uint8).reshape(-1) if array.size else b"")
  return digest.hexdigest()


def save_params(params, model_cfg, output_dir, step: int | None = None, seq_len: int | None = None,
                dtype: str | None = None, overwrite: bool = False, about: dict | None = None) -> dict:
  """Writes `output_dir`/model.safetensors, config.json and README.md (local folder or gs://); returns the card.

  `params` as `model.init` or a checkpoint gives them, `model_cfg` the model section they belong to; `about`: more
  fields of the card (what hourglass-export adds: the training data and scores, license, intended use); `dtype`
  'bfloat16' halves the file (floating arrays only), None keeps them as they are (float32 as trained). The files
  are written into a new folder that then takes `output_dir`'s place at once (`_write_atomically`), so Ctrl-C, a
  kill or a full disk leaves the previous export (or nothing), never a truncated file or new weights beside an old
  card. A folder holding another export (other arrays) is replaced only with `overwrite`; the same export again is
  allowed; a folder holding other files than an export's is refused.
  """
  if dtype is not None and dtype not in DTYPES:
    raise ValueError(f"dtype={dtype!r} is not supported; choose one of {', '.join(DTYPES)} (or None: as saved).")
  flat = flatten(params)
  if dtype is not None:
    flat = {k: v.astype(dtype, copy=False) if jnp.issubdtype(v.dtype, jnp.floating) else v for k, v in flat.items()}
  # Every field of the validated model config, defaults included, so a later default cannot change its meaning.
  model_cfg = model_cfg if isinstance(model_cfg, ModelConfig) else ModelConfig.from_dict(model_cfg)
  card = dict(format=FORMAT, format_version=FORMAT_VERSION, hourglass_jax_version=__version__, step=step,
              seq_len=seq_len, num_params=int(sum(v.size for v in flat.values())),
              weights_dtype=dtype or str(next(iter(flat.values())).dtype), **(about or {}),
              model=dataclasses.asdict(model_cfg),
              checksums={key: checksum(value) for key, value in sorted(flat.items())})
  text = json.dumps(card, indent=2)
  out = paths.as_path(output_dir)
  files.refuse_link(out, "a folder")
  if not overwrite:
    _check_replaceable(out, card)
  # Serialised in memory and written through epath, so a gs:// output works as a local one does. README.md is the
  # same card for the Hugging Face Hub (YAML front matter and prose), rewritten with every export.
  _write_atomically(out, {WEIGHTS_FILE: safetensors.numpy.save(flat, metadata={"format": FORMAT, CARD_KEY: text}),
                          CARD_FILE: (text + "\n").encode(), hub_card.README_FILE: hub_card.readme(card).encode()})
  return card


def _write_atomically(out, contents: dict[str, bytes]) -> None:
  """Writes the export's files into a new folder that then replaces `out` whole (files.atomic_folder): `out` holds
  the previous export or the new one, never a mix. A folder holding other files than an export's (and stray
  temporaries of a killed one) is refused, not replaced. A full disk or the file-size limit raises OSError naming
  the folder and the fix; the previous export stays. (On a bucket, which has no folder renames, the files are
  written one by one, the card last.)"""
  others = _other_files(out, contents)
  if others:
    raise ValueError(f"{out} holds files that are not an export's ({', '.join(others[:3])}); an export replaces its "
                     "folder whole, so pass a new or empty folder (or an earlier export's) as --output.")
  try:
    with files.atomic_folder(out) as staging:
      for name, data in contents.items():
        files.write_bytes(staging / name, data)
  except OSError as error:
    cause = paths.disk_full(error)
    if not cause:
      raise
    size = sum(map(len, contents.values()))
    raise OSError(f"disk full: writing the export to {out} failed ({cause}; the export is {size / 2**20:.1f} MiB); "
                  f"nothing of it was kept (a previous export there is intact). "
                  f"{paths.free_space(cause, 'pass another --output folder')}, then rerun.") from error


def _other_files(out, contents: dict[str, bytes]) -> list[str]:
  """Entries of local folder `out` that an export replacing it would delete and that are no export's."""
  if paths.is_remote(out) or not os.path.isdir(out) or os.path.islink(out):
    return []
  ours = {WEIGHTS_FILE, CARD_FILE, *contents}
  return sorted(name for name in os.listdir(out)
                if name not in ours and not any(files.is_temporary(name, of) for of in ours))


def _check_replaceable(out, card: dict) -> None:
  """Raises ValueError when `out` holds an export other than `card`'s (different arrays or model)."""
  present = [name for name in (WEIGHTS_FILE, CARD_FILE) if (out / name).exists()]
  if not present:
    return
  try:  # without its card (a kill between the renames of the first export): the weights file's own
    old = json.loads((out / CARD_FILE).read_text()) if CARD_FILE in present else _embedded_card(out / WEIGHTS_FILE)
    same = old.get("checksums") == card["checksums"] and old.get("model") == card["model"]
  except (OSError, ValueError, AttributeError, safetensors.SafetensorError):
    same = False
  if not same:
    raise ValueError(f"{out} already holds {' and '.join(present)} of another export; pass another folder, or "
                     "--overwrite (overwrite=True) to replace it.")


def _embedded_card(weights) -> dict:
  with safetensors.safe_open(os.fspath(weights), framework="np") as f:
    return json.loads((f.metadata() or {}).get(CARD_KEY) or "{}")


def _locate(path) -> tuple[str, str]:
  """(weights file, card file beside it) for a folder or a .safetensors path."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  weights = os.path.join(path, WEIGHTS_FILE) if os.path.isdir(path) else path
  if not os.path.isfile(weights):
    raise FileNotFoundError(f"{weights} does not exist: pass the folder hourglass-export wrote (holding "
                            f"{WEIGHTS_FILE} and {CARD_FILE}) or the .safetensors file itself.")
  return weights, os.path.join(os.path.dirname(weights), CARD_FILE)


_AGAIN = "export it again with hourglass-export (or download it again)"


def read_card(path) -> dict:
  """The model card of exported weights: config.json beside them (which may be edited, e.g. its attention_impl),
  else the copy in the safetensors metadata. Raises ValueError, naming the file, when either is unreadable or
  malformed, or when the two disagree on what the weights compute."""
  return _read_cards(path)[0]


def _read_cards(path) -> tuple[dict, dict | None]:
  """(read_card's card, the card inside the weights file or None)."""
  weights, card_file = _locate(path)
  try:
    embedded = _embedded_card(weights)
    embedded = embedded if isinstance(embedded, dict) and embedded else None  # not ours: config.json rules
  except (safetensors.SafetensorError, OSError, ValueError) as error:
    raise ValueError(f"{weights} is not a readable safetensors file ({_first_line(error)}); it is truncated or "
                     f"damaged: {_AGAIN}.") from None
  if not os.path.isfile(card_file):
    if embedded is None:
      raise ValueError(f"{weights} carries no model card and there is no {card_file}: write the {CARD_FILE} that "
                       "hourglass-export wrote with it beside the file.")
    return _checked_card(embedded, weights), embedded
  try:
    with open(card_file, encoding="utf-8") as f:
      card = json.load(f)
  except (OSError, ValueError) as error:
    raise ValueError(f"{card_file} is not readable JSON ({_first_line(error)}); restore the {CARD_FILE} "
                     f"hourglass-export wrote, delete it (the card inside {WEIGHTS_FILE} is then used), or "
                     f"{_AGAIN}.") from None
  if not isinstance(card, dict) or not isinstance(card.get("model"), dict):
    raise ValueError(f"{card_file} holds no 'model' section; restore the {CARD_FILE} hourglass-export wrote.")
  if embedded is not None and (differ := function_changes(embedded.get("model", {}), card["model"], "file",
                                                          CARD_FILE)):
    raise ValueError(f"{card_file} does not match the model {weights} was exported from ({'; '.join(differ)}); "
                     "its weights would compute a different function. Restore the exported "
                     f"{CARD_FILE} (or delete it: the file's own card is then used).")
  if embedded is not None:  # an edited card can neither switch the check off nor downgrade the format
    card = dict(card, checksums=card.get("checksums") or embedded.get("checksums"))
    versions = [side.get("format_version", 1) for side in (card, embedded)]
    if all(type(version) is int for version in versions):
      card["format_version"] = max(versions)
  return _checked_card(card, card_file), embedded


def _first_line(error) -> str:
  return (str(error).splitlines() or [type(error).__name__])[0][:200]


MAX_SEQ_LEN = 2**24  # a card's seq_len beyond this is no training length this library could have run


def _checked_card(card: dict, where) -> dict:
  """`card` when each field load_params reads has its type and a sane value; else ValueError naming the card, the
  field and the fix. The model section is checked as a ModelConfig is, before any model is built from it."""
  if not isinstance(card, dict) or not isinstance(card.get("model"), dict):
    raise ValueError(f"{where} holds no 'model' section in its card: {_AGAIN}.")
  if card.get("format", FORMAT) != FORMAT:
    raise ValueError(f"{where}: the card's format={card['format']!r} is not {FORMAT!r}; these are not hourglass_jax "
                     "weights.")
  version = card.get("format_version", 1)
  if type(version) is not int or version < 1:  # (a bool is an int to isinstance)
    raise ValueError(f"{where}: the card's format_version={version!r} must be an integer, 1 to {FORMAT_VERSION} "
                     f"(this hourglass_jax reads up to {FORMAT_VERSION}); restore the card's field or {_AGAIN}.")
  if version > FORMAT_VERSION:
    raise ValueError(f"{where} is format_version {version!r}, newer than this hourglass_jax reads "
                     f"({FORMAT_VERSION}); upgrade hourglass_jax.")
  for field, low, high in (("seq_len", 1, MAX_SEQ_LEN), ("step", 0, 2**31 - 1), ("num_params", 0, None)):
    value = card.get(field)
    if value is not None and (type(value) is not int or value < low or (high is not None and value > high)):
      bound = f"an integer >= {low}" + (f" and <= {high:,}" if high is not None else "")
      raise ValueError(f"{where}: the card's {field}={value!r} must be {bound} (or null); restore the card's field "
                       f"or {_AGAIN}.")
  for field in ("weights_dtype", "hourglass_jax_version"):
    if card.get(field) is not None and not isinstance(card[field], str):
      raise ValueError(f"{where}: the card's {field}={card[field]!r} must be a string; restore the card's field "
                       f"or {_AGAIN}.")
  checksums = card.get("checksums")
  if checksums is not None and not (isinstance(checksums, dict) and all(
      isinstance(key, str) and isinstance(value, str) for key, value in checksums.items())):
    raise ValueError(f"{where}: the card's checksums must map array names to SHA-256 strings: {_AGAIN}.")
  if version >= 2 and not checksums:
    raise ValueError(f"{where} is format_version {version} but its card has no 'checksums', so its arrays cannot "
                     f"be verified: {_AGAIN}.")
  try:
    ModelConfig.from_dict(card["model"])
  except (ValueError, TypeError) as error:
    raise ValueError(f"{where}: the card's model section is not a valid model ({_first_line(error)}); restore it "
                     f"or {_AGAIN}.") from None
  return card


def abstract_params(model, seq_len: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """{'body/.../kernel': ShapeDtypeStruct} that `model.init` would create (shapes only, nothing computed)."""
  tokens = jax.ShapeDtypeStruct((1, seq_len or model.cfg.pad_multiple), jnp.int32)  # shapes only: nothing allocated
  return traverse_util.flatten_dict(nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]),
                                    sep="/")


def _check_arrays(found: Mapping[str, tuple], expected: Mapping[str, jax.ShapeDtypeStruct], where: str) -> None:
  missing = sorted(expected.keys() - found.keys())
  unexpected = sorted(found.keys() - expected.keys())
  wrong = [f"{k}: file {found[k]}, model {tuple(expected[k].shape)}" for k in sorted(found.keys() & expected.keys())
           if tuple(found[k]) != tuple(expected[k].shape)]
  if not (missing or unexpected or wrong):
    return
  problems = [f"{len(items)} {what} (e.g. {'; '.join(items[:3])})" for what, items in
              (("missing key(s)", missing), ("unexpected key(s)", unexpected), ("shape mismatch(es)", wrong)) if items]
  raise ValueError(f"{where} does not fit the model its card describes: {', '.join(problems)}. Load it with the "
                   f"{CARD_FILE} it was exported with (model overrides may change only settings that keep every "
                   "shape, such as attention_impl or dtype), or export the checkpoint again with hourglass-export.")


class Loaded(NamedTuple):
  """What `load_params` returns: unpacks as `model, params`; `.cfg` is the ModelConfig that `generate` and
  `drafts.Model` take (`read_card` gives the rest of the card)."""
  model: nn.Module
  params: dict

  @property
  def cfg(self) -> ModelConfig:
    return self.model.cfg


def load_params(path, **overrides) -> Loaded:
  """The model and params of exported weights (`Loaded`: `model, params = load_params(path)`, or
  `loaded.params` and `loaded.cfg` for `generate`): `path` is the folder hourglass-export wrote or its
  .safetensors file.

  The model is `build_model` of the card's model section with `overrides` (e.g. attention_impl='xla'); params are
  nested NumPy arrays in the model's own dtypes, checked name by name and shape by shape against what `model.init`
  creates and against the checksums of both cards (format_version 2; a version-1 export has none and loads with a
  warning that it is unverified), ready for `model.apply({'params': params}, tokens_BxL)`. Overrides may not change
  what the weights compute (e.g. the hierarchy's factors): as in config.json, that is refused. Every failure is a
  ValueError (FileNotFoundError for a missing path) naming the file and the fix.
  """
  weights, _ = _locate(path)
  card, embedded = _read_cards(path)
  if differ := function_changes(card["model"], dict(card["model"], **overrides), CARD_FILE, "keyword"):
    raise ValueError(f"load_params({', '.join(f'{k}={v!r}' for k, v in overrides.items())}) changes what the weights "
                     f"of {weights} compute ({'; '.join(differ)}); they were trained as their card says. Drop the "
                     "keyword (overrides may change only settings such as attention_impl or dtype).")
  model = build_model(dict(card["model"], **overrides))
  expected = abstract_params(model, card.get("seq_len"))
  try:
    with safetensors.safe_open(weights, framework="np") as f:
      found = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
      _check_arrays(found, expected, weights)
      stored = {key: f.get_tensor(key) for key in found}
  except (safetensors.SafetensorError, OSError) as error:
    raise ValueError(f"{weights} is not a readable safetensors file ({_first_line(error)}); it is truncated or "
                     f"damaged: {_AGAIN}.") from None
  expected_sums = [sums for sums in (card.get("checksums"), (embedded or {}).get("checksums"))
                   if isinstance(sums, dict) and sums]
  if not expected_sums:
    warnings.warn(f"{weights} is a format_version 1 export: its arrays carry no checksums and are loaded unverified; "
                  "export it again with hourglass-export to have them verified.", stacklevel=2)
  for checksums in expected_sums:
    altered = sorted(key for key, value in stored.items() if checksums.get(key) != checksum(value))
    if altered:
      raise ValueError(f"{weights} fails its checksums: {len(altered)} array(s) differ from what was exported (e.g. "
                       f"{', '.join(altered[:3])}), or the weights and {CARD_FILE} come from different exports; "
                       f"{_AGAIN}.")
  # A bfloat16 export is widened back to the dtypes the model was trained in (float32), as it computes in them.
  flat = {key: value.astype(expected[key].dtype, copy=False) for key, value in stored.items()}
  return Loaded(model, traverse_util.unflatten_dict(flat, sep="/"))
