"""Trains configs/dynamic.py presets one after another for the same steps on the same data (the embedded corpus by
default) and appends each run's validation bits per byte, evaluation boundary rates and step time, with the load
average before and after it, to benchmarks/results/dynamic_presets.json.

    .venv/bin/python benchmarks/dynamic_presets.py --presets whitespace,gumbel/whitespace,every2,every2 --steps 400
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--presets", default="whitespace,gumbel/whitespace,every2,every2",
                      help="configs/dynamic.py arguments, separated by '/'")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--name", default="dynamic_presets")
  parser.add_argument("--results", default=None)
  args = parser.parse_args(argv)
  from hourglass_jax.train.loop.loop import train_and_evaluate

  rows = {}
  for preset in args.presets.split("/"):
    cfg = common.load_config("dynamic", preset)
    cfg.train.update(steps=args.steps, eval_every=args.steps, sample_bytes=0, log_every=max(1, args.steps // 8))
    cfg.checkpoint.every_steps = 0
    load_before = common.loadavg()
    with tempfile.TemporaryDirectory() as workdir:
      summary = train_and_evaluate(cfg, workdir)
    rows[preset] = dict(hierarchy=cfg.model.hierarchy, steps=summary["step"],
                        valid_bits_per_byte=round(summary["eval"]["bits"], 4),
                        eval_metrics={k: round(v, 4) for k, v in summary["eval"]["metrics"].items()},
                        step_ms=round(summary["step_seconds"] * 1e3, 1), load_before=load_before,
                        load_after=common.loadavg(),
                        command=f"--config=configs/dynamic.py:{preset} --config.train.steps={args.steps}")
    print(preset, rows[preset], flush=True)
  record = dict(args=vars(args), data=cfg.data.name, rows=rows)
  print(f"results: {common.append_result(args.name, record, args.results)}")
  return record


if __name__ == "__main__":
  main()
