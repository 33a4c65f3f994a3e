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
