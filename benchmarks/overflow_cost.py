"""What a learned level's segment overflow costs: one shortening-study run, evaluated again with more segment slots.

    .venv/bin/python benchmarks/overflow_cost.py [--corpus PATH] [--model dynamic_routing] [--budget_tflop 16]
        [--seed 0] [--learning_rate 3e-3] [--capacities 1.0,1.25,1.5,2.0] [--quick]

Trains `--model` as benchmarks/shortening_study.py does (its widths, batch and length, at the first of --capacities),
then evaluates the same parameters on the whole validation split at each capacity. `model.segment_capacity` only sets
the number of segment slots; no parameter depends on it. A row with more boundaries than slots puts its last positions
in the merged tail, where they read the last completed segment (docs/models.md), so the change in bits per byte is
what that overflow costs the trained model. Results: results/overflow_cost.json (appended).
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import shortening_study as study  # noqa: E402
from benchmarks.common import append_result, loadavg  # noqa: E402
from hourglass_jax.train.evaluate import evaluate_checkpoint  # noqa: E402
from hourglass_jax import memory_maps  # noqa: E402
from hourglass_jax.train.loop import train_and_evaluate  # noqa: E402

QUICK_BUDGET_TFLOP = 0.004


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--corpus", default="", help="a text file (default: the embedded corpus)")
  parser.add_argument("--model", default="dynamic_routing",
                      choices=[m for m in study.MODELS if m.startswith("dynamic_")])
  parser.add_argument("--budget_tflop", type=float, default=16.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--learning_rate", type=float, default=3e-3)
  parser.add_argument("--capacities", default="1.0,1.25,1.5,2.0", help="the first is the one it trains at")
  parser.add_argument("--quick", action="store_true", help=f"the study's --quick model, {QUICK_BUDGET_TFLOP} TFLOP")
  parser.add_argument("--results", default="")
  parser.add_argument("--name", default="overflow_cost")
  return parser.parse_args(argv)


def main(argv=None) -> dict:
  args = parse_args(argv)
  capacities = study.floats(args.capacities)
  study_args = study.parse_args((["--corpus", args.corpus] if args.corpus else []) + (["--quick"] if args.quick else []))
  budget = QUICK_BUDGET_TFLOP if args.quick else args.budget_tflop
  corpus = study.corpus_facts(study_args.corpus)  # a missing file fails here, before training
  study_args.segment_capacity = capacities[0]
  cfg = study.study_config(study_args, args.model, budget, args.seed, args.learning_rate)
  start = time.perf_counter()
  print(f"training {args.model} on {corpus['id']}: {budget:g} TFLOP, {cfg.train.steps} steps, capacity "
        f"{capacities[0]:g}", flush=True)
  evaluations = []
  with tempfile.TemporaryDirectory() as workdir:
    result = train_and_evaluate(cfg, workdir, log=lambda message: None)["eval"]  # at the first capacity
    cfg.checkpoint.allow_settings_change = True  # only the number of slots changes
    for slots in capacities:
      if evaluations:
        memory_maps.release_programs()  # one evaluation program per capacity: drop the previous one's maps
        cfg.model.segment_capacity = slots
        result = evaluate_checkpoint(cfg, workdir, log=lambda message: None)
      run = dict(eval_metrics=result["metrics"])
      evaluations.append(dict(segment_capacity=slots, valid_bits=result["bits"],
                              segment_overflow=float(study.eval_metric(run, "segment_overflow")),
                              boundary_rate=float(study.eval_metric(run, "boundary_rate"))))
      print(f"  capacity {slots:g}: {result['bits']:.4f} bits/byte, overflow {evaluations[-1]['segment_overflow']:.4f}",
            flush=True)
  record = dict(corpus_id=corpus["id"], corpus=corpus["description"], model=args.model, budget_tflop=budget,
                seed=args.seed, learning_rate=args.learning_rate, steps=cfg.train.steps, widths=study_args.model,
                batch=study_args.batch, seq_len=study_args.seq_len, evaluations=evaluations, load=loadavg(),
                wall_s=round(time.perf_counter() - start, 1))
  path = append_result(args.name, record, pathlib.Path(args.results) if args.results else None)
  print(f"appended to {path}")
  return record


if __name__ == "__main__":
  main()
