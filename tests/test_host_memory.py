"""hourglass_jax.runtime.host_memory: glibc malloc keeps XLA:CPU's freed buffers, so repeated executions take no page
faults.

The malloc settings are process-wide, so the real effect is measured in subprocesses; in-process tests use a fake
C library."""

import json
import logging
import statistics
import sys

import pytest

from hourglass_jax.runtime import host_memory
from tests.helpers import optimized_programs, run, train_command  # noqa: F401  (autouse: runs 32 executions)

# A program whose 64 MiB temp buffer (the cumulative sum) is above glibc's largest mmap threshold (32 MiB); minor
# faults per execution. A cumulative sum, not a sort: the same buffer at a sixth of the time.
FAULTS_PER_RUN = """
import json, resource, sys
import jax, jax.numpy as jnp
from hourglass_jax.runtime import host_memory
changed = host_memory.configure(sys.argv[1])

@jax.jit
def program(x):
  y = jnp.cumsum(x)
  return (y * jnp.flip(y)).sum()

x = jnp.ones(1 << 24)
program(x).block_until_ready()
faults = []
for _ in range(32):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  program(x).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(dict(changed=changed, faults=faults)))
"""


def _faults(mode: str) -> dict:
  done = run([sys.executable, "-c", FAULTS_PER_RUN, mode], devices=1)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and Linux fault counters")
def test_keeping_freed_memory_stops_the_per_execution_page_faults():
  kept, system = _faults("keep"), _faults("system")
  assert kept["changed"] and not system["changed"]
  # The default maps the 64 MiB buffer afresh each time (16k+ faults of 4 KiB pages). Kept, the heap grows over the
  # first runs and then serves buffers from memory it has. Under load a growth can come later (the
  # 13th run once, at load 6-11), so the test judges the last 8 of 32.
  per_run = statistics.median(system["faults"])
  assert per_run > 16_000, system
  assert statistics.median(kept["faults"][-8:]) < per_run / 10, (kept, system)
  assert sum(kept["faults"]) < sum(system["faults"]) / 3, (kept, system)


class FakeLibc:
  def __init__(self, result=1):
    self.calls, self.result = [], result

  def mallopt(self, param, value):
    self.calls.append((param, value))
    return self.result


def test_keep_sets_one_arena_no_mmap_no_trim(monkeypatch):
  libc = FakeLibc()
  monkeypatch.setattr(host_memory, "_glibc", lambda: libc)
  monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
  assert host_memory.keep_freed_memory()
  assert dict(libc.calls) == {host_memory.M_ARENA_MAX: 1, host_memory.M_MMAP_MAX: 0, host_memory.M_TRIM_THRESHOLD: -1}


def test_keep_after_the_backend_started_warns(monkeypatch, caplog):
  monkeypatch.setattr(host_memory, "_glibc", lambda: FakeLibc())
  monkeypatch.setattr(host_memory, "_backend_started", lambda: True)
  with caplog.at_level(logging.WARNING):
    host_memory.keep_freed_memory()
  assert "already started" in caplog.text and "before any JAX computation" in caplog.text


def test_the_backend_of_this_test_process_has_started():
  import jax

  jax.devices()
  assert host_memory._backend_started()


def test_a_refused_setting_is_an_error_naming_the_opt_out(monkeypatch):
  monkeypatch.setattr(host_memory, "_glibc", lambda: FakeLibc(result=0))
  monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
  with pytest.raises(RuntimeError, match="--host_malloc=system"):
    host_memory.keep_freed_memory()


def test_without_glibc_nothing_changes(monkeypatch):
  monkeypatch.setattr(host_memory, "_glibc", lambda: None)
  monkeypatch.setattr(host_memory, "_backend_started", lambda: False)
  assert not host_memory.keep_freed_memory()


def test_this_linux_c_library_is_recognised_as_glibc():
  if not sys.platform.startswith("linux"):
    pytest.skip("glibc is a Linux C library")
  assert host_memory._glibc() is not None


@pytest.mark.parametrize("platforms, plugin, expected", [
    ("cpu", "libtpu", True), ("cpu,cuda", None, True), ("tpu", None, False), ("cuda,cpu", None, False),
    ("", None, True), ("", "libtpu", False), ("", "jax_cuda12_plugin", False),
    (None, None, True)])  # None: jax.config's, "cpu" in this test process (conftest)
def test_backend_will_be_cpu(monkeypatch, platforms, plugin, expected):
  monkeypatch.setattr(host_memory.importlib.util, "find_spec", lambda name: object() if name == plugin else None)
  assert host_memory.backend_will_be_cpu(platforms) is expected


@pytest.mark.parametrize("mode, cpu, expected", [("keep", False, True), ("auto", True, True), ("auto", False, False),
                                                 ("system", True, False)])
def test_configure_modes(monkeypatch, mode, cpu, expected):
  monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: True)
  monkeypatch.setattr(host_memory, "backend_will_be_cpu", lambda: cpu)
  assert host_memory.configure(mode) is expected


def test_configure_rejects_an_unknown_mode():
  with pytest.raises(ValueError, match="'auto', 'keep' or 'system'"):
    host_memory.configure("always")


@pytest.mark.parametrize("mode, kept", [("auto", True), ("system", False)])
def test_the_clis_set_host_malloc_before_the_backend_starts(tmp_path, mode, kept):
  # hourglass-export reaches the CLIs' shared set-up, then stops on the empty workdir; INFO shows the log line.
  done = run([sys.executable, "-c", "from hourglass_jax.cli.main import export_entry; export_entry()",
              f"--workdir={tmp_path}", f"--output={tmp_path / 'out'}", "--verbosity=0", f"--host_malloc={mode}"],
             devices=1)
  assert "no checkpoints under" in done.stderr, done.stderr[-2000:]
  assert ("glibc malloc keeps freed memory" in done.stderr) is kept, done.stderr[-2000:]
  assert "already started" not in done.stderr


def test_the_cli_flag_names_its_choices(tmp_path):
  done = run(train_command(tmp_path / "workdir", "--host_malloc=always"), devices=1)
  assert done.returncode != 0 and "--host_malloc=always" in done.stderr and "<auto|keep|system>" in done.stderr
