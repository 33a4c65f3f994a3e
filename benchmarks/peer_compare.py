"""Our train step versus lucidrains' hourglass-transformer-pytorch on the same Hourglass, timed interleaved.

    bash benchmarks/peer/setup_peer.sh          # once: .venv-peer with CPU torch + the peer package
    .venv/bin/python benchmarks/peer_compare.py [--quick] [--seq_len 768] [--batch 4] [--rounds 5]

Two worker processes (ours in .venv, the peer in .venv-peer) each build their model and train step and warm up;
then the driver asks them in turn, A B A B ..., for `--steps` timed steps each (forward + backward + clipping +
Adam update), so load drift hits both alike. Each turn first runs `--settle_steps` untimed steps. The first step
after the other worker ran is slower, a cost of the interleaving that continuous training never sees: on the
2-core VM our step takes 1.3-1.9 s longer right after the peer's turn (cause unknown).
With `--fresh_workers` each turn starts its worker afresh and ends it before the other's turn (the build and warm-up
are untimed), so no process holds memory while the other runs and no turn follows the other worker's within one
process.
Reported: tokens/s of each (median over rounds) and the per-round ratio ours / peer.
Results: results/peer_compare.json (appended).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, append_result, loadavg, median, paired_ratios, parse_with_quick  # noqa: E402

PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
QUICK = dict(seq_len=96, batch=2, rounds=2, steps=1)  # 96 = 3 x 32


class Worker:
  """A worker subprocess speaking benchmarks/peer/worker_protocol.py."""

  def __init__(self, command: list[str], timeout_s: float, env: dict | None = None):
    self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                 env=env)
    self.facts = self._read()
    self.timeout_s = timeout_s

  def _read(self) -> dict:
    for line in self.proc.stdout:
      if line.startswith("{"):
        return json.loads(line)
    raise RuntimeError(f"worker {self.proc.args} ended with exit code {self.proc.wait()}")

  def time_steps(self, steps: int) -> list[float]:
    self.proc.stdin.write(f"{steps}\n")
    self.proc.stdin.flush()
    return self._read()["seconds"]

  def close(self):
    if self.proc.poll() is None:
      self.proc.stdin.write("\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=60)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--seq_len", type=int, default=768,
                      help="a multiple of 3: the peer fails on other lengths (NameError in its pad_to_multiple)")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=2, help="timed steps per worker per round")
  parser.add_argument("--settle_steps", type=int, default=1,
                      help="untimed steps at the start of each turn (0: time the first step after the other worker)")
  parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
  parser.add_argument("--pin", default="", help="run both workers under `taskset -c PIN` (e.g. 0: one core each)")
  parser.add_argument("--shape", default="default", choices=("default", "wide"),
                      help="default: configs/default.py's Hourglass; "
                           "wide: d 512, ff 2048, 4/2/4 at factor 4, avg/repeat")
  parser.add_argument("--host_malloc", default="auto", choices=("auto", "system"),
                      help="ours: hourglass-train's --host_malloc (auto keeps freed memory on the CPU backend)")
  parser.add_argument("--peer_malloc", default="system", choices=("system", "keep"),
                      help="peer: keep = the same glibc settings, as GLIBC_TUNABLES "
                           "(hourglass_jax.runtime.host_memory)")
  parser.add_argument("--fresh_workers", action="store_true",
                      help="start each turn's worker afresh and end it before the other's turn, so neither process "
                           "holds memory while the other runs (each turn then pays its build and warm-up, untimed)")
  parser.add_argument("--results", default="")
  parser.add_argument("--name", default="peer_compare")
  return parse_with_quick(parser, argv, QUICK)


def main(argv=None) -> dict | None:
  args = parse_args(argv)
  if args.settle_steps < 0 or args.steps < 1:
    raise SystemExit(f"--steps={args.steps} must be >= 1 and --settle_steps={args.settle_steps} >= 0")
  os.environ["HOURGLASS_PEER_SHAPE"] = args.shape  # both workers inherit it
  os.environ["HOURGLASS_HOST_MALLOC"] = args.host_malloc
  if not PEER_PYTHON.exists():
    print(f"no peer venv at {PEER_PYTHON}: run `bash benchmarks/peer/setup_peer.sh` first; skipping.")
    return None
  start = time.perf_counter()
  shape = [str(args.seq_len), str(args.batch)]
  threads = [str(args.threads)] if args.threads else []
  pin = ["taskset", "-c", args.pin] if args.pin else []
  peer_env = None
  if args.peer_malloc == "keep":
    from hourglass_jax.runtime.host_memory import GLIBC_TUNABLES

    peer_env = dict(os.environ, GLIBC_TUNABLES=GLIBC_TUNABLES)
  commands = {"ours": ([*pin, sys.executable, "benchmarks/peer/ours_worker.py", *shape], None),
              "peer": ([*pin, str(PEER_PYTHON), "benchmarks/peer/peer_worker.py", *shape, *threads], peer_env)}
  kept = {} if args.fresh_workers else {name: Worker(command, 600, env) for name, (command, env) in commands.items()}
  facts = {name: worker.facts for name, worker in kept.items()}
  try:
    times, loads, settle = {"ours": [], "peer": []}, [], {"ours": [], "peer": []}
    for _ in range(args.rounds):
      for name, (command, env) in commands.items():
        worker = kept.get(name) or Worker(command, 600, env)
        facts.setdefault(name, worker.facts)
        try:
          seconds = worker.time_steps(args.settle_steps + args.steps)
        finally:
          if name not in kept:
            worker.close()
        settle[name].append(seconds[:args.settle_steps])
        times[name].append(median(seconds[args.settle_steps:]))
      loads.append(loadavg()[0])
  finally:
    for worker in kept.values():
      worker.close()
  ours, peer = facts["ours"], facts["peer"]
  tokens = args.seq_len * args.batch
  ratios = [1 / r for r in paired_ratios(times["ours"], times["peer"])]  # tokens/s ours / peer
  record = dict(args=vars(args), ours=ours, peer=peer, step_s=times, settle_step_s=settle, loads=loads,
                tokens_per_s={k: tokens / median(v) for k, v in times.items()},
                speed_ratio_median=median(ratios), speed_ratios=ratios, wall_s=round(time.perf_counter() - start, 1))
  print(f"ours: {ours['config']}, {ours['params']:,} params, {record['tokens_per_s']['ours']:,.0f} tok/s "
        f"(host malloc {'kept' if ours.get('host_malloc_kept') else 'system'})")
  print(f"peer: {peer['config']}, {peer['params']:,} params, {record['tokens_per_s']['peer']:,.0f} tok/s "
        f"(torch {peer['torch']}, {peer['threads']} threads, host malloc {args.peer_malloc})")
  flops = peer.get("torch_flops")
  if flops:
    print(f"FLOPs per step: ours {ours['model_flops'] / 1e9:.2f} G analytic, {ours['xla_flops'] / 1e9:.2f} "
          f"G XLA; peer {flops / 1e9:.2f} G (torch FlopCounterMode, forward + backward)")
  print(f"tokens/s ours / peer: median {record['speed_ratio_median']:.2f} over {len(ratios)} interleaved rounds "
        f"(each {', '.join(f'{r:.2f}' for r in ratios)}), load {loads}")
  path = append_result(args.name, record, pathlib.Path(args.results) if args.results else None)
  if args.settle_steps:
    print("untimed first step of each turn: " + "; ".join(
        f"{name} {', '.join(f'{s[0]:.2f}' for s in steps)} s" for name, steps in settle.items()))
  print(f"appended to {path}")
  return record


if __name__ == "__main__":
  main()
