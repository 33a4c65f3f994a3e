"""Measures this machine's float32 and bfloat16 matmul peak through JAX: the denominator for CPU MFU.

    .venv/bin/python benchmarks/matmul_peak.py [--sizes 1024,2048,4096] [--seconds 2]

bfloat16 multiplies accumulate in float32 (as the model's bf16 matmuls do). Prints the best FLOP/s per size and
dtype; the other benchmarks import `measure_peaks` and call it in the same run as their models, so MFU is
relative to a limit measured under the same load.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np


def best_flops(size: int, dtype: str, seconds: float) -> float:
  """Best FLOP/s of a jitted [size, size] @ [size, size] (float32 accumulation) over repeated timed runs."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
  matmul = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32))
  matmul(x).block_until_ready()
  best, deadline = float("inf"), time.perf_counter() + seconds
  while time.perf_counter() < deadline:
    start = time.perf_counter()
    matmul(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


class MatmulProbe:
  """One jitted square matmul; each call runs it once and returns its FLOP/s, to interleave with other timings."""

  def __init__(self, size: int = 1024, dtype: str = "float32"):
    self.size, self.dtype = size, dtype
    self.x = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
    self.matmul = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32))
    self.matmul(self.x).block_until_ready()
    self.best = 0.0

  def __call__(self, repeats: int = 3) -> float:
    for _ in range(repeats):
      start = time.perf_counter()
      self.matmul(self.x).block_until_ready()
      self.best = max(self.best, 2 * self.size ** 3 / (time.perf_counter() - start))
    return self.best


def measure_peaks(sizes=(1024, 2048), dtypes=("float32", "bfloat16"), seconds: float = 1.0) -> dict:
  """{dtype: best FLOP/s over sizes, 'by_size': {dtype: {size: FLOP/s}}}."""
  by_size = {dtype: {size: best_flops(size, dtype, seconds) for size in sizes} for dtype in dtypes}
  return dict({dtype: max(v.values()) for dtype, v in by_size.items()}, by_size=by_size)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--sizes", default="1024,2048,4096")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--seconds", type=float, default=2.0)
  args = parser.parse_args()
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({jax.default_backend()}), {jax.device_count()} device(s)")
  peaks = measure_peaks(tuple(map(int, args.sizes.split(","))), tuple(args.dtypes.split(",")), args.seconds)
  for dtype, sizes in peaks["by_size"].items():
    for size, flops in sizes.items():
      print(f"{dtype:>9} {size:>5}^3: {flops / 1e9:8.1f} GFLOP/s")
  for dtype in peaks["by_size"]:
    print(f"peak {dtype}: {peaks[dtype]:.4g} FLOP/s")


if __name__ == "__main__":
  main()
