"""One traced train step (jax.profiler, Perfetto JSON) summarised as its top kernels by time: the device battery's
profile stage. On a GPU the rows are the kernels of the device's streams; on a CPU (the dry run) the host's XLA
events, less Python frames and runtime bookkeeping."""

import gzip
import json
import pathlib
import re
import tempfile

# host events that are the runtime's, not the program's (the CPU dry run has no device streams)
_PLUMBING = re.compile(r"^\$|PjRt|Pjit|Await|Execute|Buffer|holds|Threadpool|ThreadPool|GarbageCollect|Parse|"
                       r"Handle |Allocate|^end: ")


def trace_events(trace_dir: pathlib.Path) -> tuple[list[dict], dict[int, str]]:
  """The complete ('X') events of the newest Perfetto trace under `trace_dir`, and the process names by pid."""
  paths = sorted(trace_dir.glob("**/perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
  if not paths:
    return [], {}
  data = json.loads(gzip.decompress(paths[-1].read_bytes()))
  events = data["traceEvents"] if isinstance(data, dict) else data
  names = {e["pid"]: e.get("args", {}).get("name", "") for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  return [e for e in events if e.get("ph") == "X" and "dur" in e], names


def top_kernels(events: list[dict], process_names: dict[int, str], n: int = 15) -> dict:
  """{'source': 'device' | 'host', 'total_ms', 'kernels': [{name, calls, ms, share}]}, the n longest by total time.
  Kernel names lose their numeric suffix (loop_add_fusion.12 -> loop_add_fusion), so repeats of a layer merge."""
  device = [e for e in events if process_names.get(e["pid"], "").startswith("/device:")]
  chosen = device or [e for e in events if not _PLUMBING.search(e["name"])]
  totals = {}
  for e in chosen:
    name = re.sub(r"([._]\d+)+$", "", e["name"])
    calls, micros = totals.get(name, (0, 0.0))
    totals[name] = (calls + 1, micros + float(e["dur"]))
  total = sum(micros for _, micros in totals.values())
  rows = [dict(name=name, calls=calls, ms=round(micros / 1e3, 3), share=round(micros / total, 4) if total else 0.0)
          for name, (calls, micros) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:n]]
  return dict(source="device" if device else "host", total_ms=round(total / 1e3, 3), kernels=rows)


def profile_call(call, n: int = 15) -> dict:
  """Runs `call()` (one step, blocking) under jax.profiler and returns top_kernels of its trace."""
  import jax

  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      call()
    events, names = trace_events(pathlib.Path(folder))
  return top_kernels(events, names, n)
