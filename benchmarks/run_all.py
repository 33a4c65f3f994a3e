"""The benchmark suite in one bounded run: matmul peak + throughput/MFU/cost curves, peer comparison, learning
efficiency. Each piece runs as its own process (memory is returned between them) and appends to results/.

    .venv/bin/python benchmarks/run_all.py [--quick]     # or: make bench / make bench-quick

Full mode takes about 1.5 hours on 2 CPU cores shared at load average ~10 (compilation dominates; .jax_cache keeps
compiled programs for reruns); --quick about 5 minutes (tiny models, one length; each piece 1-2 minutes).
"""

import argparse
import pathlib
import subprocess
import sys
import time

BENCH = pathlib.Path(__file__).resolve().parent
FULL = (
    ("throughput.py", "--lengths", "512,2048,4096,8192", "--model", "dropout=0.0", "--rounds", "3",
     "--budget_s", "600", "--max_step_s", "60", "--memory_gib", "10"),
    # remat: without it the step needs 13 GiB, more than a shared 24 GiB machine reliably has free.
    ("throughput.py", "--presets", "hourglass_enwik8", "--lengths", "2049", "--dtypes", "float32", "--model",
     "remat_policy=nothing_saveable", "--rounds", "1", "--budget_s", "300", "--max_step_s", "1000", "--memory_gib",
     "14", "--name", "enwik8_mfu", "--no_plot"),
    ("peer_compare.py",),
    ("learning.py",),
)
QUICK = (("throughput.py", "--quick"), ("peer_compare.py", "--quick"), ("learning.py", "--quick"))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--only", default="", help="comma-separated script names to run (default all)")
  args = parser.parse_args()
  failed = []
  for script, *flags in QUICK if args.quick else FULL:
    if args.only and script.removesuffix(".py") not in args.only.split(","):
      continue
    print(f"\n=== {script} {' '.join(flags)}", flush=True)
    start = time.perf_counter()
    code = subprocess.call([sys.executable, str(BENCH / script), *flags])
    print(f"=== {script}: exit {code} after {time.perf_counter() - start:.0f} s", flush=True)
    if code:
      failed.append(script)
  if failed:
    sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
  main()
