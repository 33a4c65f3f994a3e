"""Training throughput, MFU and cost curves: the real train step of each model at each length and dtype.

    .venv/bin/python benchmarks/throughput.py [--quick] [--presets vanilla,hourglass,topdown]
        [--lengths 512,1024,2048,4096,8192] [--dtypes float32,bfloat16] [--model dropout=0.0] [--budget_s 900]

For each (model, length, dtype): compile `Trainer.compile_train_step()` (batch 1), record the analytic model FLOPs
(hourglass_jax.model.counting, 3 x forward), XLA's FLOPs (cost_analysis) and the compiled step's memory
(memory_analysis: arguments + outputs - donated + temporaries); then time every step that fits `--memory_gib`
in interleaved rounds together with float32 and bfloat16 matmul probes, so MFU is relative to a peak measured
under the same load. A step slower than `--max_step_s` is timed once and left out of further rounds.
Presets are in benchmarks/models.py (`--presets hourglass_enwik8 --lengths 2049`: the enwik8-shaped model).
Results: results/throughput.json (appended) and results/cost_curves.png.
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import plots  # noqa: E402
from benchmarks.common import (append_result, available_bytes, interleave, loadavg, median,  # noqa: E402
                               parse_overrides, parse_with_quick)
from benchmarks.matmul_peak import MatmulProbe  # noqa: E402
from benchmarks.models import bench_config  # noqa: E402
from benchmarks.steps import StepRunner, compile_step  # noqa: E402

# About a minute on 2 busy cores (compiles dominate; the persistent cache in .jax_cache makes reruns faster).
QUICK = dict(presets="vanilla,hourglass", lengths="256", dtypes="float32", rounds=3, budget_s=20,
             model="d_model=32,num_heads=4,d_ff=64,dropout=0.0")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny settings that finish in about a minute")
  parser.add_argument("--presets", default="vanilla,hourglass,topdown@float32",
                      help="benchmarks/models.py names; name@dtype limits one to that dtype")
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--model", default="", help="model overrides for every case, e.g. dropout=0.0 or "
                      "remat_policy=nothing_saveable")
  parser.add_argument("--train", default="", help="train overrides for every case, e.g. grad_accum_steps=2")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--budget_s", type=float, default=900.0, help="wall-time bound of the timed rounds")
  parser.add_argument("--max_step_s", type=float, default=60.0)
  parser.add_argument("--memory_gib", type=float, default=10.0, help="time only steps that need less memory")
  parser.add_argument("--results", default="", help="results folder (default benchmarks/results)")
  parser.add_argument("--name", default="throughput")
  parser.add_argument("--no_plot", action="store_true")
  parser.add_argument("--probe_size", type=int, default=1024,
                      help="side of the square matmul that measures the peak (8192 on a GPU: 1024 is launch-bound)")
  return parse_with_quick(parser, argv, QUICK)


def cases(args) -> list[tuple[str, int, str]]:
  """(preset, length, dtype) for every combination; a preset written `name@dtype` runs in that dtype only."""
  out = []
  for preset in args.presets.split(","):
    name, _, only = preset.partition("@")
    out += [(name, int(n), d) for n in args.lengths.split(",") for d in (only or args.dtypes).split(",")]
  return out


def compile_all(args) -> dict:
  """{case: (compile_step result, row)}; rows hold the compile-time facts."""
  compiled = {}
  for preset, length, dtype in cases(args):
    cfg = bench_config(preset, length, args.batch, dtype, **parse_overrides(args.model))
    cfg.train.update(parse_overrides(args.train))
    result = compile_step(cfg)
    row = dict(preset=preset, seq_len=length, dtype=dtype, batch=args.batch, **result[2])
    print(f"compiled {preset:>16} L={length:<5} {dtype:>8}: {row['model_flops'] / 1e9:9.2f} model GFLOP, "
          f"{row['xla_flops'] / 1e9:9.2f} XLA GFLOP, {row['memory_bytes'] / 2**20:9.1f} MiB, "
          f"compile {row['compile_s']} s, load {loadavg()[0]}", flush=True)
    compiled[(preset, length, dtype)] = (cfg, result, row)
  return compiled


def time_all(args, compiled: dict) -> tuple[dict, dict]:
  """Interleaved rounds of every step that fits, plus the matmul probes; fills each row's timings."""
  probes = {f"peak_{dtype}": MatmulProbe(args.probe_size, dtype) for dtype in ("float32", "bfloat16")}
  runners = {}
  for key, (cfg, result, row) in compiled.items():
    if row["memory_bytes"] > args.memory_gib * 2**30:
      row["skipped"] = f"needs {row['memory_bytes'] / 2**30:.1f} GiB > --memory_gib {args.memory_gib}"
      continue
    free = available_bytes()
    if free is not None and row["memory_bytes"] > free - 2**30:  # the machine is shared: never push it to OOM
      row["skipped"] = f"needs {row['memory_bytes'] / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available"
      continue
    runner = StepRunner(cfg, result)
    start = time.perf_counter()
    runner()  # the first call allocates; not counted
    row["first_step_s"] = time.perf_counter() - start
    if row["first_step_s"] > args.max_step_s:
      start = time.perf_counter()
      runner()
      row["step_times"] = [time.perf_counter() - start]
      runner.close()
      continue
    runners[key] = runner
  calls = dict(probes)
  calls.update({key: runner for key, runner in runners.items()})
  timed = interleave(calls, args.rounds, args.budget_s)
  for key in runners:
    compiled[key][2]["step_times"] = timed["times"][key]
    runners[key].close()
  peaks = {name.removeprefix("peak_"): probe.best for name, probe in probes.items()}
  return peaks, dict(loads=timed["loads"], rounds=len(timed["loads"]))


def finish_row(row: dict, peaks: dict) -> dict:
  times = row.get("step_times")
  if not times:
    return row
  step = median(times)
  tokens = row["batch"] * row["seq_len"]
  row.update(step_s=step, tokens_per_s=tokens / step, mfu_vs_f32=row["model_flops"] / step / peaks["float32"],
             mfu_vs_dtype_peak=row["model_flops"] / step / peaks[row["dtype"]],
             xla_flops_per_s=row["xla_flops"] / step)
  return row


def speedups(rows: list[dict]) -> list[dict]:
  """Hourglass (and top-down) vs vanilla at each length and dtype: measured and FLOP-predicted speedups."""
  index = {(r["preset"], r["seq_len"], r["dtype"]): r for r in rows}
  out = []
  for (preset, length, dtype), r in index.items():
    base = index.get(("vanilla", length, dtype))
    if preset == "vanilla" or not base or preset.endswith("enwik8"):
      continue
    entry = dict(preset=preset, seq_len=length, dtype=dtype,
                 flop_speedup=base["model_flops"] / r["model_flops"],
                 xla_flop_speedup=base["xla_flops"] / r["xla_flops"],
                 memory_ratio=r["memory_bytes"] / base["memory_bytes"])
    if r.get("step_s") and base.get("step_s"):
      entry["step_speedup"] = base["step_s"] / r["step_s"]
      entry["fraction_of_predicted"] = entry["step_speedup"] / entry["flop_speedup"]
    out.append(entry)
  return out


def print_table(args, rows: list[dict], peaks: dict) -> None:
  print(f"\nmeasured peaks ({args.probe_size}^3 matmul, best in the timed rounds): "
        f"float32 {peaks['float32'] / 1e9:.1f} GFLOP/s, bfloat16 {peaks['bfloat16'] / 1e9:.1f} GFLOP/s")
  print(f"{'model':>16} {'L':>5} {'dtype':>8} {'params':>10} {'model GF':>9} {'XLA GF':>9} {'MiB':>8} "
        f"{'step s':>8} {'tok/s':>8} {'MFU f32':>8} {'MFU dt':>7}")
  for r in rows:
    timed = "step_s" in r
    print(f"{r['preset']:>16} {r['seq_len']:>5} {r['dtype']:>8} {r['params']:>10,} {r['model_flops'] / 1e9:>9.2f} "
          f"{r['xla_flops'] / 1e9:>9.2f} {r['memory_bytes'] / 2**20:>8.1f} "
          + (f"{r['step_s']:>8.3f} {r['tokens_per_s']:>8.0f} {r['mfu_vs_f32']:>8.1%} {r['mfu_vs_dtype_peak']:>7.1%}"
             if timed else f"{'-':>8} {'-':>8} {'-':>8} {'-':>7}  {r.get('skipped', '')}"))


def main(argv=None) -> dict:
  args = parse_args(argv)
  start, load_start = time.perf_counter(), loadavg()
  compiled = compile_all(args)
  peaks, timing = time_all(args, compiled)
  rows = [finish_row(row, peaks) for _, _, row in compiled.values()]
  ratios = speedups(rows)
  print_table(args, rows, peaks)
  for s in ratios:
    measured = f"{s['step_speedup']:.2f}x measured ({s['fraction_of_predicted']:.0%} of predicted)" \
        if "step_speedup" in s else "not timed"
    print(f"{s['preset']} vs vanilla at L={s['seq_len']} {s['dtype']}: FLOP-predicted {s['flop_speedup']:.2f}x, "
          f"{measured}; memory ratio {s['memory_ratio']:.2f}")
  record = dict(args=vars(args), peaks=peaks, load_start=load_start, load_end=loadavg(), timing=timing,
                rows=rows, speedups=ratios, wall_s=round(time.perf_counter() - start, 1))
  results = pathlib.Path(args.results) if args.results else None
  path = append_result(args.name, record, results)
  print(f"appended to {path}")
  if not args.no_plot:
    print(f"plot: {plots.cost_curves(rows, (results or path.parent) / f'{args.name}_cost_curves.png')}")
  return record


if __name__ == "__main__":
  main()
