"""Workdirs and data dirs that may be local folders or bucket URLs (gs://, s3://): etils.epath, as Orbax and TFDS
use. pathlib would collapse 'gs://bucket/run' to 'gs:/bucket/run', a local folder."""

import errno
import importlib.util
import os
import socket
import threading
import urllib.parse
import urllib.request

from etils import epath

# URL scheme -> (module epath needs for it, what to install).
_BACKENDS = {"gs": ("gcsfs", "pip install 'hourglass-jax[gcs]' (or gcsfs google-cloud-storage)"),
             "s3": ("s3fs", "pip install s3fs")}
# URL scheme -> (variable naming another endpoint, as the clients read it; the service's endpoint).
_ENDPOINTS = {"gs": ("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com"),
              "s3": ("AWS_ENDPOINT_URL", "https://s3.amazonaws.com")}
REACH_SECONDS = 10.0


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def as_path(path) -> epath.Path:
  """`path` as an epath.Path: a bucket URL kept as it is, a local path with '~' expanded and made absolute."""
  text = os.fspath(path)
  return epath.Path(text) if is_remote(text) else epath.Path(os.path.abspath(os.path.expanduser(text)))


def check_local_data_dir(path, what: str) -> None:
  """Raises ValueError for a bucket URL: TFDS's array_record files are written and read through local files (the
  array_record reader and writer cannot open gs:// paths), so a data dir must be a local or mounted folder; and
  for a local path that is, or lies under, a file."""
  text = os.fspath(path)
  if text and not is_remote(text):
    folder = os.path.abspath(os.path.expanduser(text))
    above = folder
    while not os.path.exists(above):
      above = os.path.dirname(above)
    if not os.path.isdir(above):
      where = "is a file" if above == folder else f"lies under the file {above}"
      raise ValueError(f"{what}={text} {where}; pass a folder for the datasets (a new one is created).")
  if is_remote(text):
    raise ValueError(f"{what}={text}: datasets are array_record files, which are read and written as local files "
                     "only. Prepare into a local folder and copy it to the bucket (gcloud storage rsync --recursive "
                     "DIR gs://...); to train, copy it back to each host's disk (launch/tpu.sh --data-dir does) or "
                     "mount the bucket with Cloud Storage FUSE (gcsfuse) and pass the mounted folder.")


def check_remote_location(text: str, what: str) -> None:
  """Raises ValueError, before any long work, when the URL `text` has a scheme this install cannot open or its
  service does not answer (the storage clients would retry for minutes)."""
  scheme = text.split("://", 1)[0]
  if scheme not in _BACKENDS:
    raise ValueError(f"{what}={text}: unsupported URL scheme {scheme!r}; use a local folder or gs://bucket/dir.")
  module, install = _BACKENDS[scheme]
  if importlib.util.find_spec(module) is None and importlib.util.find_spec("tensorflow") is None:
    raise ValueError(f"{what}={text}: {scheme}:// paths need the {module} package, which is not installed: "
                     f"{install}.")
  variable, default = _ENDPOINTS[scheme]
  endpoint = os.environ.get(variable) or default
  url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
  proxy = urllib.request.getproxies().get(url.scheme)
  if proxy and not urllib.request.proxy_bypass(url.hostname):
    url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")  # only the proxy must answer
  problem = _unreachable(url.hostname, url.port or (443 if url.scheme == "https" else 80))
  if problem:
    raise ValueError(f"{what}={text}: cannot reach {url.netloc} ({problem}); check the network (or ${variable}) "
                     "and retry, or pass a local folder.")


def _unreachable(host: str, port: int, seconds: float = REACH_SECONDS) -> str | None:
  """None when a TCP connection to host:port opens within `seconds` (name lookup included), else why not."""
  outcome = []

  def connect():
    try:
      socket.create_connection((host, port), timeout=seconds).close()
      outcome.append(None)
    except OSError as error:
      outcome.append(error.strerror or str(error) or type(error).__name__)

  thread = threading.Thread(target=connect, daemon=True)  # a stuck name lookup ignores socket timeouts
  thread.start()
  thread.join(seconds)
  return outcome[0] if outcome else f"no answer in {seconds:.0f} s"


def first_missing(path) -> str | None:
  """The outermost folder of local `path` that does not exist yet (`path` itself, or one above it): what creating
  `path` would add. None when `path` exists or is a URL."""
  if is_remote(path):
    return None
  folder, missing = os.path.abspath(os.path.expanduser(os.fspath(path))), None
  while not os.path.exists(folder):
    folder, missing = os.path.dirname(folder), folder
  return missing


def remove_empty_folders(root) -> None:
  """Removes `root` and the folders under it, deepest first, as far as they hold no file: a run that failed before
  writing anything leaves nothing behind, and a file (a checkpoint, a log) is never touched."""
  if root is None or not os.path.isdir(root):
    return
  for folder, _, _ in sorted(os.walk(root), key=lambda entry: -entry[0].count(os.sep)):
    try:
      os.rmdir(folder)
    except OSError:
      pass


# errno -> (how the OS words it, what it means here): each is met as a full disk is (stop, keep saved work, say so).
_FULL = {errno.ENOSPC: ("No space left on device", "no space left on device"),
         errno.EDQUOT: ("Disk quota exceeded", "disk quota exceeded"),
         errno.EFBIG: ("File too large", "file too large: this process's file-size limit, ulimit -f, was reached")}


def disk_full(error: BaseException | None) -> str | None:
  """What filled up when `error`, or an exception it was raised from or during, is a full disk (ENOSPC), a full
  quota (EDQUOT) or the file-size limit (EFBIG, `ulimit -f`); Orbax and TensorStore wrap these in their own
  errors, naming them in the text. None for any other error."""
  while error is not None:
    if isinstance(error, OSError) and error.errno in _FULL:
      return _FULL[error.errno][1]
    text = str(error)
    for code, (words, cause) in _FULL.items():
      if words in text or f"os_error_code='{code}'" in text:
        return cause
    error = error.__cause__ or error.__context__
  return None


def is_disk_full(error: BaseException | None) -> bool:
  return disk_full(error) is not None


def free_space(cause: str, elsewhere: str) -> str:
  """The fix of a `disk_full` cause, a sentence's start: free space or `elsewhere` (another place to write), or
  for the file-size limit, raise it."""
  if cause == _FULL[errno.EFBIG][1]:
    return "Raise the file-size limit (ulimit -f unlimited, or ask your administrator)"
  return f"Free {'disk space' if cause == _FULL[errno.ENOSPC][1] else 'space within your disk quota'} (or {elsewhere})"
