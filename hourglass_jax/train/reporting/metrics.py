"""Throughput and MFU bookkeeping, the compiled step's cost and memory report, and TensorBoard summaries."""

import functools
import math
import secrets
import time

import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.runtime.paths import disk_full, free_space
from hourglass_jax.train.checks import DiskFullError, TrainError

# Dense bf16 peak FLOP/s per JAX device (a TPU v2/v3 device is one core; v4 and later, one chip). First match wins.
PEAK_FLOPS = (
    ("TPU v2", 22.5e12), ("TPU v3", 61.5e12), ("TPU v4", 275e12), ("TPU v5 lite", 197e12), ("TPU v5e", 197e12),
    ("TPU v5", 459e12), ("TPU v6 lite", 918e12), ("TPU v6e", 918e12), ("TPU7x", 2307e12),
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12), ("B200", 2250e12),
    ("A100", 312e12), ("A10G", 125e12), ("L40S", 362e12), ("L4", 121e12), ("V100", 125e12),
)


@functools.lru_cache(maxsize=None)
def measure_matmul_flops(size: int = 1024, dtype: str = "float32", seconds: float = 0.3) -> float:
  """FLOP/s of a jitted [size, size] @ [size, size] matmul on the default device, best of repeated runs."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), dtype)
  matmul = jax.jit(lambda a: a @ a)
  matmul(x).block_until_ready()
  best, deadline = math.inf, time.perf_counter() + seconds
  while time.perf_counter() < deadline:
    start = time.perf_counter()
    matmul(x).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best


def peak_flops_per_device(configured: float, dtype: str = "float32") -> tuple[float, str]:
  """(peak FLOP/s of one device, where the figure comes from): configured, the table, or a measured matmul in
  the model's dtype shared by the local devices (virtual CPU devices share the same cores)."""
  if configured > 0:
    return configured, "train.peak_flops_per_device"
  device = jax.local_devices()[0]
  for name, flops in PEAK_FLOPS:
    if name.lower() in device.device_kind.lower():
      return flops, f"{device.device_kind} bf16 dense peak"
  count = jax.local_device_count()
  return measure_matmul_flops(dtype=dtype) / count, f"measured {dtype} matmul / {count} local device(s)"


def mfu_above_peak(mfu: float, peak_per_device: float, peak_source: str) -> str | None:
  """The warning for an MFU above 100%, which means the peak it divides by is too low; None otherwise."""
  if not mfu > 1.0:
    return None
  return (f"MFU {mfu:.0%} is above 100%: the step ran faster than the peak it is measured against "
          f"({peak_per_device / 1e12:,.3g} TFLOP/s per device, {peak_source}). Set train.peak_flops_per_device to "
          "this device's peak FLOP/s, or to 0 to look it up (GPU/TPU) or measure a matmul (CPU).")


def boundary_rates_apart(train_metrics: dict, eval_metrics: dict, ratio: float = 2.0) -> dict[str, str]:
  """{metric: warning} for each learned level whose boundary rate (a sown `*/boundary_rate`) in evaluation is more
  than `ratio` times above or below its rate in training: its center then sees other segments than it trained on,
  so the evaluation scores a different model (a level that samples in training and thresholds in evaluation does
  this until it is sure)."""
  warnings = {}
  for name, evaluated in eval_metrics.items():
    trained = train_metrics.get(name)
    if not name.endswith("boundary_rate") or not trained or trained / ratio <= evaluated <= trained * ratio:
      continue
    how = ("does not cut at all" if not evaluated else f"cuts {trained / evaluated:.1f}x less often than in training"
           if evaluated < trained else f"cuts {evaluated / trained:.1f}x more often than in training")
    warnings[name] = (f"{name} is {evaluated:.3g} in evaluation against {trained:.3g} in training: the level {how}, "
                      "so the evaluation scores a different model. A level thresholded in evaluation "
                      "(model.gumbel_evaluation='threshold', the default) does this until its logits are sure; "
                      "model.gumbel_evaluation='sample' evaluates with training's draw.")
  return warnings


def cost_flops(compiled) -> float | None:
  """XLA's FLOP count for one call of a compiled function (per device for a partitioned program)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  return float(cost["flops"]) if cost and cost.get("flops", -1) >= 0 else None


def memory_bytes(compiled) -> int | None:
  """Per-device bytes the compiled step needs: arguments + outputs - donated aliases + temporaries."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  return (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
          + stats.temp_size_in_bytes + stats.generated_code_size_in_bytes)


def device_memory_limit() -> int | None:
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # backends without memory stats (CPU) raise or return None
    return None
  return stats.get("bytes_limit") if stats else None


def check_memory(needed: int | None, limit: int | None) -> None:
  if needed is not None and limit is not None and needed > limit:
    raise TrainError(f"the compiled train step needs {needed / 2**30:.2f} GiB per device but the device has "
                     f"{limit / 2**30:.2f} GiB. Lower data.batch_size, raise train.grad_accum_steps, set "
                     "model.remat_policy=nothing_saveable, use model.dtype=bfloat16, or shard parameters over more "
                     "devices (mesh.fsdp / mesh.tensor).")


# The one metrics record: metrics.jsonl stores each as written, TensorBoard draws its numbers (`scalars_of`).
RECORD_KEYS = ("step", "split", "tokens_seen", "whole_split", "batches", "total_batches")  # the record's bookkeeping
PERF = ("tokens_per_second", "step_time_s", "mfu")  # speed, drawn under perf/ rather than the split's tag


def scalars_of(record: dict, tag: str) -> dict:
  """TensorBoard's scalars of one metrics record: every number but the bookkeeping, under `tag`/ (speed under
  perf/)."""
  return {f"{'perf' if name in PERF else tag}/{name}": value for name, value in record.items()
          if name not in RECORD_KEYS}


class SummaryWriter:
  """TensorBoard scalars in the workdir (process 0 only); a no-op elsewhere. A context manager: closing it on a full
  disk raises DiskFullError, unless the run is already ending with an error, which is then the one reported."""

  def __init__(self, logdir: str, enabled: bool):
    self._writer, self.logdir = None, logdir
    if enabled:
      from tensorboardX import SummaryWriter as TBWriter
      # tensorboardX opens its events file itself, named by the time and host: a random suffix makes the name
      # unpredictable, so no link can be planted there beforehand (hourglass_jax.runtime.files' rule for its own names).
      self._writer = TBWriter(logdir=logdir, flush_secs=10, filename_suffix=f".{secrets.token_hex(4)}")

  def scalars(self, step: int, values: dict) -> None:
    if self._writer:
      for name, value in values.items():
        self._writer.add_scalar(name, float(value), step)

  def text(self, step: int, name: str, value: str) -> None:
    """`value` shown as written: TensorBoard renders text summaries as Markdown."""
    if self._writer:
      self._writer.add_text(name, preformatted(value), step)

  def __enter__(self):
    return self

  def __exit__(self, error_type, *_):
    try:
      if self._writer:
        self._writer.close()
    except OSError as error:
      if error_type is not None:
        return  # the error ending the run is the one reported
      cause = disk_full(error)
      if not cause:
        raise
      fix = free_space(cause, "copy the workdir to a larger disk and point --workdir there")
      raise DiskFullError(f"disk full: writing the TensorBoard summaries under {self.logdir} failed ({cause}). "
                          f"{fix}, then rerun the same command to resume.") from error


def preformatted(text: str) -> str:
  """`text` as a Markdown code block (every line indented 4 spaces): TensorBoard then keeps its line breaks and
  indentation, and shows `*`, `#` or `_` as themselves."""
  return "\n".join("    " + line for line in text.split("\n"))
