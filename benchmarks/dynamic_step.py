"""Train-step time of a dynamic (learned) shortening level against a fixed one at the same target rate.

configs/dynamic.py's model (2@1 4@4 2@1, d 128, batch 16 x 256) with shorten='avg' / upsample='repeat' (fixed, k=4)
against the same model with shorten='dynamic' and each predictor; the dynamic center runs over
max_segments = capacity x L/k + 1 positions, so capacity sets most of the difference. Steps run interleaved
(one of each per round) and the ratios are paired per round. Time on a quiet machine (load < 1.5). Usage:

    .venv/bin/python -m benchmarks.dynamic_step [--rounds 8] [--capacities 1.5,1.0] [--quick]
"""

import argparse

from benchmarks.common import (finish_record, interleave, load_config, loadavg, median, paired_ratios,
                               parse_overrides, parse_with_quick)
from benchmarks.steps import StepRunner
from hourglass_jax.model.config import without_dynamic_settings
from hourglass_jax.model.hourglass import BOUNDARY_PREDICTORS


def variants(args) -> dict:
  """{name: config}: the fixed baseline, then each predictor at each capacity."""
  def config(predictor: str, **model):
    cfg = load_config("dynamic", predictor)
    cfg.model.update(parse_overrides(args.model), **model)
    cfg.data.update(name="synthetic", seq_len=args.seq_len, batch_size=args.batch)
    return cfg

  fixed = config("gumbel")
  fixed.model.update(without_dynamic_settings(dict(fixed.model)), shorten="avg", upsample="repeat")
  configs = {"fixed_avg_k4": fixed}
  for predictor in BOUNDARY_PREDICTORS:
    for capacity in (float(c) for c in args.capacities.split(",")):
      configs[f"dynamic_{predictor}_capacity{capacity:g}"] = config(predictor, segment_capacity=capacity)
  return configs


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=8)
  parser.add_argument("--capacities", default="1.5,1.0")
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--model", default="", help="model overrides, e.g. 'd_model=64,num_heads=4'")
  parser.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
  parser.add_argument("--quick", action="store_true", help="2 rounds, capacity 1.5 only")
  parser.add_argument("--name", default="dynamic_step")
  args = parse_with_quick(parser, argv, dict(rounds=2, capacities="1.5"))
  load_before = loadavg()
  runners = {}
  for name, cfg in variants(args).items():
    runners[name] = StepRunner(cfg)
    runners[name]()  # warm up: the first call pays for allocation
    print(f"{name}: compiled in {runners[name].facts['compile_s']} s", flush=True)
  timed = interleave(runners, args.rounds)
  base = timed["times"]["fixed_avg_k4"]
  rows = {}
  for name, seconds in timed["times"].items():
    rows[name] = dict(median_step_s=round(median(seconds), 4),
                      vs_fixed=round(median(paired_ratios(seconds, base)), 3),
                      model_flops=runners[name].facts["model_flops"])
    print(f"{name:<36} {rows[name]['median_step_s'] * 1e3:8.1f} ms/step  {rows[name]['vs_fixed']:.3f}x fixed")
  return finish_record(args, load_before, timed, rows)


if __name__ == "__main__":
  main()
