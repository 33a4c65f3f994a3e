"""Long-lived processes (issue 45): compiled programs keep memory maps while jax's caches hold them; the library
measures them, warns with the fix where vm.max_map_count is low, and releases programs between runs, so a process
that compiles several hundred programs survives."""

import subprocess
import sys

from hourglass_jax.runtime import memory_maps
from tests.helpers import command_env

# Several hundred distinct programs in one process, released every 50 as the library's sweeps do between runs; the
# maps each one keeps are measured on the way.
MANY_COMPILES = r"""
import jax, jax.numpy as jnp
jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_enable_compilation_cache", False)
from hourglass_jax.runtime import memory_maps
x = jnp.ones((8, 8))
start = memory_maps.mapped_regions()
peak, grown = start, []
for i in range(300):
  jax.jit(lambda a, i=i: jnp.tanh(a @ a.T * (i + 1)) + i)(x).block_until_ready()
  peak = max(peak, memory_maps.mapped_regions())
  if i % 50 == 49:
    grown.append(memory_maps.mapped_regions() - start)
    memory_maps.release_programs()
print("maps", start, peak, memory_maps.mapped_regions(), max(grown) / 50.0)
"""


def test_several_hundred_compiles_in_one_process_survive_with_bounded_maps():
  result = subprocess.run([sys.executable, "-c", MANY_COMPILES], capture_output=True, text=True, timeout=300,
                          env=command_env(devices=1))
  assert result.returncode == 0, result.stderr[-2000:]
  start, peak, end, per_program = map(float, result.stdout.split("maps")[-1].split())
  # A live program holds its maps (about 0-3 for these, 40 for each program of a tiny Hourglass, hundreds for a train
  # step); released every 50, the process ends near where it began and never holds more than a batch's worth.
  assert end <= start + 50 * per_program + 20, (start, end, per_program)
  assert peak <= start + 60 * per_program + 40, (start, peak, per_program)


def test_a_low_limit_is_named_with_its_fix(monkeypatch):
  monkeypatch.setattr(memory_maps, "max_map_count", lambda: 65_530)
  memory_maps.reset_warning()
  messages = []
  message = memory_maps.warn_if_low(messages.append, force=True)
  assert messages == [message] and "vm.max_map_count is 65,530" in message and "sysctl -w vm.max_map_count" in message
  assert memory_maps.warn_if_low(messages.append, force=True) is None  # once per process
  memory_maps.reset_warning()
  monkeypatch.setattr(memory_maps, "max_map_count", lambda: 1_048_576)
  assert memory_maps.warn_if_low(messages.append, force=True) is None  # a high limit: nothing to say
  memory_maps.reset_warning()
