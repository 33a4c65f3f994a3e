"""The line protocol between benchmarks/peer_compare.py and its two workers (no project imports: the peer's
worker runs in another venv). The worker prints one JSON line `{"ready": ..., facts}` after building, then
answers each request line `N` with `{"seconds": [...]}` after running N timed train steps; an empty line ends it."""

import json
import sys
import time


def serve(step, facts: dict) -> None:
  """Runs the worker loop around `step()`, which runs one training step and waits for it to finish."""
  step()  # warm-up: compilation, allocation
  print(json.dumps(dict(ready=True, **facts)), flush=True)
  for line in sys.stdin:
    if not line.strip():
      break
    seconds = []
    for _ in range(int(line)):
      start = time.perf_counter()
      step()
      seconds.append(time.perf_counter() - start)
    print(json.dumps(dict(seconds=seconds)), flush=True)
