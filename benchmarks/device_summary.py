"""The device battery's results as markdown: one run's (summary_markdown) and the newest real run's in
results/device_*.json (latest_summary), which BENCHMARKS.md's GPU section is made from. No jax here."""

import json
import pathlib

from benchmarks.common import RESULTS


def summary_markdown(results) -> str:
  """The battery's figures as markdown (a record of results/device_*.json, or the whole list: its last record),
  for BENCHMARKS.md's GPU section."""
  record = results[-1] if isinstance(results, list) else results
  env = record.get("environment", {})
  versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
  command = "python benchmarks/device_check.py" + (" --dry-run" if record.get("dry_run") else "")
  lines = [f"Device: {env.get('device_kind', '?')} ({versions}); `{command}`, "
           f"{record.get('wall_s', '?')} s in all." + (" Dry run: tiny models, not figures." if record.get("dry_run")
                                                       else "")]
  if env:
    lines.append(f"bfloat16 matmul peak: {env['peak_measured_bf16'] / 1e12:.1f} TFLOP/s measured, "
                 f"{env['peak_nominal_bf16'] / 1e12:.1f} TFLOP/s nominal ({env['peak_nominal_source']}).")
  for title, tests in (("Smoke tests", record.get("tests")), ("Full GPU tests", record.get("full_tests"))):
    if tests:
      lines += _tests_lines(title, tests)
  train = record.get("train") or []
  if train:
    lines += ["", "| train step | batch x length | params | attention | compile s | GiB | s/step | bytes/s | "
              "MFU (measured peak) | MFU (nominal) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in train:
      cells = [r["name"], f"{r.get('batch', '-')} x {r.get('seq_len', '-')}",
               f"{r['params'] / 1e6:.3g}M" if r.get("params") else "-", r.get("attention", "-"),
               str(r.get("compile_s", "-")),
               f"{r['memory_bytes'] / 2**30:.1f}" if r.get("memory_bytes") else "-"]
      if "step_s" in r:
        cells += [f"{r['step_s']:.4f}", f"{r['bytes_per_s']:,.0f}", f"{r['mfu_measured_peak']:.1%}",
                  f"{r['mfu_nominal_peak']:.1%}"]
      else:
        cells += [r.get("skipped") or r.get("error", "-")[:80], "-", "-", "-"]
      lines.append("| " + " | ".join(cells) + " |")
    large = next((r for r in train if "aunet_bytes_per_s_scaled" in r and "bytes_per_s" in r), None)
    if large:
      lines.append(f"\n:large at {large['params'] / 1e6:.0f}M parameters: {large['bytes_per_s']:,.0f} bytes/s, "
                   f"against AU-Net's 225k bytes/s at 1B scaled by parameters to "
                   f"{large['aunet_bytes_per_s_scaled']:,.0f}.")
  for name, profile in (record.get("profile") or {}).items():
    kernels = ", ".join(f"{k['name']} {k['share']:.0%}" for k in profile["kernels"][:6])
    lines.append(f"\nProfile of one step, {name} ({profile['source']} time {profile['total_ms']:.1f} ms): {kernels}.")
  decode = record.get("decode") or []
  if decode:
    lines += ["", "| decoding batch | tokens | cache | compile s | tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['tokens']} | {r['cache']} | {r.get('compile_s', '-')} | {_rate(r)} |"
              for r in decode]
  speculative = record.get("speculative") or []
  if speculative:
    lines += ["", "| speculative decoding batch (n-gram draft) | tokens/s | tokens per pass, speed-up | pass / step |",
              "|---|---|---|---|"]
    lines += [f"| {r['batch']} | {_rate(r)} | {r.get('acceptance', '-')} | "
              f"{r['pass_over_step']:.2f} |" if "pass_over_step" in r else
              f"| {r['batch']} | {_rate(r)} | {r.get('acceptance', '-')} | - |" for r in speculative]
  return "\n".join(lines) + "\n"


def _rate(row: dict) -> str:
  """A decoding row's tokens/s, or why it has none."""
  return f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else (row.get("skipped") or row.get("error", "-"))[:90]


def _tests_lines(title: str, tests: dict) -> list[str]:
  counts = ", ".join(f"{n} {word}" for word, n in tests["counts"].items()) or "no summary"
  verdict = tests.get("verdict") or ("no verdict" if tests["timed_out"] else "failed" if tests["failures"] else
                                     "passed")
  lines = [f"\n{title} (`{tests['command']}`): {verdict}; {counts}" + (", timed out" if tests["timed_out"] else "")
           + (f"; failed: {', '.join(tests['failures'])}" if tests["failures"] else "") + "."]
  for group in tests.get("groups", []):
    state = group.get("skipped") or ("timed out" if group.get("timed_out") else
                                     ", ".join(f"{n} {w}" for w, n in group["counts"].items()))
    lines.append(f"- {group['name']}: {state}" + (f" in {group['seconds']} s" if "seconds" in group else ""))
  return lines


def latest_summary(results_dir=None) -> str:
  """The GPU section's markdown for a generated BENCHMARKS.md: summary_markdown of the newest device run in
  results/device_*.json (dry runs left out), or a line saying none is measured yet."""
  records = []
  for path in sorted(pathlib.Path(results_dir or RESULTS).glob("device_*.json")):
    runs = json.loads(path.read_text())
    records += [run for run in (runs if isinstance(runs, list) else [runs]) if not run.get("dry_run")]
  if not records:
    return ("Not yet measured on a GPU: `bash benchmarks/device_check.sh` (docs/gpu.md) writes "
            "benchmarks/results/device_<device>.json.\n")
  return summary_markdown(max(records, key=lambda run: run.get("time", "")))
