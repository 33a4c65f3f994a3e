"""The one door to TFDS, between the builders and the sources: `prepare` builds a dataset as array_record files
without TensorFlow, and `open_split` opens one split's records by random access (`as_data_source`), building the
offline datasets on first use. Importing this module registers the builders with TFDS."""

import contextlib
import functools
import io
import logging
import os
import sys

import requests
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.download.download_manager import NonMatchingChecksumError

from hourglass_jax.data import catalog
from hourglass_jax.data.io.no_tensorflow import without_tensorflow
from hourglass_jax.runtime import files, paths
# Importing the builders registers them with TFDS under their names.
from hourglass_jax.data.builders import digits, enwik8, text_files  # noqa: F401  pylint: disable=unused-import


_NOT_NEWS = ("Variant folder %s has no",  # every check of a dataset not prepared yet: the caller builds it or says how
             "OpenCV is not installed")  # PIL decodes the images instead, as intended


def _drop_noise(record) -> bool:
  return not str(record.msg).startswith(_NOT_NEWS)


logging.getLogger("absl").addFilter(_drop_noise)


def resolve_data_dir(data_dir: str | None) -> epath.Path:
  """data.data_dir, or TFDS's default ($TFDS_DATA_DIR, else ~/tensorflow_datasets) when empty; a local folder."""
  root = data_dir or os.environ.get("TFDS_DATA_DIR") or tfds.core.constants.DATA_DIR
  paths.check_local_data_dir(root, "data.data_dir" if data_dir else "the TFDS data dir")
  return paths.as_path(root)


def get_builder(name: str, data_dir: str | None, **kwargs) -> tfds.core.DatasetBuilder:
  return _builder(name, resolve_data_dir(data_dir), **kwargs)


def _builder(name: str, root: epath.Path, **kwargs) -> tfds.core.DatasetBuilder:
  return tfds.builder(name, data_dir=os.fspath(root), **kwargs)


@contextlib.contextmanager
def _build_lock(root: epath.Path, name: str):
  """One build of a dataset at a time per data dir (several processes of one host may start together). The lock file
  is opened without truncating it and never through a link (hourglass_jax.runtime.files)."""
  files.make_folder(root)
  with files.held_lock(root / f".{name.replace('/', '_')}.lock"):
    yield


def _remove_stale_builds(builder: tfds.core.DatasetBuilder, log) -> None:
  """Deletes the `incomplete.*` folders of killed builds of this dataset (TFDS removes them only on a clean exit).
  Called under the build lock, so no live build owns one."""
  for folder in sorted(epath.Path(builder.data_path).parent.glob("incomplete.*")):
    if folder.is_dir():
      folder.rmtree()
      log(f"removed {folder}, left by an interrupted build of {builder.name}")


def prepare(name: str, data_dir: str | None = None, manual_dir: str | None = None, *,
            builder_kwargs: dict | None = None, progress: bool = True, log=print,
            new_build: bool = False) -> tfds.core.DatasetBuilder:
  """Builds `name` into `data_dir` as array_record files (a no-op when it is already there) and returns its builder.

  TFDS writes into a temporary `incomplete.*` folder and renames it only when every split is written, so a failed
  or interrupted build never leaves a dataset that loads as complete; a killed build's folder is removed (and
  logged) by the next prepare. One build runs at a time per data dir and dataset; `new_build` (the caller found it
  not prepared): one that another process prepared meanwhile, while this one waited, raises ValueError instead of
  being returned as if built from this call's input. A full disk raises OSError naming the folder and the fix.
  """
  spec = catalog.get(name)
  catalog.check_manual_files(spec, manual_dir)
  return _build(spec, resolve_data_dir(data_dir), manual_dir, builder_kwargs=builder_kwargs, progress=progress,
                log=log, new_build=new_build)


def _build(spec: catalog.DatasetSpec, root: epath.Path, manual_dir: str | None, *, builder_kwargs: dict | None,
           progress: bool, log, new_build: bool) -> tfds.core.DatasetBuilder:
  """`prepare` of a dataset already looked up, into a data dir already resolved."""
  name = spec.name
  kwargs = dict(builder_kwargs or {})
  download_config = None
  if name == "text_files":
    if manual_dir:
      kwargs.setdefault("paths", [manual_dir])
  elif manual_dir:
    download_config = tfds.download.DownloadConfig(manual_dir=os.fspath(paths.as_path(manual_dir)))
    if name == "enwik8":
      kwargs.setdefault("allow_download", False)  # the user said where the file is: do not go online
  with _build_lock(root, name):
    builder = _builder(name, root, file_format="array_record", **kwargs)
    _remove_stale_builds(builder, log)
    if builder.is_prepared() and new_build:
      raise ValueError(f"{name} was prepared at {builder.data_path} by another hourglass-data run while this one "
                       f"waited for it: that folder holds the other run's input"
                       f"{f', not necessarily --manual_dir={manual_dir}' if manual_dir else ''}, and nothing was "
                       f"built here. Use another --data_dir, or delete {builder.data_path} and rerun.")
    if builder.is_prepared():
      return builder
    if name == "text_files" and not kwargs.get("paths"):
      raise ValueError("text_files: no input given; name the text with "
                       "`hourglass-data prepare text_files --manual_dir=FILE_OR_FOLDER`.")
    toggle = tfds.enable_progress_bar if progress else tfds.disable_progress_bar
    toggle()
    try:
      with without_tensorflow(builder):
        builder.download_and_prepare(download_config=download_config)
    except NonMatchingChecksumError as error:  # a damaged or altered archive: one line, not TFDS's traceback
      first = str(error).splitlines()[0].rstrip(":")
      raise ValueError(f"{name}: {first}: a truncated, damaged or wrong file. Delete it, download it again (or put "
                       f"the original in a folder passed as --manual_dir; {spec.needs}), and rerun.") from None
    except (tfds.core.download.DownloadError, requests.RequestException) as error:
      needed = " and ".join(f for f, _ in spec.manual_files) or "the source files"
      raise FileNotFoundError(f"{name}: download failed ({error}). Put {needed} in a folder and pass "
                              f"--manual_dir=FOLDER ({spec.needs}).") from error
    except Exception as error:  # TFDS and array_record report a full disk as RuntimeError, among others
      cause = paths.disk_full(error)
      if not cause:
        raise
      raise OSError(f"disk full: building {name} under {root} failed ({cause}); the partial build is not kept. "
                    f"{paths.free_space(cause, 'pass another --data_dir')}, then rerun.") from None
    finally:
      tfds.enable_progress_bar()
  return builder


def _split_name(builder, split: str) -> str:
  available = list(builder.info.splits.keys())
  resolved = catalog.SPLIT_ALIASES.get(split, split)
  if available and resolved not in available:  # (no split list: TFDS's mock data in tests)
    raise ValueError(f"{builder.name} has no {split!r} split; it has {', '.join(available)} (set data.eval_split).")
  return resolved


@functools.lru_cache(maxsize=16)
def open_split(spec: catalog.DatasetSpec, split: str, data_dir: str = ""):
  """Random-access records of one split of the TFDS dataset `spec` (an ArrayRecordDataSource). Offline datasets
  are built on first use; the others must have been prepared."""
  name, root = spec.name, resolve_data_dir(data_dir)
  builder = _builder(name, root)
  if not builder.is_prepared():
    if not spec.automatic:
      raise FileNotFoundError(
          f"data.name={name!r} is not prepared under {root} (data.data_dir). Prepare it first: `hourglass-data "
          f"prepare {name} --data_dir={root}` (needs {spec.needs}).")
    print(f"building {name} into {root} (first use; offline, once per data dir)")
    stdout = sys.stdout
    with contextlib.redirect_stdout(io.StringIO()):  # TFDS's "Downloading and preparing" lines: nothing downloads
      builder = _build(spec, root, None, builder_kwargs=None, progress=False, new_build=False,
                       log=lambda line: print(line, file=stdout))
  split = _split_name(builder, split)
  try:
    return builder.as_data_source(split=split)
  except NotImplementedError as error:  # TFDS's answer for a TFRecord-format dataset
    raise ValueError(f"{name} under {root} cannot be read by random access ({error}); it was probably prepared as "
                     f"TFRecord: prepare it again as array_record with `hourglass-data prepare {name} "
                     f"--data_dir=NEW_DIR`.") from error
