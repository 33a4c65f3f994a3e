"""Compile time of the train step: scanned stacks against the same model unrolled, deep against shallow, the
enwik8-shaped step, a second start from the persistent compilation cache, and the step time scanned vs unrolled.

    .venv/bin/python benchmarks/compile_time.py [--quick]

Every compile runs in a fresh process (nothing cached in memory; the persistent cache off unless the case is about
it), so each figure is a cold start. Results: benchmarks/results/compile_time.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from common import append_result, interleave, load_config, loadavg, median, parse_with_quick, paired_ratios

# The shape: L 2048, dropout 0.2, d 128, the paper's attention resampling; depth alone differs.
WIDTH = dict(d_model=128, num_heads=4, d_ff=512, shorten="attention_avg", upsample="attention_repeat", dropout=0.2)
DEEP, SHALLOW = "5@1 24@3 5@1", "1@1 1@3 1@1"


def _config(model: dict, seq_len: int, batch: int):
  cfg = load_config("default")
  cfg.model.update(model)
  cfg.data.update(name="synthetic", seq_len=seq_len, batch_size=batch)
  cfg.mesh.update(data=1)
  return cfg


def _case_config(case: dict):
  if case["config"] == "enwik8":
    cfg = load_config("enwik8")
    cfg.data.update(name="synthetic", batch_size=case["batch"])
    cfg.mesh.update(data=1)
    cfg.model.update(case.get("model", {}))
    return cfg
  return _config(dict(WIDTH, **case.get("model", {})), case["seq_len"], case["batch"])


def run_case(case: dict) -> dict:
  """In this (fresh) process: compile the case's train step and report the compile seconds."""
  import jax

  from hourglass_jax.runtime import compile_cache

  compile_cache.enable(case.get("cache_dir") or "off")
  before = compile_cache.counts()
  from steps import compile_step

  _, _, facts = compile_step(_case_config(case))
  span = compile_cache.counts() - before
  return dict(compile_s=facts["compile_s"], memory_gib=round((facts["memory_bytes"] or 0) / 2**30, 2),
              cache_hits=span.hits, saved_s=round(span.saved_seconds, 1))


def in_subprocess(case: dict) -> dict:
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env["JAX_PLATFORMS"] = "cpu"
  out = subprocess.run([sys.executable, __file__, "--case", json.dumps(case)], capture_output=True, text=True,
                       env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
  if out.returncode:
    raise RuntimeError(f"case {case} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def step_times(seq_len: int, batch: int, rounds: int) -> dict:
  """The deep model's step time scanned and unrolled, interleaved in this process."""
  from steps import StepRunner

  runners = {name: StepRunner(_config(dict(WIDTH, hierarchy=DEEP, scan_unroll=unroll), seq_len, batch))
             for name, unroll in (("scanned", 1), ("unrolled", 0))}
  for runner in runners.values():
    runner()  # warm-up
  result = interleave(runners, rounds)
  times = result["times"]
  return dict(scanned_s=round(median(times["scanned"]), 4), unrolled_s=round(median(times["unrolled"]), 4),
              scanned_over_unrolled=round(median(paired_ratios(times["scanned"], times["unrolled"])), 3),
              loads=[round(x, 2) for x in result["loads"]],
              compile_s={name: r.facts["compile_s"] for name, r in runners.items()})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--case", default="", help=argparse.SUPPRESS)
  parser.add_argument("--seq_len", type=int, default=2048)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=5, help="interleaved step-time rounds")
  parser.add_argument("--no_enwik8", action="store_true", help="skip the enwik8-shaped compile")
  parser.add_argument("--quick", action="store_true", help="short sequences, no enwik8 compile")
  parser.add_argument("--name", default="compile_time")
  args = parse_with_quick(parser, argv, dict(seq_len=256, rounds=2, no_enwik8=True))
  if args.case:
    print(json.dumps(run_case(json.loads(args.case))))
    return
  print(f"load average before: {loadavg()}", flush=True)
  record = dict(seq_len=args.seq_len, batch=args.batch, width=WIDTH, cases={})
  shape = dict(config="width", seq_len=args.seq_len, batch=args.batch)
  cases = {
      "shallow_scanned": dict(shape, model=dict(hierarchy=SHALLOW)),
      "deep_scanned": dict(shape, model=dict(hierarchy=DEEP)),
      "shallow_unrolled": dict(shape, model=dict(hierarchy=SHALLOW, scan_unroll=0)),
      "deep_unrolled": dict(shape, model=dict(hierarchy=DEEP, scan_unroll=0)),
  }
  if not args.no_enwik8:
    cases["enwik8_scanned"] = dict(config="enwik8", batch=1)
  for name, case in cases.items():
    start = time.perf_counter()
    record["cases"][name] = in_subprocess(case) | dict(load=loadavg()[0])
    print(f"{name:18s} compile {record['cases'][name]['compile_s']:7.1f} s  (process "
          f"{time.perf_counter() - start:.0f} s, load {loadavg()[0]})", flush=True)
  with tempfile.TemporaryDirectory() as cache_dir:
    cached = dict(cases["deep_scanned"], cache_dir=cache_dir)
    first, second = in_subprocess(cached), in_subprocess(cached)
  record["cache"] = dict(first_s=first["compile_s"], second_s=second["compile_s"], second_hits=second["cache_hits"],
                         saved_s=second["saved_s"],
                         second_over_first=round(second["compile_s"] / first["compile_s"], 3))
  print(f"persistent cache: first start {first['compile_s']} s, second start {second['compile_s']} s "
        f"({100 * record['cache']['second_over_first']:.1f}%; {second['cache_hits']} hit(s), jax reports "
        f"{second['saved_s']} s saved)", flush=True)
  c = record["cases"]
  record["deep_over_shallow"] = dict(
      scanned=round(c["deep_scanned"]["compile_s"] / c["shallow_scanned"]["compile_s"], 2),
      unrolled=round(c["deep_unrolled"]["compile_s"] / c["shallow_unrolled"]["compile_s"], 2))
  print(f"deep / shallow compile: scanned {record['deep_over_shallow']['scanned']}x, unrolled "
        f"{record['deep_over_shallow']['unrolled']}x", flush=True)
  record["step"] = step_times(args.seq_len, args.batch, args.rounds)
  print(f"deep step: scanned {record['step']['scanned_s']} s, unrolled {record['step']['unrolled_s']} s, "
        f"ratio {record['step']['scanned_over_unrolled']} (loads {record['step']['loads']})", flush=True)
  path = append_result(args.name, record)
  print(f"appended to {path}")


if __name__ == "__main__":
  main()
