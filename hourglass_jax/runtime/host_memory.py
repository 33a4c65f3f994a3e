"""Host memory for the CPU backend: let glibc's malloc keep the memory XLA:CPU frees, instead of unmapping it.

XLA:CPU allocates each program's temp buffer (2.5 GiB for the peer-shaped train step) on every execution and frees
it afterwards. glibc serves a buffer that large with a fresh mmap (its mmap threshold cannot exceed 32 MiB), so the
kernel faults it in page by page on every step: 671k minor faults and 1.1-1.4 s of system time per 6 s step
(getrusage around single steps; the step time with and without: benchmarks/peer_compare.py --host_malloc).
`keep_freed_memory()` sets three malloc options so that large blocks come from the heap and stay there when freed:
one arena, no mmap, no trimming. The step then takes no faults.

The cost is resident memory: the process keeps its high-water mark (the step's temp buffer stays mapped between
steps, as a caching allocator would keep it). It must run before the JAX backend starts: threads that have already
allocated keep their own arenas, from which large blocks are still mmapped. The CLIs call it (`--host_malloc`).
"""

import ctypes
import ctypes.util
import importlib.util
import logging

# mallopt(3) parameters, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# (tunable name, mallopt parameter, value): one arena, no mmap, never trim (-1: glibc stores the threshold unsigned).
SETTINGS = (("arena_max", M_ARENA_MAX, 1), ("mmap_max", M_MMAP_MAX, 0), ("trim_threshold", M_TRIM_THRESHOLD, -1))
# The same settings for a process started from a shell (glibc reads them at start-up), e.g. another framework's.
GLIBC_TUNABLES = ":".join(f"glibc.malloc.{name}={value % 2**64}" for name, _, value in SETTINGS)
MODES = ("auto", "keep", "system")  # the CLIs' --host_malloc
# Packages whose presence means JAX may pick an accelerator over the CPU.
ACCELERATOR_PACKAGES = ("libtpu", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")


def _glibc():
  """The C library's handle when it is glibc (mallopt with these parameters is glibc's), else None."""
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name)
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    libc.gnu_get_libc_version()
  except (OSError, AttributeError, TypeError):
    return None
  return libc


def _backend_started() -> bool:
  import jax._src.xla_bridge as xla_bridge  # no public query; a JAX without it counts as not started

  return getattr(xla_bridge, "backends_are_initialized", lambda: False)()


def backend_will_be_cpu(platforms: str | None = None) -> bool:
  """Whether JAX will run on the CPU, decided without starting a backend: `platforms` (default JAX_PLATFORMS or
  jax.config's jax_platforms) names cpu first, or none is named and no TPU/GPU plugin is installed."""
  if platforms is None:
    import jax

    platforms = jax.config.jax_platforms
  platforms = (platforms or "").strip()
  if platforms:
    return platforms.split(",")[0].strip() == "cpu"
  return not any(importlib.util.find_spec(name) for name in ACCELERATOR_PACKAGES)


def keep_freed_memory() -> bool:
  """Sets glibc malloc to keep freed memory (one arena, no mmap, no trimming); True when it did. False, with a log
  line, where the C library is not glibc (macOS, musl): nothing is changed there."""
  libc = _glibc()
  if libc is None:
    logging.info("host_malloc: the C library is not glibc; malloc left at its defaults.")
    return False
  if _backend_started():
    logging.warning("host_malloc: the JAX backend has already started; its threads keep their own malloc arenas, "
                    "so XLA's large buffers are still mapped afresh. Call keep_freed_memory() before any JAX "
                    "computation or jax.devices().")
  done = [libc.mallopt(param, value) for _, param, value in SETTINGS]
  if not all(done):
    raise RuntimeError(f"mallopt refused a setting (results {done}); run with --host_malloc=system.")
  logging.info("host_malloc: glibc malloc keeps freed memory (one arena, no mmap, no trim).")
  return True


def configure(mode: str) -> bool:
  """The CLIs' --host_malloc: 'keep' sets keep_freed_memory(); 'auto' does so when the backend will be the CPU;
  'system' leaves malloc alone. True when malloc was changed."""
  if mode not in MODES:
    choices = ", ".join(map(repr, MODES[:-1])) + f" or {MODES[-1]!r}"
    raise ValueError(f"host_malloc must be {choices}, got {mode!r}.")
  if mode == "system" or (mode == "auto" and not backend_will_be_cpu()):
    return False
  return keep_freed_memory()
