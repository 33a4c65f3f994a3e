"""One writer per workdir: WORKDIR/lock names the host and pid of the hourglass-train run that holds it, so a
second run on the same workdir is refused instead of silently overwriting the first one's checkpoints.

Process 0 of a run takes the lock and rewrites its heartbeat every HEARTBEAT_SECONDS while it holds it. A lock is
stale, and is taken over with a message, when its process is dead on this host, when it belongs to this SLURM job
(a requeued job), or when its heartbeat is older than STALE_SECONDS (its host died). Readers (hourglass-eval,
hourglass-sample) take no lock. On a gs:// workdir the check and the write are two requests, not one atomic
create: two runs started within the same second could both pass.
"""

import json
import os
import socket
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from hourglass_jax.runtime import files, paths
from hourglass_jax.runtime.paths import is_disk_full
from hourglass_jax.train.checks import DiskFullError, TrainError

HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 600.0


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # someone else's live process
  return True


def _stale_reason(holder: dict, now: float) -> str | None:
  """Why the lock described by `holder` no longer protects a live run, or None if it may."""
  if holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1))):
    return f"its process {holder.get('pid')} on this host is no longer running"
  job = os.environ.get("SLURM_JOB_ID")
  if job and holder.get("slurm_job") == job:
    return f"it belongs to this SLURM job ({job}), requeued"
  age = now - float(holder.get("heartbeat", 0.0))
  if age > STALE_SECONDS:
    return f"its last heartbeat was {age / 60:.0f} minutes ago"
  return None


class WorkdirLock:
  """Context manager held by a training run: takes WORKDIR/lock (process 0) or raises TrainError on every process
  naming the run that holds it."""

  def __init__(self, workdir, log=print):
    self.path, self.log = paths.as_path(workdir) / "lock", log
    self._stop, self._thread, self._record, self._disk_full = threading.Event(), None, None, False

  def __enter__(self):
    error = self._acquire() if jax.process_index() == 0 else None
    if multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
      raise (DiskFullError if self._disk_full else TrainError)(
          error or f"process 0 could not lock the workdir {self.path.parent}; see its log.")
    if self._record is not None:
      self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    if self._record is not None and self._is_ours(self._holder()):
      self.path.unlink(missing_ok=True)  # still ours: not taken over meanwhile

  def _holder(self) -> dict:
    """The lock file's record; {} if it is gone, or unreadable (a holder killed while writing it)."""
    try:
      return json.loads(self.path.read_text())
    except (FileNotFoundError, ValueError):
      return {}

  def _acquire(self, tries: int = 3) -> str | None:
    """Takes the lock; returns the refusal message instead if a live run holds it."""
    now = time.time()
    files.make_folder(self.path.parent)
    if not paths.is_remote(self.path) and os.path.islink(self.path):
      return (f"{self.path} is a symbolic link (to {os.readlink(self.path)}), not a lock this program wrote; delete "
              "the link and rerun.")
    if self.path.exists():
      holder = self._holder()
      reason = _stale_reason(holder, now) if holder else "it is empty or unreadable"
      if reason is None:
        return (f"{self.path.parent} is in use by another hourglass-train run (host {holder.get('host')}, pid "
                f"{holder.get('pid')}, started {time.ctime(holder.get('started', 0))}, alive "
                f"{now - holder.get('heartbeat', now):.0f} s ago); two runs on one workdir overwrite each other's "
                "checkpoints. Use another --workdir, or stop that run first. If that run is gone (its host died), "
                f"delete {self.path} and rerun.")
      self.log(f"taking over the stale lock {self.path} (host {holder.get('host')}, pid {holder.get('pid')}): "
               f"{reason}.")
      self.path.unlink(missing_ok=True)
    self._record = dict(host=socket.gethostname(), pid=os.getpid(), started=now,
                        slurm_job=os.environ.get("SLURM_JOB_ID"))
    try:
      self._write(exclusive=True)
    except FileExistsError:  # another run took it between the check and the create
      self._record = None
      if tries <= 1:
        return (f"{self.path} keeps appearing while this run takes it (another run starting at the same time?); "
                "check that no other hourglass-train uses this workdir, then rerun.")
      return self._acquire(tries - 1)
    except OSError as error:
      self._record, self._disk_full = None, is_disk_full(error)
      return (f"cannot write the lock file {self.path} ({error.strerror or error}); free disk space or fix the "
              "folder's permissions, or pass another --workdir.")
    return None

  def _write(self, exclusive: bool = False) -> None:
    """The record with a new heartbeat: created exclusively (a lock), or replacing the lock whole (a heartbeat),
    so a reader never sees a half-written record; never through a link (hourglass_jax.runtime.files)."""
    text = json.dumps(self._record | {"heartbeat": time.time()})
    if exclusive:
      files.create_exclusive(self.path, text)
    else:
      files.write_text(self.path, text)

  def _is_ours(self, holder: dict) -> bool:
    return all(holder.get(k) == self._record[k] for k in ("host", "pid", "started"))

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS) and self.refresh():
      pass

  def refresh(self) -> bool:
    """One heartbeat: rewrites the record's time if the lock is still ours; False once another run holds it."""
    try:
      holder = self._holder()
      if not holder:
        return True  # gone or being rewritten (taken over, or deleted by hand): never write over that
      if not self._is_ours(holder):
        self.log(f"warning: the lock {self.path} was taken over by host {holder.get('host')}, pid "
                 f"{holder.get('pid')}; another run now writes this workdir. Stop one of the two runs.")
        return False
      self._write()
    except OSError as error:  # a full disk or a network blip must not kill the run; the next beat retries
      self.log(f"could not refresh {self.path}: {error}")
    return True
