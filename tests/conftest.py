"""Test set-up: 8 virtual CPU devices, set before jax is imported anywhere, and a persistent compilation cache
shared by the xdist workers and the subprocesses tests start (identical programs compile once per machine)."""

import os
import pathlib

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ["JAX_PLATFORMS"] != "cpu":  # float32 tolerances of 1e-5 assume full-precision matmuls, not GPU TF32
  os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      str(pathlib.Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax_compilation_cache"))
