"""benchmarks/gpu_offline.py's record as markdown: the BENCHMARKS.md section of the offline GPU estimates. No jax."""

import json
import pathlib

from benchmarks.common import RESULTS

_CLASSES = ("matmul", "attention", "elementwise", "reduction", "copy")


def summary_markdown(record: dict) -> str:
  """Per preset and remat variant: memory, launches, XLA's cost analysis and the roofline per kernel class."""
  command = "python benchmarks/gpu_offline.py" + (" --dry-run" if record.get("dry_run") else "")
  lines = [f"Compiled for {record.get('device_kind', '?')} ({record.get('backend', '?')}, jax "
           f"{record.get('jax', '?')}); `{command}`; nothing ran on a GPU."
           + (" Dry run: tiny models, not figures." if record.get("dry_run") else ""),
           "", "| preset | remat | GiB | launches / step | XLA cost: TFLOP, GB | model TFLOP | H100 estimate ms: "
           + ", ".join(_CLASSES) + " | H100 ms | H200 ms | H200 measured ms (x estimate) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for row in record.get("rows", []):
    name = row["preset"] or "enwik8"
    if "error" in row:
      lines.append(f"| {name} | {row['variant']} | {row['error'][:100]} |  |  |  |  |  |  |  |")
      continue
    h100, h200 = row["estimate"]["h100"], row["estimate"]["h200"]
    cost = row["xla_cost"]
    classes = " / ".join(f"{h100['classes'][k]['seconds'] * 1e3:.1f}" for k in _CLASSES)
    measured = (f"{row['measured_h200_step_s'] * 1e3:.1f} ({row['measured_over_estimate_h200']:.2f}x)"
                if "measured_h200_step_s" in row else "-")
    lines.append(f"| {name} | {row['variant']} | {row['memory_bytes'] / 2**30:.1f} | "
                 f"{row['kernels']['launches_per_step']:,.0f} | "
                 + (f"{cost['flops'] / 1e12:.2f}, {cost['bytes accessed'] / 1e9:.1f}" if "flops" in cost else "-")
                 + f" | {row['model_flops'] / 1e12:.2f} | {classes} | {h100['step_s'] * 1e3:.1f} | "
                 f"{h200['step_s'] * 1e3:.1f} | {measured} |")
  first = next((r for r in record.get("rows", []) if "estimate" in r), None)
  if first:
    lines += ["", f"Top kernels of `{first['preset'] or 'enwik8'}` (remat {first['variant']}) by H100 roofline time "
              "per step:", "", "| class | kernel | source | launches | GB | ms |", "|---|---|---|---|---|---|"]
    for k in first["estimate"]["h100"]["top"]:
      lines.append(f"| {k['kind']} | {k['label']} | `{k['source'] or '-'}` | {k['launches']:.0f} | "
                   f"{k['bytes'] / 1e9:.2f} | {k['seconds'] * 1e3:.2f} |")
  return "\n".join(lines) + "\n"


def compact_markdown(record: dict) -> str:
  """BENCHMARKS.md's view of a record: per preset the memory and H100 estimate of each remat variant, the
  estimate's breakdown and the H200's measured step without remat, and the top five kernels of the first preset
  (results/gpu_offline.md has every column)."""
  rows = [r for r in record.get("rows", []) if "estimate" in r]
  presets = list(dict.fromkeys(r["preset"] or "enwik8" for r in rows))
  lines = [f"Compiled for {record.get('device_kind', '?')} ({record.get('backend', '?')}, jax {record.get('jax', '?')})"
           f" by `python benchmarks/gpu_offline.py`: nothing ran on a GPU. A roofline from published peaks (matmul "
           "FLOPs, bytes of the rest), a lower bound to rank changes by; every column in "
           "`benchmarks/results/gpu_offline.md`.", "",
           "| preset | GiB, remat none / dots / full | H100 ms, remat none / dots / full | remat none: "
           + ", ".join(_CLASSES) + " ms | H200 measured ms (x its estimate) |", "|---|---|---|---|---|"]
  for preset in presets:
    variants = {r["variant"]: r for r in rows if (r["preset"] or "enwik8") == preset}
    cell = lambda f: " / ".join(f(variants[v]) if v in variants else "-" for v in ("none", "dots", "full"))
    base = variants.get("none")
    classes = " / ".join(f"{base['estimate']['h100']['classes'][k]['seconds'] * 1e3:.1f}" for k in _CLASSES) \
        if base else "-"
    measured = (f"{base['measured_h200_step_s'] * 1e3:.1f} ({base['measured_over_estimate_h200']:.2f}x)"
                if base and "measured_h200_step_s" in base else "-")
    gib = cell(lambda r: f"{r['memory_bytes'] / 2**30:.1f}")
    ms = cell(lambda r: f"{r['estimate']['h100']['step_s'] * 1e3:.1f}")
    lines.append(f"| {preset} | {gib} | {ms} | {classes} | {measured} |")
  if rows:
    first = rows[0]
    lines += ["", f"Top kernels of `{first['preset'] or 'enwik8'}` (remat {first['variant']}), H100 estimate:", "",
              "| class | source | launches | GB | ms |", "|---|---|---|---|---|"]
    lines += [f"| {k['kind']} | `{k['source'] or k['label']}` | {k['launches']:.0f} | {k['bytes'] / 1e9:.2f} | "
              f"{k['seconds'] * 1e3:.2f} |" for k in first["estimate"]["h100"]["top"][:5]]
  return "\n".join(lines) + "\n"


def latest_summary(results_dir=None) -> str:
  """The newest non-dry record of results/gpu_offline.json as markdown, or a line saying there is none."""
  path = pathlib.Path(results_dir or RESULTS) / "gpu_offline.json"
  records = [r for r in (json.loads(path.read_text()) if path.exists() else []) if not r.get("dry_run")]
  if not records:
    return "Not yet estimated: `benchmarks/gpu_offline.py` (docs/gpu.md) writes benchmarks/results/gpu_offline.json.\n"
  return compact_markdown(records[-1])
