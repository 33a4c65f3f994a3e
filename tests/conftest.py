"""Test set-up, set before jax is imported anywhere and inherited by the subprocesses tests start: 8 virtual CPU
devices; XLA's backend optimisations off (JAX_DISABLE_MOST_OPTIMIZATIONS: the suite's programs are tiny, so LLVM's
optimisation passes cost far more than they save; HLO passes, and so cost and memory analyses, are unchanged); and
a persistent compilation cache that keeps every program (not only those that took a second to compile), shared by
the xdist workers and the subprocesses, so identical programs compile once per machine."""

import gc
import os
import pathlib

import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] != "cpu":  # float32 tolerances of 1e-5 assume full-precision matmuls, not GPU TF32
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax_compilation_cache"))


@pytest.fixture(autouse=True, scope="module")
def release_compiled_programs():
  """Drops the compiled programs of a test module when it ends: each keeps hundreds of memory mappings while jax's
  caches hold it, and an xdist worker that had run a few hundred tests crossed the kernel's limit of 65,530
  (vm.max_map_count), where XLA crashed. Later modules reload what they share from the persistent cache."""
  yield
  import jax  # imported here: the settings above must precede jax's import
  jax.clear_caches()
  gc.collect()


def pytest_collection_modifyitems(items):
  """Tests marked slow or multiprocess first (in their order), so that under xdist the long ones start early and
  the many short ones fill the gaps, instead of one long test running alone at the end."""
  items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("multiprocess")))


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
  """One training run per test process, shared by the checkpoint, integrity and export tests (tests that change it
  work on a copy, tests/helpers.py:copy_checkpoints): checkpoints at steps 2 and 4, its config and trainer, and
  step 4's state and data position on the host. Paid by whichever test needs it first: those tests are marked
  slow."""
  from tests.helpers import trained_run  # pylint: disable=import-outside-toplevel  (after the settings above)

  workdir = tmp_path_factory.mktemp("trained")
  return workdir, *trained_run(workdir)
