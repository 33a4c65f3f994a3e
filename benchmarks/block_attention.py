"""Block attention vs XLA attention: forward + backward of enwik8-shaped attention (8 heads of 64) under the masks
the models use, timed interleaved in one process.

    .venv/bin/python benchmarks/block_attention.py [--quick] [--cases causal_1024,shorten_2046] [--batches 1,4]
        [--dtypes float32,bfloat16] [--blocks 64,128,256] [--dropout 0.0,0.2] [--rounds 3]

Cases: causal_L (T = S = L), shorten_L (T = L/3, S = L: the Hourglass attention shortening), upsample_L (T = L,
S = L/3), none_L (no mask). Baseline: impl='xla' (jax.nn.dot_product_attention), or the einsum reference where
dropout is on (what the dispatcher runs). Block: block_attention with square blocks of each size. Per row: median
seconds of value-and-grad (q, k, v), speedup over the baseline, the fraction of the T x S square the block plan
computes, compile seconds and XLA's temporary memory. Results: results/block_attention.json.
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import append_result, interleave, loadavg, median, parse_with_quick  # noqa: E402
from hourglass_jax.model.layers import causal_mask  # noqa: E402
from hourglass_jax.model.resampling import shorten_mask, upsample_mask  # noqa: E402
from hourglass_jax.ops.attention import dot_product_attention  # noqa: E402
from hourglass_jax.ops.block_attention import block_attention, make_plan  # noqa: E402

QUIET_LOAD = 1.5


def case_shapes(case: str):
  """'causal_2048' -> (T, S, mask)."""
  kind, length = case.rsplit("_", 1)
  length = int(length)
  if kind == "causal":
    return length, length, causal_mask(length)
  if kind == "shorten":
    return length // 3, length, shorten_mask(length, 3)
  if kind == "upsample":
    return length, length // 3, upsample_mask(length, 3)
  if kind == "none":
    return length, length, None
  raise ValueError(f"unknown case {case!r}")


class Candidate:
  """Compiled value-and-grad of sum(attention(q, k, v)) w.r.t. q, k, v on fixed inputs."""

  def __init__(self, attend, inputs):
    loss = lambda q, k, v: jnp.sum(attend(q, k, v).astype(jnp.float32))
    start = time.perf_counter()
    self.compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*inputs).compile()
    self.compile_s = time.perf_counter() - start
    memory = self.compiled.memory_analysis()
    self.temp_bytes = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
    self.inputs = inputs
    self()

  def __call__(self):
    jax.block_until_ready(self.compiled(*self.inputs))


def run_config(args, case, batch, dtype, dropout):
  """Times the baseline and every block size on one (case, batch, dtype, dropout); returns table rows."""
  t, s, mask = case_shapes(case)
  rng = np.random.default_rng(0)
  shape = lambda length: (batch, length, args.heads, args.head_dim)
  inputs = tuple(jnp.asarray(rng.normal(size=shape(n)), dtype) for n in (t, s, s))
  key = jax.random.key(0)
  common = dict(dropout_rate=dropout, dropout_rng=key if dropout else None)
  baseline = "reference" if dropout else "xla"
  candidates = {baseline: Candidate(lambda q, k, v: dot_product_attention(q, k, v, mask, impl="xla", **common),
                                    inputs)}
  for block in args.blocks:
    attend = lambda q, k, v, block=block: block_attention(q, k, v, mask, block_q=block, block_k=block, **common)
    candidates[f"block{block}"] = Candidate(attend, inputs)
  timed = interleave(candidates, args.rounds, args.budget_s)
  base = median(timed["times"][baseline])
  rows = []
  for name, cand in candidates.items():
    step_s = median(timed["times"][name])
    fraction = 1.0
    if name != baseline:
      plan = make_plan(mask, t, s, int(name[5:]), int(name[5:]))
      fraction = plan.num_pairs * plan.bq * plan.bk / (t * s)
    rows.append(dict(case=case, t=t, s=s, batch=batch, dtype=dtype, dropout=dropout, impl=name, step_s=step_s,
                     speedup=base / step_s, computed_fraction=fraction, compile_s=cand.compile_s,
                     temp_bytes=cand.temp_bytes, times=timed["times"][name], loads=timed["loads"]))
  return rows


def print_rows(rows):
  print(f"{'case':>14} {'B':>2} {'dtype':>8} {'drop':>4} {'impl':>9} {'ms':>9} {'speedup':>7} {'square':>6} "
        f"{'compile':>7} {'temp MiB':>8}")
  for r in rows:
    temp = f"{r['temp_bytes'] / 2**20:8.0f}" if r["temp_bytes"] is not None else f"{'?':>8}"
    print(f"{r['case']:>14} {r['batch']:>2} {r['dtype']:>8} {r['dropout']:>4} {r['impl']:>9} "
          f"{r['step_s'] * 1e3:9.1f} {r['speedup']:7.2f} {r['computed_fraction']:6.2f} {r['compile_s']:7.1f} {temp}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--cases", default="causal_1024,causal_2048,shorten_2046,upsample_2046")
  parser.add_argument("--batches", default="1,4")
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--dropout", default="0.0,0.2")
  parser.add_argument("--blocks", default="64,128,256")
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--budget_s", type=float, default=120.0, help="timing budget per configuration")
  parser.add_argument("--results", default="")
  parser.add_argument("--name", default="block_attention")
  args = parse_with_quick(parser, argv, dict(cases="causal_1024", batches="1", dtypes="float32", dropout="0.0",
                                             blocks="128,256", rounds=2))
  args.blocks = [int(b) for b in args.blocks.split(",")]
  load_start = loadavg()
  print(f"load average {load_start}" + (f" > {QUIET_LOAD}: the CPU is shared, timings are noisy; rerun on a quiet "
                                        f"machine for figures to quote" if load_start[0] > QUIET_LOAD else ""))
  rows = []
  for case in args.cases.split(","):
    for batch in map(int, args.batches.split(",")):
      for dtype in args.dtypes.split(","):
        for dropout in map(float, args.dropout.split(",")):
          new = run_config(args, case, batch, dtype, dropout)
          print_rows(new)
          rows += new
  print(f"\nall (load average {load_start} at start, {loadavg()} at end):")
  print_rows(rows)
  record = dict(args={**vars(args), "blocks": args.blocks}, load_start=load_start, load_end=loadavg(), rows=rows)
  append_result(args.name, record, pathlib.Path(args.results) if args.results else None)
  return record


if __name__ == "__main__":
  main()
