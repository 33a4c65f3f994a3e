"""Memory maps of compiled programs, for processes that compile many (a notebook, a sweep).

XLA:CPU keeps each compiled program's code and constants in memory regions of their own, about 50 for a small
jitted function and 300-800 for an Hourglass model's train step, for as long as jax's caches hold the program. Linux
caps the regions of one process at vm.max_map_count (65,530 by default): a process that compiles about a hundred
models reaches it and XLA dies ("LLVM compilation error: Cannot allocate memory", then a segmentation fault).

`warn_if_low` says so once per process, with the fix, on the CPU backend where the limit is low and the process is
interactive or has already used a quarter of it: a process that builds many models (a notebook, a sweep) calls it
before each one, as benchmarks/shortening_study.py does; `release_programs` drops every compiled program (the persistent
compilation cache makes a later recompile cheap), as the library's own sweeps do between runs.
"""

import gc
import sys

import jax

MAPS, LIMIT = "/proc/self/maps", "/proc/sys/vm/max_map_count"
LOW_LIMIT = 262_144  # room for about 400 Hourglass train steps
FIX = "sudo sysctl -w vm.max_map_count=1048576"
_warned = False


def mapped_regions() -> int | None:
  """The memory regions this process maps now (None where /proc is not Linux's)."""
  try:
    with open(MAPS, "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def max_map_count() -> int | None:
  """The kernel's limit on the regions of one process (vm.max_map_count), None where unknown."""
  try:
    with open(LIMIT) as f:
      return int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return None


def _interactive() -> bool:
  return hasattr(sys, "ps1") or "IPython" in sys.modules or bool(sys.flags.interactive)


def warn_if_low(log=None, force: bool = False) -> str | None:
  """Warns once per process (and returns the message) when JAX runs on the CPU, vm.max_map_count is below
  LOW_LIMIT, and the process is interactive or already maps a quarter of the limit (`force`: whatever it maps)."""
  global _warned
  limit, regions = max_map_count(), mapped_regions()
  if _warned or limit is None or regions is None or limit >= LOW_LIMIT:
    return None
  if not (force or _interactive() or regions > limit // 4):
    return None
  if jax.default_backend() != "cpu":
    return None
  _warned = True
  message = (f"warning: vm.max_map_count is {limit:,} and this process maps {regions:,} memory regions; XLA:CPU keeps "
             "about 50 per compiled function and 300-800 per compiled model, so a process that compiles about a "
             f"hundred models dies with 'Cannot allocate memory'. Raise the limit (`{FIX}`), or call "
             "hourglass_jax.runtime.memory_maps.release_programs() between models.")
  (log or (lambda text: print(text, file=sys.stderr, flush=True)))(message)
  return message


def release_programs() -> int | None:
  """Drops every compiled program jax's caches hold (and their memory maps); returns the regions mapped after."""
  jax.clear_caches()
  gc.collect()
  return mapped_regions()


def reset_warning() -> None:
  """Lets `warn_if_low` warn again (tests)."""
  global _warned
  _warned = False

