"""The one way this package writes a file: whole files replaced atomically (written under a new, unpredictable name
created exclusively in the target's folder, never through a link, then renamed over the target), appends and lock
files opened without following a link, folders made without passing through a planted link, and whole folders
replaced at once (an export). A symbolic link planted at any name this package writes can therefore neither
redirect a write nor be overwritten through; where a link stands at a name that must be the real thing (an append,
a lock, a folder the package made) the write is refused with one line naming it (`RefusedPath`).

Local paths and bucket URLs (gs://, s3:// through etils.epath, as paths.py opens them) both work. A bucket has no
links, and an object is written whole or not at all, so there the target is written directly; a bucket has no
appends, no exclusive creates (a lock is checked, then written) and no folder renames (an export's files are
written one by one). tests/test_hostile_faults.py scans the package for writes that bypass this module."""

import contextlib
import ctypes
import errno
import fcntl
import io
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import threading

from etils import epath

from hourglass_jax.runtime import paths

_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # a new file, never one already there, nor a link
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100  # renameat2(2)


class RefusedPath(ValueError):
  """A write that would pass through a symbolic link, or a file standing where a folder belongs (or a folder where
  a file does): the message names the path and the fix."""


def _link_refused(path, what: str = "a file this program writes") -> RefusedPath:
  return RefusedPath(f"{path} is a symbolic link (to {os.readlink(path)}), not {what}; writing there would write "
                     "wherever it points. Delete the link and rerun.")


def refuse_link(path, what: str = "a file this program writes") -> None:
  """Raises RefusedPath when local `path` is a symbolic link (dangling or not)."""
  local = _local(path)
  if local is not None and os.path.islink(local):
    raise _link_refused(local, what)


def _temporary_name(path: str) -> str:
  folder, name = os.path.split(path)
  return os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")


def is_temporary(name: str, of: str) -> bool:
  """Whether folder entry `name` is one of this module's temporary names for target `of` (left by a killed run)."""
  return re.fullmatch(rf"\.{re.escape(of)}\.[0-9a-f]{{8}}\.tmp", name) is not None


def _exclusive_temporary(path: str) -> tuple[int, str]:
  """(fd, name) of a new empty file beside `path`, created exclusively (O_EXCL: never a name already taken, a
  planted link included)."""
  for _ in range(100):
    temporary = _temporary_name(path)
    try:
      return os.open(temporary, os.O_WRONLY | _CREATE, 0o666), temporary
    except FileExistsError:
      continue
    except FileNotFoundError:
      raise FileNotFoundError(errno.ENOENT, "No such folder", os.path.dirname(path)) from None
  raise FileExistsError(errno.EEXIST, "no free temporary name", path)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


def _check_target(path: str) -> None:
  if os.path.isdir(path) and not os.path.islink(path):
    raise RefusedPath(f"{path} is a folder, not a file; move it aside (or pass another path) and rerun.")


def _local(path) -> str | None:
  """`path` as a local absolute path, or None for a bucket URL."""
  return None if paths.is_remote(path) else os.fspath(paths.as_path(path))


def write_bytes(path, data: bytes) -> None:
  """Replaces `path` with `data` atomically: a reader sees the old file or the new one, whole; a failure (a full
  disk, Ctrl-C) leaves the old one and no temporary. A link at `path` is replaced, never written through."""
  local = _local(path)
  if local is None:  # one object write: whole or nothing
    epath.Path(path).write_bytes(data)
    return
  _check_target(local)
  fd, temporary = _exclusive_temporary(local)
  try:
    try:
      _write_all(fd, data)
      os.fsync(fd)
    finally:
      os.close(fd)
    os.replace(temporary, local)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(temporary)
    raise


def write_text(path, text: str) -> None:
  """`write_bytes` of `text` as UTF-8."""
  write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_file(path, mode: str = "wb"):
  """Yields a file object ('wb', or 'w' for UTF-8 text) whose contents replace `path` atomically when the block ends
  without an error (`write_bytes`'s guarantees), for writers that want a stream (PNG, matplotlib)."""
  if mode not in ("wb", "w"):
    raise ValueError(f"atomic_file mode {mode!r}: 'wb' or 'w'.")
  local = _local(path)
  if local is None:  # one object write: whole or nothing
    buffer = io.BytesIO()
    stream = buffer if mode == "wb" else io.TextIOWrapper(buffer, encoding="utf-8", write_through=True)
    yield stream
    if stream is not buffer:
      stream.detach()  # (closing the wrapper would close the buffer)
    epath.Path(path).write_bytes(buffer.getvalue())
    return
  _check_target(local)
  fd, temporary = _exclusive_temporary(local)
  try:
    with os.fdopen(fd, mode, **({} if mode == "wb" else dict(encoding="utf-8"))) as file:
      yield file
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, local)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(temporary)
    raise


def _open_regular(path: str, flags: int, what: str) -> int:
  """fd of `path` opened with `flags` without following a link (O_NOFOLLOW), refusing anything but a regular file
  (a FIFO would block, a device would take the writes)."""
  try:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
  except OSError:
    if os.path.islink(path):
      raise _link_refused(path, what) from None
    _check_target(path)
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
      raise _not_regular(path, what) from None  # a FIFO without a reader (ENXIO)
    raise
  if not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    raise _not_regular(path, what)
  os.set_blocking(fd, True)
  return fd


def _not_regular(path: str, what: str) -> RefusedPath:
  return RefusedPath(f"{path} is not a regular file (a device, FIFO or socket), not {what}; move it aside and rerun.")


def open_append(path, what: str = "a file this program writes"):
  """`path` opened to append UTF-8 text (created if missing), never through a link: a link there, or anything but a
  regular file, raises RefusedPath. Local paths only (a bucket object cannot be appended to)."""
  local = _local(path)
  if local is None:
    raise ValueError(f"{path}: a bucket object cannot be appended to; rewrite it whole (write_text).")
  fd = _open_regular(local, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what)
  return os.fdopen(fd, "a", encoding="utf-8")


def create_exclusive(path, text: str) -> None:
  """Creates `path` holding `text` (a lock file); FileExistsError when anything is there, a link included. A failed
  write (a full disk) leaves no file. On a bucket: checked, then written (two requests, not one atomic create)."""
  local = _local(path)
  if local is None:
    if epath.Path(path).exists():
      raise FileExistsError(errno.EEXIST, "exists", os.fspath(path))
    epath.Path(path).write_text(text)
    return
  fd = os.open(local, os.O_WRONLY | _CREATE, 0o666)
  try:
    _write_all(fd, text.encode("utf-8"))
  except BaseException:
    os.unlink(local)
    raise
  finally:
    os.close(fd)


@contextlib.contextmanager
def held_lock(path):
  """Holds an exclusive flock(2) on `path` for the block: one holder at a time among processes of this host (or of a
  file system with shared locks). The file is created empty if missing and never truncated; a link there raises
  RefusedPath. Local paths only."""
  local = _local(path)
  if local is None:
    raise ValueError(f"{path}: a lock file must be local.")
  fd = _open_regular(local, os.O_RDWR | os.O_CREAT, "a lock file this program made")
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


def make_folder(path, inside=None) -> epath.Path:
  """Creates folder `path` with its missing parents and returns it. RefusedPath when a file stands where one of
  them belongs, or when `path` or a folder between `inside` (a workdir, a data dir) and it is a symbolic link: a
  folder this package names inside a workdir is its own, never a link planted to carry the writes elsewhere (links
  above `inside`, the user's own, are followed)."""
  target = paths.as_path(path)
  local = _local(path)
  if local is None:
    target.mkdir(parents=True, exist_ok=True)
    return target
  root = os.fspath(paths.as_path(inside)) if inside is not None else None
  chain, folder = [], local
  while True:
    chain.append(folder)
    if folder == root or os.path.dirname(folder) == folder:
      break
    folder = os.path.dirname(folder)
  for folder in reversed(chain):  # outermost first
    checked = root is not None and folder != root and _under(folder, root)
    if checked and os.path.islink(folder):
      raise _link_refused(folder, "a folder this program made")
    if os.path.lexists(folder):
      if not os.path.isdir(folder):
        where = "" if folder == local else f" (in the way of {local})"
        raise RefusedPath(f"{folder} is a file, not a folder{where}; move it aside or choose another path, then rerun.")
      continue
    try:
      os.mkdir(folder)
    except FileExistsError:  # made meanwhile: checked again below
      pass
    if checked and os.path.islink(folder):
      raise _link_refused(folder, "a folder this program made")
  return target


def _under(folder: str, root: str) -> bool:
  return os.path.commonpath([folder, root]) == root


def move(source, target) -> None:
  """Renames `source` to `target`, which must not exist (a link there included: never replaced, never followed)."""
  if _local(target) is None:
    epath.Path(source).rename(target)
    return
  if os.path.lexists(target):
    raise FileExistsError(errno.EEXIST, "exists", os.fspath(target))
  os.rename(os.fspath(source), os.fspath(target))


def probe_writable(folder) -> None:
  """Raises OSError unless a file can be created in local `folder` (created first): a read-only or full volume."""
  make_folder(folder)
  fd, temporary = _exclusive_temporary(os.path.join(_local(folder), "probe"))
  os.close(fd)
  os.unlink(temporary)


@contextlib.contextmanager
def atomic_folder(path):
  """Yields a new empty folder to fill; when the block ends without an error it takes `path`'s place at once (a
  folder already there is exchanged with it in one rename, renameat2 RENAME_EXCHANGE, then deleted; where the file
  system cannot exchange, it is moved aside first), with Ctrl-C held back until that is done. An error in the block
  deletes the new folder and leaves `path` as it was. A link at `path` is refused. Stray new folders of killed runs
  beside `path` are deleted first. On a bucket (no folder renames) the block writes into `path` itself."""
  local = _local(path)
  if local is None:
    yield make_folder(path)
    return
  refuse_link(local, "a folder")
  if os.path.lexists(local) and not os.path.isdir(local):
    raise RefusedPath(f"{local} is a file, not a folder; pass another path or move it aside, then rerun.")
  parent, name = os.path.split(local)
  make_folder(parent)
  for entry in os.listdir(parent):
    stray = os.path.join(parent, entry)
    if is_temporary(entry, name) and os.path.isdir(stray) and not os.path.islink(stray):
      shutil.rmtree(stray, ignore_errors=True)
  for _ in range(100):
    staging = _temporary_name(local)
    try:
      os.mkdir(staging)  # never an existing name, nor a link
      break
    except FileExistsError:
      continue
  try:
    yield epath.Path(staging)
    for folder, _, names in os.walk(staging):
      for entry in names:
        fd = os.open(os.path.join(folder, entry), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.fsync(fd)
        os.close(fd)
    with interrupts_held():
      if os.path.isdir(local) and _exchange(staging, local):
        shutil.rmtree(staging, ignore_errors=True)  # now the old folder (a leftover is deleted next time)
      elif not os.path.isdir(local):
        os.rename(staging, local)
      else:  # no exchange here: the old folder moves aside for the moment between two renames
        aside = _temporary_name(local)
        os.rename(local, aside)
        try:
          os.rename(staging, local)
        except BaseException:
          os.rename(aside, local)
          raise
        shutil.rmtree(aside, ignore_errors=True)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise


def _exchange(a: str, b: str) -> bool:
  """Swaps two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
  if not sys.platform.startswith("linux"):
    return False
  try:
    renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
  except (AttributeError, OSError):
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
    return False
  raise OSError(code, os.strerror(code), b)


@contextlib.contextmanager
def interrupts_held():
  """Holds back a Ctrl-C (SIGINT) that arrives in the block until it ends (main thread only)."""
  previous = signal.getsignal(signal.SIGINT)
  if threading.current_thread() is not threading.main_thread() or previous is None:  # (None: not set from Python)
    yield
    return
  received = []
  signal.signal(signal.SIGINT, lambda *args: received.append(args))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    if received and callable(previous):
      previous(*received[0])
    elif received and previous == signal.SIG_DFL:
      raise KeyboardInterrupt


def check_writable_location(path, what: str, create: bool = False) -> None:
  """Raises ValueError, before any long work, when `path` is empty, names a file, (`create`) cannot be made a
  folder, or is a URL this install cannot open or whose service does not answer (paths.check_remote_location)."""
  text = os.fspath(path)
  if not text.strip():
    raise ValueError(f"{what} is empty; pass a folder (e.g. {what}=runs/my_run): an empty one would write into the "
                     "current directory.")
  if paths.is_remote(text):
    paths.check_remote_location(text, what)
  else:
    _check_local_folder(text, what, create)


def _check_local_folder(text: str, what: str, create: bool) -> None:
  folder = os.path.abspath(os.path.expanduser(text))
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise ValueError(f"{what}={text} is a file; pass {'a folder (a new one is created)' if create else 'a folder'}.")
  if not create:
    return
  above = os.path.dirname(folder)
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above):
    raise ValueError(f"{what}={text} lies under the file {above}; pass a folder in a writable location.")
  try:
    make_folder(folder)
  except OSError as error:
    raise ValueError(f"{what}={text} cannot be created ({error.strerror}); pass a folder in a writable "
                     "location.") from error
  if not os.access(folder, os.W_OK | os.X_OK):
    raise ValueError(f"{what}={text} is not writable; pass a folder in a writable location.")
