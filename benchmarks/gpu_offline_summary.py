"""benchmarks/gpu_offline.py's records as markdown: results/gpu_offline.md and BENCHMARKS.md's offline GPU section.

The step estimates are calibrated (benchmarks/gpu_calibration.py: roofline + a fitted cost per launch); the
before / after table sets the record labelled 'before' (the programs before the last round of changes, compiled by
the same script) against the newest one. No jax.
"""

import json
import pathlib

from benchmarks import gpu_calibration
from benchmarks.common import RESULTS

_CLASSES = ("matmul", "attention", "elementwise", "reduction", "copy")
PEAK_BF16 = 989.4e12  # H100 / H200 SXM dense bf16, the MFU's denominator (hlo_kernels.GPUS)
# The targets on an H100, calibrated estimate (ms, GB, launches; None: no target).
TARGETS = {"enwik8": dict(step_ms=115.0, gb=60.0, launches=2000), "large": dict(step_ms=132.0)}
H100_MEMORY_GIB = 80 * 10 ** 9 / 2 ** 30


def _name(row: dict) -> str:
  return row["preset"] or "enwik8"


def _gb(row: dict) -> float:
  return sum(c["bytes"] for c in row["estimate"]["h100"]["classes"].values()) / 1e9


def _host(row: dict) -> str:
  return f"{row['thunks']['host_launches']:,.0f}" if "thunks" in row else "-"


def calibrated_ms(row: dict, gpu: str, constants: dict | None) -> float | None:
  return gpu_calibration.estimate(row, gpu, constants) * 1e3 if constants else None


def _ms(value: float | None) -> str:
  return "-" if value is None else f"{value:.1f}"


def _mfu(row: dict, ms: float | None) -> str:
  return "-" if not ms else f"{row['model_flops'] / (ms / 1e3) / PEAK_BF16:.1%}"


def default_rows(record: dict) -> dict[str, dict]:
  """Per preset, the row of its own settings (variant 'preset'; a record without one: 'none', then any)."""
  rank = {"preset": 0, "none": 1}
  rows = sorted((r for r in record.get("rows", []) if "estimate" in r), key=lambda r: rank.get(r["variant"], 2))
  out = {}
  for row in rows:
    out.setdefault(_name(row), row)
  order = list(dict.fromkeys(_name(r) for r in record.get("rows", [])))
  return {name: out[name] for name in order if name in out}


def _other_fits(row: dict, fits: dict | None) -> str:
  """The row's H100 estimate by each alternative fit (host launches; scaled roofline), the estimate's spread."""
  if not fits or "thunks" not in row:
    return "-"
  return " / ".join(f"{gpu_calibration.estimate(row, 'h100', fit, model) * 1e3:.1f}"
                    for fit, model in zip(fits["alternatives"], gpu_calibration.ALTERNATIVES))


def calibration_markdown(fits: dict | None) -> list[str]:
  """The fitted constants and, per measured point, the estimate against the measured step (leave-one-out too)."""
  if not fits:
    return ["Not calibrated: `benchmarks/results/gpu_calibration.json` (the measured programs compiled offline, "
            "docs/gpu.md) is missing, so the estimates below are bare rooflines."]
  model = fits["model"]
  lines = [f"Calibration: step = {model['name']}, fitted to {len(model['points'])} steps one H200 measured "
           f"(their own code compiled offline for an H200): launch_s = {model['launch_s'] * 1e6:.2f} us; worst "
           f"leave-one-out error {model['worst_loo_error']:.1%}.", "",
           "| point (H200) | measured ms | roofline ms | launches | estimate ms (error) | leave-one-out ms (error) |",
           "|---|---|---|---|---|---|"]
  for p in model["points"]:
    lines.append(f"| {p['preset'] or 'enwik8'} | {p['measured_s'] * 1e3:.1f} | {p['roofline_s'] * 1e3:.1f} | "
                 f"{p['launches']:,.0f} | {p['estimate_s'] * 1e3:.1f} ({p['error']:+.1%}) | "
                 f"{p['loo_estimate_s'] * 1e3:.1f} ({p['loo_error']:+.1%}) |")
  lines += ["", "Fitted beside it (the last column of the rows below): " + "; ".join(
      f"{alt['name']}: " + (f"a = {alt['scale']:.2f}, " if alt["scale"] != 1.0 else "")
      + f"launch_s = {alt['launch_s'] * 1e6:.2f} us, worst leave-one-out error {alt['worst_loo_error']:.1%}"
      for alt in fits["alternatives"]) + "."]
  return lines


def before_after_markdown(before: dict | None, after: dict, constants: dict | None) -> list[str]:
  """Per preset: the before record's default program against the newest record's, on an H100."""
  if not before:
    return []
  old, new = default_rows(before), default_rows(after)
  lines = ["| preset | GB / step | launches (from the host) | H100 estimate ms | MFU | GiB | remat, unroll |",
           "|---|---|---|---|---|---|---|"]
  for name in [n for n in old if n in new]:
    a, b = old[name], new[name]
    ms_a, ms_b = calibrated_ms(a, "h100", constants), calibrated_ms(b, "h100", constants)
    lines.append(
        f"| {name} | {_gb(a):.1f} -> {_gb(b):.1f} | {a['kernels']['launches_per_step']:,.0f} ({_host(a)}) -> "
        f"{b['kernels']['launches_per_step']:,.0f} ({_host(b)}) | {_ms(ms_a)} -> {_ms(ms_b)} | "
        f"{_mfu(a, ms_a)} -> {_mfu(b, ms_b)} | {a['memory_bytes'] / 2**30:.1f} -> {b['memory_bytes'] / 2**30:.1f} | "
        f"{a.get('remat_policy', 'none')}, {a.get('scan_unroll', 1)} -> {b.get('remat_policy', 'none')}, "
        f"{b.get('scan_unroll', 1)} |")
  return lines


def targets_markdown(record: dict, constants: dict | None) -> list[str]:
  """The issue's targets against the newest record's default programs: met or missed, with the figure."""
  rows = default_rows(record)
  lines = []
  for name, target in TARGETS.items():
    row = rows.get(name)
    if not row:
      continue
    ms = calibrated_ms(row, "h100", constants)
    checks = [("step", ms, target.get("step_ms"), "ms"), ("HBM traffic", _gb(row), target.get("gb"), "GB"),
              ("launches", row["kernels"]["launches_per_step"], target.get("launches"), "")]
    lines += [f"- {name} {what} <= {limit:,.0f}{unit}: {value:,.1f}{unit} "
              f"({'met' if value <= limit else 'missed'})" for what, value, limit, unit in checks
              if limit is not None and value is not None]
  if "dynamic" in rows and "fixed" in rows:
    d, f = rows["dynamic"], rows["fixed"]
    ms_d, ms_f = calibrated_ms(d, "h100", constants), calibrated_ms(f, "h100", constants)
    if ms_d and ms_f:
      ratio = ms_d / ms_f
      lines.append(f"- dynamic within 1.1x of fixed, estimate: {ratio:.2f}x ({'met' if ratio <= 1.1 else 'missed'})")
    launches = d["kernels"]["launches_per_step"] / f["kernels"]["launches_per_step"]
    lines.append(f"- dynamic within 1.1x of fixed, launches: {launches:.2f}x "
                 f"({'met' if launches <= 1.1 else 'missed'})")
  fits = [r["memory_bytes"] / 2**30 for r in rows.values()]
  if fits:
    lines.append(f"- compiled memory fits one 80 GB H100: largest {max(fits):.1f} GiB of {H100_MEMORY_GIB:.1f} "
                 f"({'met' if max(fits) <= H100_MEMORY_GIB else 'missed'})")
  return lines


def summary_markdown(record: dict, results_dir=None) -> str:
  """results/gpu_offline.md: calibration, before / after, targets, every row of `record`, its top kernels."""
  fits = gpu_calibration.calibrate(results_dir)
  constants = fits["model"] if fits else None
  command = "python benchmarks/gpu_offline.py" + (" --dry-run" if record.get("dry_run") else "")
  flags = f" XLA_FLAGS=`{record['xla_flags']}`." if record.get("xla_flags") else ""
  lines = [f"Compiled for {record.get('device_kind', '?')} ({record.get('backend', '?')}, jax "
           f"{record.get('jax', '?')}); `{command}`; nothing ran on a GPU.{flags}"
           + (" Dry run: tiny models, not figures." if record.get("dry_run") else ""), ""]
  lines += calibration_markdown(fits)
  before = _labelled(results_dir, "before")
  table = before_after_markdown(before, record, constants)
  if table:
    lines += ["", "Before and after, each preset's default program on an H100 (MFU: the model's FLOPs over the "
              "estimate at 989 TFLOP/s):", ""] + table
  targets = targets_markdown(record, constants)
  if targets:
    lines += ["", "Targets (H100, calibrated estimate):", ""] + targets
  lines += ["", "| preset | remat | unroll | GiB | GB / step | launches (from the host) | roofline ms: "
            + ", ".join(_CLASSES) + " | H100 ms | H200 ms | MFU (H100) | H100 ms by the other fits |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
  for row in record.get("rows", []):
    if "error" in row:
      lines.append(f"| {_name(row)} | {row['variant']} | {row['error'][:100]} |  |  |  |  |  |  |  |  |")
      continue
    h100 = row["estimate"]["h100"]
    classes = " / ".join(f"{h100['classes'][k]['seconds'] * 1e3:.1f}" for k in _CLASSES)
    ms100, ms200 = calibrated_ms(row, "h100", constants), calibrated_ms(row, "h200", constants)
    lines.append(f"| {_name(row)} | {row.get('remat_policy', row['variant'])} | {row.get('scan_unroll', 1)} | "
                 f"{row['memory_bytes'] / 2**30:.1f} | {_gb(row):.1f} | {row['kernels']['launches_per_step']:,.0f} "
                 f"({_host(row)}) | {classes} | {_ms(ms100)} | {_ms(ms200)} | {_mfu(row, ms100)} | "
                 f"{_other_fits(row, fits)} |")
  first = next((r for r in record.get("rows", []) if "estimate" in r), None)
  if first:
    lines += ["", f"Top kernels of `{_name(first)}` (remat {first.get('remat_policy', first['variant'])}) by H100 "
              "time per step (roofline + the fitted launch cost):", "",
              "| class | kernel | source | launches | GB | ms |", "|---|---|---|---|---|---|"]
    for k in first["estimate"]["h100"]["top"]:
      lines.append(f"| {k['kind']} | {k['label']} | `{k['source'] or '-'}` | {k['launches']:.0f} | "
                   f"{k['bytes'] / 1e9:.2f} | {k['seconds'] * 1e3:.2f} |")
  return "\n".join(lines) + "\n"


def compact_markdown(record: dict, results_dir=None) -> str:
  """BENCHMARKS.md's view: the calibration line, before / after and the targets (results/gpu_offline.md has every
  row and the top kernels)."""
  fits = gpu_calibration.calibrate(results_dir)
  constants = fits["model"] if fits else None
  lines = [f"Compiled for {record.get('device_kind', '?')} ({record.get('backend', '?')}, jax "
           f"{record.get('jax', '?')}) by `python benchmarks/gpu_offline.py`: nothing ran on a GPU. Every column: "
           "`benchmarks/results/gpu_offline.md`; the changes and each miss: docs/gpu.md.", ""]
  lines += calibration_markdown(fits)[:1]
  table = before_after_markdown(_labelled(results_dir, "before"), record, constants)
  if table:
    lines += [""] + table
  targets = targets_markdown(record, constants)
  if targets:
    lines += ["", "Targets (H100, calibrated estimate):", ""] + targets
  return "\n".join(lines) + "\n"


def _records(results_dir) -> list[dict]:
  path = pathlib.Path(results_dir or RESULTS) / "gpu_offline.json"
  return [r for r in (json.loads(path.read_text()) if path.exists() else []) if not r.get("dry_run")]


def _labelled(results_dir, label: str) -> dict | None:
  """The newest record labelled `label` with rows in the current format (a roofline per GPU), or None."""
  current = [r for r in _records(results_dir) if r.get("label") == label
             and any("roofline_s" in row.get("estimate", {}).get("h100", {}) for row in r.get("rows", []))]
  return current[-1] if current else None


def latest_summary(results_dir=None) -> str:
  """The newest unlabelled record of results/gpu_offline.json as markdown, or a line saying there is none."""
  records = [r for r in _records(results_dir) if not r.get("label")
             and any("roofline_s" in row.get("estimate", {}).get("h100", {}) for row in r.get("rows", []))]
  if not records:
    return "Not yet estimated: `benchmarks/gpu_offline.py` (docs/gpu.md) writes benchmarks/results/gpu_offline.json.\n"
  return compact_markdown(records[-1], results_dir)
