"""The whole train step with dense kernel gradients taken as (x^T) dy (the library) against lax.dot_general's own
transpose rule, timed interleaved in one process on CPU.

    .venv/bin/python benchmarks/dense_kernel_gradient.py [--quick] [--preset hourglass] [--shape wide]
        [--seq_len 1024] [--batch 4] [--dtype float32] [--model key=value,...] [--rounds 5]

--shape wide (the default): the peer comparison's 'wide' Hourglass (models.PEER_WIDE, no dropout) on top of the
preset; --shape preset: the preset as it is. --model overrides either. Per variant: median step seconds, and the
count of 2-D matmuls in the compiled step that contract their left operand's first axis (the form XLA:CPU runs as
Eigen dots). Results: results/dense_kernel_gradient.json.
"""

import argparse
import pathlib
import sys

from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import finish_record, interleave, loadavg, median, paired_ratios, parse_overrides  # noqa: E402
from benchmarks.common import parse_with_quick  # noqa: E402
from benchmarks.models import PEER_WIDE, bench_config  # noqa: E402
from benchmarks.steps import StepRunner  # noqa: E402
from hourglass_jax.model import layers  # noqa: E402

QUICK = dict(seq_len=48, batch=2, model="d_model=32,num_heads=4,d_ff=64,hierarchy=1@1 1@4 1@1,dropout=0.0", rounds=1)
TRANSPOSED_LHS = "lhs_contracting_dims={0}, rhs"  # a 2-D dot contracting its left operand's first axis


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--preset", default="hourglass")
  parser.add_argument("--seq_len", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--shape", default="wide", choices=("wide", "preset"))
  parser.add_argument("--model", default="", help="model overrides, key=value,...")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--results", default="")
  parser.add_argument("--name", default="dense_kernel_gradient")
  return parse_with_quick(parser, argv, QUICK)


def build(args, dot_general) -> StepRunner:
  """The step compiled with `dot_general` as every dense layer's matmul (layers.dense reads it at trace time)."""
  library = layers.dense_dot_general
  layers.dense_dot_general = dot_general
  model = {**(dict(PEER_WIDE, dropout=0.0) if args.shape == "wide" else {}), **parse_overrides(args.model)}
  try:
    return StepRunner(bench_config(args.preset, args.seq_len, args.batch, args.dtype, **model))
  finally:
    layers.dense_dot_general = library


def main(argv=None) -> dict:
  args = parse_args(argv)
  load_before = loadavg()
  runners = {"lax_transpose_rule": build(args, lax.dot_general), "library": build(args, layers.dense_dot_general)}
  for runner in runners.values():
    runner()  # warm-up
  timed = interleave(runners, args.rounds)
  rows = {}
  for name, runner in runners.items():
    hlo = runner.compiled.as_text()
    rows[name] = dict(step_s=median(timed["times"][name]), steps_s=timed["times"][name],
                      transposed_lhs_dots=hlo.count(TRANSPOSED_LHS), model_flops=runner.facts["model_flops"])
    print(f"{name:20s} step {rows[name]['step_s']:.3f} s, {rows[name]['transposed_lhs_dots']} dots contracting "
          f"their left operand's first axis")
  ratios = paired_ratios(timed["times"]["lax_transpose_rule"], timed["times"]["library"])
  rows["speedup"] = dict(median=median(ratios), per_round=ratios)
  print(f"library speedup: {median(ratios):.3f}x (rounds {', '.join(f'{r:.3f}' for r in ratios)}), load {loadavg()}")
  return finish_record(args, load_before, timed, rows)


if __name__ == "__main__":
  main()
