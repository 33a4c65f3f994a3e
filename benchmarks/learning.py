"""Learning efficiency at equal compute: vanilla versus Hourglass trained for the same FLOP budget.

    .venv/bin/python benchmarks/learning.py [--quick] [--budget_tflop 0.5] [--seeds 0,1] [--corpus PATH]

Each model trains with `hourglass_jax.train.loop.loop.train_and_evaluate` for budget / (its analytic FLOPs per step)
steps, so the cheaper Hourglass takes more steps (widths d 64 / 4 heads / ff 256 by default, 0.5 TFLOP per run:
about 5 minutes a run on 2 cores at load ~10; dropout off for both), then reports validation bits per byte on the
whole valid split of the corpus: the embedded one (data.name=stdlib_text, the Python standard library's sources)
unless --corpus names a text file (split 90/5/5 in order; BENCHMARKS.md used tinyshakespeare.txt). Same data order,
learning rate, schedule shape, batch and length for both. Results: results/learning.json (appended; the corpus
recorded by file name, size and SHA-256, never its path) and results/learning_curves.png.
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import plots  # noqa: E402
from benchmarks.common import append_result, loadavg, parse_overrides, parse_with_quick, text_corpus  # noqa: E402
from benchmarks.models import bench_config  # noqa: E402
from benchmarks.steps import model_flops  # noqa: E402
from hourglass_jax.train.loop.loop import train_and_evaluate  # noqa: E402

QUICK = dict(budget_tflop=0.01, seeds="0", seq_len=64, batch=4, model="d_model=32,num_heads=4,d_ff=64")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--presets", default="vanilla,hourglass")
  parser.add_argument("--budget_tflop", type=float, default=0.5, help="training FLOPs per run (analytic)")
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--learning_rate", type=float, default=3e-3)
  parser.add_argument("--model", default="d_model=64,num_heads=4,d_ff=256",
                      help="model overrides of configs/default.py's widths (both models)")
  parser.add_argument("--corpus", default="", metavar="PATH",
                      help="a text file to train on (default: the embedded corpus, data.name=stdlib_text)")
  parser.add_argument("--results", default="")
  parser.add_argument("--name", default="learning")
  parser.add_argument("--no_plot", action="store_true")
  return parse_with_quick(parser, argv, QUICK)


def run_config(args, preset: str, seed: int):
  cfg = bench_config(preset, args.seq_len, args.batch, dropout=0.0, **parse_overrides(args.model))
  if args.corpus:
    cfg.data.update(name="text_file", path=args.corpus)
  else:
    cfg.data.update(name="stdlib_text")
  cfg.data.update(train_stride=max(1, args.seq_len // 4), eval_batches=0)
  steps = max(2, round(args.budget_tflop * 1e12 / model_flops(cfg)))
  cfg.train.update(steps=steps, seed=seed, learning_rate=args.learning_rate, schedule="cosine",
                   warmup_steps=max(1, steps // 20), log_every=max(1, steps // 20), eval_every=0,
                   peak_flops_per_device=0.0)
  return cfg


def describe_corpus(path: str) -> str:
  """The corpus as a user can reproduce it: the file's name, size and SHA-256 (not its path on this machine)."""
  if not path:
    return (f"the embedded corpus (data.name=stdlib_text: the Python {sys.version_info.major}.{sys.version_info.minor} "
            "standard library's sources)")
  corpus = text_corpus(path)
  return f"{corpus['name']} ({corpus['size']:,} bytes, sha256 {corpus['sha256']}, passed with --corpus)"


def main(argv=None) -> dict:
  args = parse_args(argv)
  corpus = describe_corpus(args.corpus)  # before training: a missing file fails here
  start, runs = time.perf_counter(), []
  for seed in map(int, args.seeds.split(",")):
    for preset in args.presets.split(","):  # alternate models, so drifting load hits both alike
      cfg = run_config(args, preset, seed)
      run_start = time.perf_counter()
      with tempfile.TemporaryDirectory() as workdir:
        summary = train_and_evaluate(cfg, workdir, log=lambda message: None)
      run = dict(preset=preset, seed=seed, steps=cfg.train.steps, flops_per_step=model_flops(cfg),
                 hierarchy=cfg.model.hierarchy, d_model=cfg.model.d_model,
                 valid_bits=summary["eval"]["bits"], valid_tokens=summary["eval"]["tokens"],
                 final_train_bits=summary["losses"][cfg.train.steps] / 0.6931471805599453,
                 losses={str(k): v / 0.6931471805599453 for k, v in summary["losses"].items()},
                 tokens_per_s=summary.get("tokens_per_second"), wall_s=round(time.perf_counter() - run_start, 1),
                 load=loadavg())
      runs.append(run)
      print(f"{preset:>10} seed {seed}: {run['steps']} steps x {run['flops_per_step'] / 1e9:.2f} GFLOP, valid "
            f"{run['valid_bits']:.4f} bits/byte (train {run['final_train_bits']:.4f}), {run['wall_s']} s, "
            f"load {run['load'][0]}", flush=True)
  means = {}
  for preset in args.presets.split(","):
    values = [r["valid_bits"] for r in runs if r["preset"] == preset]
    means[preset] = sum(values) / len(values)
  print("mean valid bits/byte at equal FLOPs: " + ", ".join(f"{p} {v:.4f}" for p, v in means.items()))
  record = dict(args=dict(vars(args), corpus=pathlib.Path(args.corpus).name), data=corpus, runs=runs,
                mean_valid_bits=means, wall_s=round(time.perf_counter() - start, 1))
  results = pathlib.Path(args.results) if args.results else None
  path = append_result(args.name, record, results)
  print(f"appended to {path}")
  if not args.no_plot:
    print(f"plot: {plots.loss_curves(runs, (results or path.parent) / f'{args.name}_curves.png')}")
  return record


if __name__ == "__main__":
  main()
