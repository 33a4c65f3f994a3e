"""The persistent compilation cache of the command lines: a second start loads the train step from disk, 'off'
writes nothing, and a cache folder that cannot be written only warns. Each run gets its own cache folder (not the
test session's) and one CPU device, which compiles fastest."""

import re
import subprocess

import pytest

from hourglass_jax.runtime import compile_cache
from tests.helpers import command_env, train_command

_HIT = re.compile(r"compile: ([\d.]+) s \(persistent cache hit, saved ([\d.]+) s\)")
_MISS = re.compile(r"compile: ([\d.]+) s \(persistent cache miss; cached in (.+)\)")


def _train(tmp_path, name: str, *flags: str) -> subprocess.CompletedProcess:
  env = command_env(devices=1)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"  # the suite's quick compiles save under the 1 s jax records
  env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
  command = train_command(tmp_path / name, "--config.train.steps=1", "--config.train.sample_bytes=0", *flags)
  result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.mark.slow
def test_second_start_loads_the_train_step_from_the_cache(tmp_path):
  folder = tmp_path / "xdg" / "hourglass_jax" / "xla"
  miss = _MISS.search(_train(tmp_path, "first").stdout)
  assert miss and miss.group(2) == str(folder)
  assert list(folder.glob("jit_train_step-*"))
  hit = _HIT.search(_train(tmp_path, "second").stdout)
  assert hit, "no cache hit reported"
  assert float(hit.group(2)) > 0 and float(hit.group(1)) < float(miss.group(1))


@pytest.mark.slow
def test_off_writes_nothing(tmp_path):
  result = _train(tmp_path, "run", "--compilation_cache=off")
  assert "(persistent cache off)" in result.stdout
  assert not (tmp_path / "xdg").exists()


@pytest.mark.slow
def test_unwritable_cache_folder_warns_and_trains(tmp_path):
  (tmp_path / "file").write_text("")  # a folder under a file cannot be made, even by root
  result = _train(tmp_path, "run", f"--compilation_cache={tmp_path / 'file' / 'xla'}")
  warnings = [line for line in result.stderr.splitlines() if "compilation cache" in line]
  assert len(warnings) == 1 and warnings[0].startswith("warning:") and "not writable" in warnings[0], result.stderr
  assert "(persistent cache off)" in result.stdout and "step 1: valid bits/byte" in result.stdout


def test_default_location(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.default_location("runs/a") == str(tmp_path / "hourglass_jax" / "xla")
  # a bucket workdir keeps the local default: its cache is native code whoever can write the bucket wrote
  assert compile_cache.default_location("gs://bucket/run/") == str(tmp_path / "hourglass_jax" / "xla")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/cache")
  assert compile_cache.default_location("gs://bucket/run") == "/shared/cache"
