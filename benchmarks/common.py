"""Shared benchmark plumbing: machine facts, results files, configs by name, and interleaved timing.

Timings on a shared machine drift, so every comparison here runs its candidates in turn (A B C A B C ...) in one
process and quotes medians and ratios, with the load average recorded beside them.
"""

import contextlib
import datetime
import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def machine_info() -> dict:
  """What the figures depend on: CPU, cores, memory, library versions, backend, load average now."""
  import jax

  try:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  except (ValueError, OSError):
    memory = None
  return dict(cpu=cpu_model(), cores=os.cpu_count(), memory_gib=round(memory, 1) if memory else None,
              python=platform.python_version(), jax=jax.__version__, backend=jax.default_backend(),
              device=jax.devices()[0].device_kind, devices=jax.device_count(), loadavg=loadavg(),
              xla_flags=os.environ.get("XLA_FLAGS", ""), gpu="none (CPU only)" if jax.default_backend() == "cpu"
              else jax.devices()[0].device_kind)


def available_bytes() -> int | None:
  """MemAvailable from /proc/meminfo: what can be allocated now without swapping or the OOM killer."""
  try:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def loadavg() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def append_result(name: str, record: dict, results_dir: pathlib.Path | None = None) -> pathlib.Path:
  """Appends one run (record + machine info + time) to results/<name>.json, a JSON list. A `results` entry of the
  record's args is left out: it names the folder the file is in, a path of this machine."""
  args = record.get("args")
  if isinstance(args, dict) and "results" in args:
    record = dict(record, args={key: value for key, value in args.items() if key != "results"})
  path = pathlib.Path(results_dir or RESULTS) / f"{name}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  entry = dict(time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               machine=machine_info(), **record)
  with results_lock(path):  # two runs of a study (one per corpus) may append to one file
    runs = json.loads(path.read_text()) if path.exists() else []
    runs = runs if isinstance(runs, list) else [runs]
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(runs + [entry], indent=1) + "\n")
    partial.replace(path)  # a reader never sees half a file
  return path


@contextlib.contextmanager
def results_lock(path: pathlib.Path):
  """An exclusive lock on `path`'s results for this process (a lock file beside it, held while the block runs)."""
  with open(path.with_name(f".{path.name}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def finish_record(args, load_before: list[float], timed: dict, rows: dict) -> dict:
  """The run's record (args, device, load before and during `interleave`, rows), printed and appended to
  results/<args.name>.json (in args.results when given)."""
  import jax  # here, not at the top: some benchmarks set XLA flags before jax is first imported

  record = dict(args=vars(args), device=str(jax.devices()[0].device_kind), load_before=load_before,
                load_during=[round(x, 2) for x in timed["loads"]], rows=rows)
  print(json.dumps(dict(load_before=load_before, load_during=record["load_during"])))
  print(f"results: {append_result(args.name, record, args.results)}")
  return record


def text_corpus(path: str) -> dict:
  """A text file as a user can reproduce it: its name, size and SHA-256 (never this machine's path); a missing
  file stops the benchmark before any training."""
  file = pathlib.Path(path).expanduser()
  if not file.is_file():
    raise SystemExit(f"--corpus={path}: no such file; name a text file, or leave --corpus out for the embedded "
                     "corpus.")
  data = file.read_bytes()
  return dict(name=file.name, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def load_config(name: str, preset: str | None = None):
  """configs/<name>.py's get_config(preset)."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


def interleave(calls: dict, rounds: int, budget_s: float = float("inf")) -> dict:
  """Runs each no-argument call once per round, in turn, for `rounds` rounds or until `budget_s` passes
  (at least one full round); returns {name: [seconds per call]} and the load average at each round."""
  times = {name: [] for name in calls}
  loads, deadline = [], time.perf_counter() + budget_s
  for r in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
    loads.append(os.getloadavg()[0])
    if time.perf_counter() > deadline:
      break
  return dict(times=times, loads=loads)


def median(xs) -> float:
  return statistics.median(xs) if xs else float("nan")


def paired_ratios(a: list[float], b: list[float]) -> list[float]:
  """a[i] / b[i] for the rounds both ran: each pair ran back to back, so the drift cancels."""
  return [x / y for x, y in zip(a, b)]


def parse_overrides(text: str) -> dict:
  """'d_model=64,dropout=0.0,remat=True' -> {'d_model': 64, 'dropout': 0.0, 'remat': True}."""
  out = {}
  for item in filter(None, text.split(",")):
    key, value = item.split("=")
    if value in ("True", "False"):
      out[key.strip()] = value == "True"
      continue
    for kind in (int, float):
      try:
        value = kind(value)
        break
      except ValueError:
        pass
    out[key.strip()] = value
  return out


def parse_with_quick(parser, argv, quick: dict):
  """Parses argv; with --quick, options left at their defaults take the `quick` values and the default result
  name gets a `_quick` suffix, so quick runs never overwrite the full run's results and plots."""
  args = parser.parse_args(argv)
  if args.quick:
    if args.name == parser.get_default("name"):
      args.name += "_quick"
    for key, value in quick.items():
      if parser.get_default(key) == getattr(args, key):
        setattr(args, key, value)
  return args
