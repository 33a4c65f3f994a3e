"""The offline GPU step estimate calibrated against measured steps: the measured points, the model, its fit.

The roofline of a compiled step (benchmarks/hlo_kernels.py: every kernel at the slowest of its tensor-core FLOPs,
HBM bytes and vector work at published peaks) is a lower bound; the measured steps are longer by roughly a fixed
time per kernel launched. So the estimate is

    step_s = roofline_s + launch_s x launches          (MODEL, one constant fitted)

fitted by least squares on relative error to the steps one GPU measured (`POINTS`), whose programs are compiled
offline from the code that ran (`python benchmarks/gpu_offline.py --record gpu_calibration`, docs/gpu.md) and
recorded in results/gpu_calibration.json. `ALTERNATIVES` are fitted beside it and reported, with leave-one-out
errors, to show what the data can and cannot tell apart: with four points, at most two constants.

The points are an H200's; the targets are an H100's. The H200 is the H100's chip (132 SMs, the same clocks and
989 TFLOP/s bf16 peak) with 4.8 instead of 3.35 TB/s of HBM: the roofline takes each device's own bandwidth, and
the launch cost (host submission, graph launch, kernel ramp and tail) is assumed the same on both.
No jax here: it reads results files.
"""

import dataclasses
import json
import pathlib

from benchmarks.common import RESULTS


@dataclasses.dataclass(frozen=True)
class Point:
  """One measured train step: configs/gpu.py's `preset` (its batch), on `device`, in `step_s` seconds, by the
  project at `commit` (benchmarks/device_check.py; `source` is its record)."""
  preset: str
  device: str
  step_s: float
  commit: str = "d038ac8"
  source: str = "benchmarks/results/device_nvidia_h200.json"


# One NVIDIA H200, jax 0.11.2 + CUDA 13 (../shared/DEVICE.md): the enwik8 model with attention dropout 0.2 (flash
# kernel), :large, :dynamic (then segment_capacity 1.5) and :fixed.
POINTS = (Point("", "h200", 0.2171), Point("large", "h200", 0.2253), Point("dynamic", "h200", 0.0877),
          Point("fixed", "h200", 0.0745))

# What a launch is: every kernel the device runs (`kernels`), or what the host submits once command buffers have
# grouped runs of kernels into CUDA graphs (`host_launches`; thunk_census.py). On the measured programs the two
# are nearly proportional (host launches are 42-45% of kernels), so both fit as well: the estimate charges every
# kernel, the choice that gives no credit for command buffers the points cannot confirm; the host-launch fit is
# reported beside it as the optimistic reading.
MODEL = dict(name="roofline + launch_s x kernels", scale_roofline=False, launches="kernels")
ALTERNATIVES = (dict(name="roofline + launch_s x host launches", scale_roofline=False, launches="host_launches"),
                dict(name="a x roofline + launch_s x kernels", scale_roofline=True, launches="kernels"))


def _features(row: dict, gpu: str, launches: str) -> tuple[float, float]:
  if launches == "kernels":
    count = row["kernels"]["launches_per_step"]  # the HLO census's count, equal to the thunk sequence's
  else:
    count = row["thunks"][launches]
  return row["estimate"][gpu]["roofline_s"], float(count)


def _fit(samples: list[tuple[float, float, float]], scale_roofline: bool) -> tuple[float, float]:
  """(a, launch_s) minimising the squared relative error of a x roofline + launch_s x launches (a = 1 unless
  `scale_roofline`) over (roofline, launches, measured) samples."""
  if not scale_roofline:
    num = sum((n / t) * ((t - r) / t) for r, n, t in samples)
    den = sum((n / t) ** 2 for r, n, t in samples)
    return 1.0, num / den
  # normal equations of [r/t, n/t] [a, c]^T = 1
  srr = sum((r / t) ** 2 for r, n, t in samples)
  snn = sum((n / t) ** 2 for r, n, t in samples)
  srn = sum((r / t) * (n / t) for r, n, t in samples)
  sr, sn = sum(r / t for r, n, t in samples), sum(n / t for r, n, t in samples)
  det = srr * snn - srn * srn
  return (sr * snn - sn * srn) / det, (srr * sn - srn * sr) / det


def calibration_rows(results_dir=None) -> list[dict]:
  """The newest compiled row of each point's program (results/gpu_calibration.json), in POINTS' order; [] when
  the file is missing."""
  path = pathlib.Path(results_dir or RESULTS) / "gpu_calibration.json"
  if not path.exists():
    return []
  rows = {}
  for record in json.loads(path.read_text()):
    for row in record.get("rows", []):
      if "estimate" in row:
        rows[row["preset"]] = row
  return [dict(rows[p.preset], measured_s=p.step_s, device=p.device) for p in POINTS if p.preset in rows]


def fit(model: dict, rows: list[dict]) -> dict:
  """The model fitted to every row, and left out one at a time: constants, per row the estimate, the
  leave-one-out estimate and their relative errors."""
  samples = [(*_features(r, r["device"], model["launches"]), r["measured_s"]) for r in rows]
  a, launch_s = _fit(samples, model["scale_roofline"])
  points = []
  for i, (row, (r, n, t)) in enumerate(zip(rows, samples)):
    a_i, c_i = _fit(samples[:i] + samples[i + 1:], model["scale_roofline"])
    estimate, left_out = a * r + launch_s * n, a_i * r + c_i * n
    points.append(dict(preset=row["preset"], measured_s=t, roofline_s=r, launches=n, estimate_s=estimate,
                       error=estimate / t - 1, loo_estimate_s=left_out, loo_error=left_out / t - 1,
                       loo_launch_s=c_i, loo_scale=a_i))
  return dict(name=model["name"], scale=a, launch_s=launch_s, points=points,
              worst_loo_error=max(abs(p["loo_error"]) for p in points) if points else None)


def calibrate(results_dir=None) -> dict | None:
  """MODEL and ALTERNATIVES fitted to the recorded points ({'model': fit, 'alternatives': [fit, ...]}), or None
  without results/gpu_calibration.json or with fewer than three points."""
  rows = calibration_rows(results_dir)
  if len(rows) < 3:
    return None
  return dict(model=fit(MODEL, rows), alternatives=[fit(m, rows) for m in ALTERNATIVES])


def estimate(row: dict, gpu: str, constants: dict, model: dict = MODEL) -> float:
  """The calibrated step seconds of a gpu_offline row on `gpu` with `constants` (calibrate()['model'], or an
  alternative's fit with its `model`)."""
  roofline_s, launches = _features(row, gpu, model["launches"])
  return constants["scale"] * roofline_s + constants["launch_s"] * launches
