"""The persistent XLA compilation cache: where it lives, turning it on, and counting its hits from jax's
monitoring events (a hit loads a compiled program from disk instead of compiling it again)."""

import contextlib
import dataclasses
import os
import re
import sys
import time
import warnings

import jax
from jax import monitoring

from hourglass_jax.runtime import files, paths

_EVENTS = "/jax/compilation_cache/"
_FIELDS = {_EVENTS + "compile_requests_use_cache": "requests", _EVENTS + "cache_hits": "hits",
           _EVENTS + "cache_misses": "writes"}  # jax records a miss when it writes the new entry


@dataclasses.dataclass
class Counts:
  """Persistent-cache lookups, hits, entries written, and compile seconds the hits saved (jax stores compile
  times in whole seconds, so a program that compiled in under a second saves ~0)."""
  requests: int = 0
  hits: int = 0
  writes: int = 0
  saved_seconds: float = 0.0

  def __sub__(self, other: "Counts") -> "Counts":
    return Counts(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


_COUNTS = Counts()
_listening = False


def _on_event(name: str, **_) -> None:
  if name in _FIELDS:
    setattr(_COUNTS, _FIELDS[name], getattr(_COUNTS, _FIELDS[name]) + 1)


def _on_duration(name: str, seconds: float, **_) -> None:
  if name == _EVENTS + "compile_time_saved_sec":
    _COUNTS.saved_seconds += seconds


def counts() -> Counts:
  """A copy of this process's counts so far (listening starts at the first call); subtract two to get a span's."""
  global _listening
  if not _listening:
    monitoring.register_event_listener(_on_event)
    monitoring.register_event_duration_secs_listener(_on_duration)
    _listening = True
  return dataclasses.replace(_COUNTS)


def directory() -> str | None:
  """The cache folder jax uses now, or None when the persistent cache is off."""
  if not jax.config.jax_enable_compilation_cache:
    return None
  return jax.config.jax_compilation_cache_dir or None


def default_location(workdir=None) -> str:
  """$JAX_COMPILATION_CACHE_DIR if set; else the user cache folder ($XDG_CACHE_HOME or ~/.cache)/hourglass_jax/xla,
  whatever the workdir: a cache holds native code that this process runs, so a bucket workdir's cache (written by
  whoever can write the bucket) is used only when asked for by --compilation_cache or the variable (docs/weights.md)."""
  del workdir
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "hourglass_jax", "xla")


def _warn(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def enable(location: str, log=_warn) -> str | None:
  """Puts jax's persistent compilation cache in `location` ('off' turns it off) and returns the folder, or None
  when it is off. A local folder that cannot be written logs one warning and leaves the cache off."""
  counts()
  if location.lower() in ("off", "none", "false", "0"):
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if not paths.is_remote(location):
    location = os.path.abspath(os.path.expanduser(location))
    try:
      files.probe_writable(location)
    except (OSError, ValueError) as error:
      jax.config.update("jax_enable_compilation_cache", False)
      log(f"warning: compilation cache {location} is not writable ({getattr(error, 'strerror', None) or error}); "
          "continuing without it (--compilation_cache=DIR moves it, =off silences this).")
      return None
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", location)
  _full_cache_in_one_line(log)
  return location


_CACHE_WRITE = re.compile(r"Error writing persistent compilation cache entry for '([^']*)': (.*)", re.DOTALL)


def _full_cache_in_one_line(log) -> None:
  """jax warns, with its source line, when it cannot store a compiled program; a full disk or the file-size limit
  (`ulimit -f`) becomes one line saying what it costs (the program compiles again next run), and the partial entry
  jax leaves (it writes entries in place, and never replaces one) is deleted. Other warnings pass."""
  previous = warnings.showwarning
  if getattr(previous, "full_cache_in_one_line", False):
    return

  def show(message, category, filename, lineno, file=None, line=None):
    match = _CACHE_WRITE.match(str(message))
    cause = match and paths.disk_full(OSError(str(message)))
    if not cause:
      previous(message, category, filename, lineno, file, line)
      return
    _remove_partial_entry(match.group(1))
    log(f"warning: the compilation cache could not store {match.group(1)} ({cause}); it compiles again next run "
        "(--compilation_cache=off silences this).")

  show.full_cache_in_one_line = True
  warnings.showwarning = show


def _remove_partial_entry(program: str, seconds: float = 120.0) -> None:
  """Deletes the newest entry of `program` written in the last `seconds` in a local cache folder: the one a write
  that just failed left partial (a good one deleted by mistake costs one compile)."""
  folder = directory()
  if folder is None or paths.is_remote(folder) or not os.path.isdir(folder):
    return
  entries = [os.path.join(folder, name) for name in os.listdir(folder)
             if name.startswith(f"{program}-") and name.endswith("-cache")]
  recent = [path for path in entries if time.time() - os.path.getmtime(path) < seconds]
  if recent:
    with contextlib.suppress(OSError):
      os.unlink(max(recent, key=os.path.getmtime))


def describe(span: Counts) -> str:
  """How a compile went, from its span of counts: 'persistent cache hit, saved 93.2 s', 'persistent cache miss;
  cached in DIR', 'persistent cache miss; not written to DIR' (quick compiles are not) or 'persistent cache off'."""
  folder = directory()
  if folder is None:
    return "persistent cache off"
  if span.hits:
    return f"persistent cache hit, saved {max(span.saved_seconds, 0.0):.1f} s"
  home = os.path.expanduser("~")
  shown = "~" + folder[len(home):] if folder.startswith(home + os.sep) else folder
  return f"persistent cache miss; {'cached in' if span.writes else 'not written to'} {shown}"
