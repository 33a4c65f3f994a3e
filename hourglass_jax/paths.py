"""Workdirs and data dirs that may be local folders or bucket URLs (gs://, s3://): etils.epath, as Orbax and TFDS
use. pathlib would collapse 'gs://bucket/run' to 'gs:/bucket/run', a local folder."""

import importlib.util
import os

from etils import epath

# URL scheme -> (module epath needs for it, what to install).
_BACKENDS = {"gs": ("gcsfs", "pip install 'hourglass-jax[gcs]' (or gcsfs google-cloud-storage)"),
             "s3": ("s3fs", "pip install s3fs")}


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def as_path(path) -> epath.Path:
  """`path` as an epath.Path: a bucket URL kept as it is, a local path with '~' expanded and made absolute."""
  text = os.fspath(path)
  return epath.Path(text) if is_remote(text) else epath.Path(os.path.abspath(os.path.expanduser(text)))


def check_local_data_dir(path, what: str) -> None:
  """Raises ValueError for a bucket URL: TFDS's array_record files are written and read through local files (the
  array_record reader and writer cannot open gs:// paths), so a data dir must be a local or mounted folder."""
  text = os.fspath(path)
  if is_remote(text):
    raise ValueError(f"{what}={text}: datasets are array_record files, which are read and written as local files "
                     "only. Prepare into a local folder and copy it to the bucket (gcloud storage rsync --recursive "
                     "DIR gs://...); to train, copy it back to each host's disk (launch/tpu.sh --data-dir does) or "
                     "mount the bucket with Cloud Storage FUSE (gcsfuse) and pass the mounted folder.")


def check_writable_location(path, what: str) -> None:
  """Raises ValueError, before any long work, when `path` is a URL this install cannot open."""
  text = os.fspath(path)
  if not is_remote(text):
    return
  scheme = text.split("://", 1)[0]
  if scheme not in _BACKENDS:
    raise ValueError(f"{what}={text}: unsupported URL scheme {scheme!r}; use a local folder or gs://bucket/dir.")
  module, install = _BACKENDS[scheme]
  if importlib.util.find_spec(module) is None and importlib.util.find_spec("tensorflow") is None:
    raise ValueError(f"{what}={text}: {scheme}:// paths need the {module} package, which is not installed: "
                     f"{install}.")
