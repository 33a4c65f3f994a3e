"""The device battery: one command for a lent GPU (at most about 8 minutes on one H100), everything recorded.

    bash benchmarks/device_check.sh                  (or: python benchmarks/device_check.py [--budget_s 420])
    python benchmarks/device_check.py --dry-run      the same code at tiny sizes on a CPU (CI runs it)

Every program (each train case, each decoding batch) is compiled ahead in a thread pool from the start (XLA
compiles without the GIL; persistent cache in .jax_cache), in the order the stages use them, so compiles overlap
the tests and each other and a cold first run still reaches every case. Stages, each stopped at its budget and the
whole run at --budget_s (what is left over is recorded as skipped, never silently dropped):
  1. smoke tests in a pytest subprocess, a verdict within --tests_s (90 s): the flash kernel against the reference
     at two shapes with dropout and gradients, cuDNN attention, one decoding-parity case per model kind, one
     bfloat16 train step;
  2. the device, jax and plugin versions, and a measured bfloat16 matmul peak;
  3. train-step throughput and MFU of configs/gpu.py (the enwik8 model with attention dropout 0.2 (the flash kernel)
     and 0 (cuDNN), :large (bytes/s against AU-Net's 225k bytes/s per H100 at 1B, scaled by parameters), :dynamic
     and its :fixed twin), each preset's step profiled (jax.profiler: its top kernels by time); then the ablation
     rows that attribute the step time (attention kernel flash / cuDNN / XLA without dropout, dropout off, remat,
     a vanilla stack of equal depth, the flash kernel's untuned block sizes);
  4. cached decoding tokens/s of the enwik8 model at batch 1, 16 and 128 (measured between the presets and the
     ablations: asked for first);
  5. speculative decoding at batch 1 and 16: plain against the n-gram draft (benchmarks/speculative.py);
  6. with --full_tests, every GPU-marked test not marked slow, group by group.

Writes results/device_<device>.json (appended) and results/device_<device>.md (benchmarks/device_summary.py).
"""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
# Memory on demand: the smoke tests' subprocess runs on the same GPU while this process compiles.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import importlib.metadata  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(ROOT))

from benchmarks.battery_configs import DRY, decode_config, timed, train_config  # noqa: E402
from benchmarks.device_summary import latest_summary, summary_markdown  # noqa: E402,F401  (the generator's API)

# The smoke stage: one pytest run, one case of each GPU path (test ids; tests/test_device_check.py checks they exist)
SMOKE_TESTS = [
    "tests/test_flash_dropout.py::test_flash_matches_reference_with_dropout[causal]",
    "tests/test_flash_dropout.py::test_flash_matches_reference_with_dropout[shorten]",
    "tests/test_attention.py::test_cudnn_matches_reference_on_gpu[True-causal]",
    "tests/test_decode.py::test_hourglass_decoding_matches_forward[avg-repeat-1@1 2@3 1@1-rope-0]",
    "tests/test_decode.py::test_vanilla_decoding_matches_forward[rope]",
    "tests/test_predictors.py::test_each_example_decodes_like_the_forward_pass[hourglass 1@1 2@3 1@1 dynamic/repeat whitespace mean rope]",
    "tests/test_decode.py::test_multiscale_decoding_matches_forward[topdown 4,2,1 avg/transposed_conv rope]",
    "tests/test_train_kinds.py::test_every_kind_trains_in_bfloat16_with_dropout_on_gpu[hourglass_bfloat16]",
]
# (group, pytest arguments) of --full_tests: each group a subprocess of its own, so a slow one cannot void the others
GPU_TESTS = [("attention", ["tests/test_attention.py", "tests/test_flash_dropout.py"]),
             ("decoding parity", ["tests/test_decode.py", "-k", "hourglass_decoding_matches_forward or "
                                  "vanilla_decoding_matches_forward"]),
             ("every kind trains (bfloat16)", ["tests/test_train_kinds.py"])]
DRY_TESTS = [("dispatcher", ["tests/test_flash_dropout.py::test_dispatcher_picks_flash_on_gpu_with_dropout"])]


def _case(name, preset="", batch=None, remat=None, blocks=None, **model):
  """A train case: configs/gpu.py's `preset` with `model` overrides, another batch, a remat policy, or the flash
  kernel's block sizes named ('default': flash_dropout.DEFAULT_BLOCKS)."""
  return dict(name=name, preset=preset, model=model, batch=batch, remat=remat, blocks=blocks)


# The presets first, then the ablations that attribute the enwik8 step's time, in the order they are measured.
TRAIN_CASES = {
    "dropout": _case("enwik8 dropout 0.2"),
    "no_attention_dropout": _case("enwik8 attention dropout 0", attention_dropout=0.0),
    "large": _case("large", "large"), "dynamic": _case("dynamic (whitespace)", "dynamic"),
    "fixed": _case("fixed twin", "fixed"),
    "attention_flash": _case("ablation: flash attention, no dropout, batch 8", batch=8, dropout=0.0,
                             attention_dropout=0.0, attention_impl="flash"),
    "attention_cudnn": _case("ablation: cuDNN attention, no dropout, batch 8", batch=8, dropout=0.0,
                             attention_dropout=0.0, attention_impl="cudnn"),
    "attention_xla": _case("ablation: XLA attention, no dropout, batch 8", batch=8, dropout=0.0,
                           attention_dropout=0.0, attention_impl="xla"),
    "no_dropout": _case("ablation: enwik8 without dropout", dropout=0.0, attention_dropout=0.0),
    "remat_dots": _case("ablation: enwik8 dropout 0.2, remat dots_saveable", remat="dots_saveable"),
    # the preset unrolls its stacks (one command buffer, no per-layer bookkeeping): the scanned step against it
    "rolled": _case("ablation: enwik8 dropout 0.2, stacks scanned (scan_unroll=1)", scan_unroll=1),
    "vanilla": _case("ablation: vanilla 34@1 (equal depth), dropout 0.2", kind="vanilla", hierarchy="34@1"),
    "untuned_blocks": _case("ablation: enwik8 dropout 0.2, flash blocks 64 x 64 / 32", blocks="default"),
    # not run by default: the kernel 'auto' used with dropout before the flash kernel, to compare
    "dropout_block": _case("enwik8 dropout 0.2, block attention", attention_impl="block"),
}
DEFAULT_CASES = ",".join(k for k in TRAIN_CASES if k != "dropout_block")
PRESET_CASES = ("dropout", "no_attention_dropout", "large", "dynamic", "fixed")  # measured and profiled first
DECODE_BATCHES = (1, 16, 128)
SPECULATIVE_BATCHES = (1, 16)
AUNET_BYTES_PER_S, AUNET_PARAMS = 225e3, 1e9  # AU-Net, 1B parameters, per H100 (the anchor)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="tiny sizes on any backend (CI)")
  parser.add_argument("--budget_s", type=float, default=420.0, help="the whole battery's wall-clock bound")
  parser.add_argument("--tests_s", type=float, default=90.0, help="bound of the smoke-test stage")
  parser.add_argument("--full_tests", action="store_true", help="also every GPU test not marked slow, at the end")
  parser.add_argument("--full_tests_s", type=float, default=150.0, help="bound of the --full_tests stage")
  parser.add_argument("--measure_s", type=float, default=5.0, help="timed seconds per measurement")
  parser.add_argument("--max_steps", type=int, default=30, help="timed steps per measurement at most")
  parser.add_argument("--decode_tokens", type=int, default=64)
  parser.add_argument("--probe_size", type=int, default=8192, help="side of the bfloat16 peak matmul")
  parser.add_argument("--compile_workers", type=int, default=6,
                      help="programs compiled ahead at once (0: each compiled when its stage reaches it)")
  parser.add_argument("--skip", default="", help="stages to leave out: tests,train,profile,decode,speculative")
  parser.add_argument("--cases", default=DEFAULT_CASES, help="train cases, of " + ",".join(TRAIN_CASES))
  parser.add_argument("--decode_batches", default="", help="default 1,16,128 (dry run 1,2,4)")
  parser.add_argument("--results", default="", help="results folder (default benchmarks/results)")
  args = parser.parse_args(argv)
  if args.dry_run:
    args.measure_s, args.max_steps, args.decode_tokens, args.probe_size = 0.0, 1, DRY["decode_tokens"], 256
  unknown = set(args.cases.split(",")) - set(TRAIN_CASES)
  if unknown:
    parser.error(f"--cases: unknown {', '.join(sorted(unknown))}; choose from {', '.join(TRAIN_CASES)}")
  batches = args.decode_batches or ",".join(map(str, DRY["decode_batches"] if args.dry_run else DECODE_BATCHES))
  args.decode_batches = [int(b) for b in batches.split(",")]
  return args


class Clock:
  """The battery's deadline; `left()` seconds remain."""

  def __init__(self, budget_s: float):
    self.start, self.budget = time.perf_counter(), budget_s

  def left(self) -> float:
    return self.budget - (time.perf_counter() - self.start)


class Programs:
  """Every program the stages will run, compiled ahead by a thread pool in the order they are needed (XLA compiles
  without the GIL); `get(key, timeout_s)` waits for one. With no workers each compiles when it is first asked for."""

  def __init__(self, workers: int):
    self.pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 0 else None
    self.jobs = {}

  def submit(self, key, compile_fn):
    self.jobs[key] = self.pool.submit(compile_fn) if self.pool else compile_fn

  def get(self, key, timeout_s: float):
    job = self.jobs[key]
    return job.result(timeout=max(0.0, timeout_s)) if self.pool else job()

  def close(self):
    if self.pool:
      self.pool.shutdown(wait=False, cancel_futures=True)


def run_tests(args, clock: Clock, groups=None, budget_s=None) -> dict:
  """pytest subprocesses (one per group, so a slow group cannot void the others' outcome), within `budget_s`
  together: by default the smoke tests (on a CPU, --dry-run: one logic test). Tests marked slow are left out."""
  env = dict(os.environ)
  if not args.dry_run:
    env.update(JAX_PLATFORMS="cuda")
  groups = groups or (DRY_TESTS if args.dry_run else [("smoke", SMOKE_TESTS)])
  deadline = time.perf_counter() + min(args.tests_s if budget_s is None else budget_s, clock.left())
  outcomes, totals = [], {}
  for name, tests in groups:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "not slow", *tests]
    group = dict(name=name, command=" ".join(command[1:]))
    outcomes.append(group)
    left = deadline - time.perf_counter()
    if left < 5:
      group.update(skipped="out of time", counts={}, failures=[])
      continue
    start = time.perf_counter()
    try:
      done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
      output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
      output = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
      code = None
    group.update(returncode=code, timed_out=code is None, **pytest_outcome(output),
                 seconds=round(time.perf_counter() - start, 1), tail=output[-2000:])
    for word, n in group["counts"].items():
      totals[word] = totals.get(word, 0) + n
  failures = [f for g in outcomes for f in g["failures"]]
  return dict(groups=outcomes, counts=totals, failures=failures,
              timed_out=any(g.get("timed_out") or g.get("skipped") for g in outcomes),
              verdict="failed" if failures or any(g.get("returncode") not in (0, None) for g in outcomes)
              else "no verdict" if any(g.get("timed_out") or g.get("skipped") for g in outcomes) else "passed",
              command="-m pytest -m 'not slow' " + " ".join(" ".join(t) for _, t in groups))


def pytest_outcome(output: str) -> dict:
  """{'counts': {'passed': n, ...}, 'failures': [test ids]} from pytest's -q output."""
  summary = output.strip().splitlines()[-1] if output.strip() else ""
  counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}
  return dict(counts=counts, failures=re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M))


def _commit() -> str | None:
  """The checkout's commit (None without git): benchmarks/gpu_calibration.py compiles that code to fit its
  estimate to this run's steps."""
  try:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  if done.returncode != 0:
    return None
  return done.stdout.strip() or None


def environment(args) -> dict:
  import jax

  from benchmarks.common import machine_info
  from benchmarks.matmul_peak import MatmulProbe
  from hourglass_jax.train.reporting import metrics

  versions = {}
  for package in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "flax", "optax"):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  probe = MatmulProbe(args.probe_size, "bfloat16")
  for _ in range(3 if args.dry_run else 20):
    probe()
  nominal, source = metrics.peak_flops_per_device(0.0, "bfloat16")
  return dict(machine=machine_info(), versions=versions, commit=_commit(), device_kind=device.device_kind,
              platform_version=getattr(device.client, "platform_version", ""),
              compute_capability=str(getattr(device, "compute_capability", "")),
              memory_limit=(stats or {}).get("bytes_limit"), peak_measured_bf16=probe.best,
              peak_nominal_bf16=nominal, peak_nominal_source=source)


def attention_kernel(cfg) -> str:
  """What attention_impl resolves to for the model's full-resolution (causal) attention in training."""
  from hourglass_jax.model import ModelConfig
  from hourglass_jax.model.layers import causal_mask
  from hourglass_jax.ops.attention import resolve_implementation

  model = ModelConfig.from_dict(cfg.model)
  length = cfg.data.seq_len
  return resolve_implementation(model.attention_impl, dtype=model.dtype, has_bias=model.position == "relative",
                                has_dropout=model.attention_dropout_rate > 0, static_mask=True,
                                lengths=(length, length), mask_TxS=causal_mask(length))


def compile_train_case(cfg, blocks: str | None):
  """(cfg, compile_step's result): runs in a compile thread, nothing executes. `blocks`: a TRAIN_CASES entry's."""
  from benchmarks.steps import compile_step
  from hourglass_jax.ops import flash_dropout

  chosen = flash_dropout.DEFAULT_BLOCKS if blocks == "default" else flash_dropout.device_blocks()
  with flash_dropout.use_blocks(chosen):
    return cfg, compile_step(cfg)


def measure_train(args, keys: list[str], env: dict, clock: Clock, programs: Programs, profiles: dict) -> list[dict]:
  from benchmarks.common import median
  from benchmarks.device_profile import profile_call
  from benchmarks.steps import StepRunner

  rows = []
  for key in keys:
    case = TRAIN_CASES[key]
    row = dict(name=case["name"], case=key, preset=case["preset"], overrides=case["model"])
    rows.append(row)
    if clock.left() < (5 if args.dry_run else 20) or ("train", key) not in programs.jobs:
      row["skipped"] = "out of time" if ("train", key) in programs.jobs else "cuDNN attention needs a GPU"
      continue
    try:
      cfg, compiled = programs.get(("train", key), clock.left() - (2 if args.dry_run else 15))
      row.update(batch=cfg.data.batch_size, seq_len=cfg.data.seq_len, dtype=cfg.model.dtype,
                 attention=attention_kernel(cfg), remat=cfg.model.remat_policy != "none" and cfg.model.remat_policy)
      row.update(compiled[2])
      limit = env.get("memory_limit")
      if limit and row["memory_bytes"] and row["memory_bytes"] > limit:
        row["skipped"] = f"needs {row['memory_bytes'] / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB"
        continue
      runner = StepRunner(cfg, compiled)
      times = timed(runner, min(args.measure_s, max(0.0, clock.left() - 30)), args.max_steps)
      if key in PRESET_CASES and "profile" not in args.skip_set:
        profiles[row["name"]] = profile_call(runner)
      runner.close()
      step = median(times)
      tokens = row["batch"] * row["seq_len"]
      row.update(step_times=times, step_s=step, bytes_per_s=tokens / step,
                 mfu_measured_peak=row["model_flops"] / step / env["peak_measured_bf16"],
                 mfu_nominal_peak=row["model_flops"] / step / env["peak_nominal_bf16"])
      if case["preset"] == "large":
        row["aunet_bytes_per_s_scaled"] = AUNET_BYTES_PER_S * AUNET_PARAMS / row["params"]
    except concurrent.futures.TimeoutError:
      row["skipped"] = "out of time (still compiling)"
    except Exception as error:  # noqa: BLE001 -- one failed case must not lose the others' figures
      row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
    print(f"train {row['name']}: " + _short(row), flush=True)
  return rows


def compile_decode(cfg, batch: int, tokens: int):
  """(a compiled loop of `tokens` cached decoding steps at batch `batch` from an empty cache of seq_len tokens,
  compile seconds); the arguments are abstract (a compile thread runs this), `decode_arguments` makes real ones."""
  import jax
  import jax.numpy as jnp

  from hourglass_jax.model import ModelConfig, build_model, decode
  from hourglass_jax.testing import variable_shapes

  model_cfg = ModelConfig.from_dict(cfg.model)

  def run(params, cache, token_B):
    def body(i, carry):
      cache, token_B = carry
      cache, logits_BxV = decode.decode_step(params, model_cfg, cache, token_B, i)
      return cache, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    return jax.lax.fori_loop(0, tokens, body, (cache, token_B))[1]

  params = variable_shapes(build_model(model_cfg), (1, 8), jnp.dtype(jnp.int32))["params"]
  cache = jax.eval_shape(lambda: decode.init_cache(model_cfg, batch, cfg.data.seq_len))
  start = time.perf_counter()
  program = jax.jit(run).lower(params, cache, jax.ShapeDtypeStruct((batch,), jnp.int32)).compile()
  return program, round(time.perf_counter() - start, 1)


def decode_arguments(cfg, batch: int):
  import jax.numpy as jnp

  from hourglass_jax.model import ModelConfig, build_model, decode
  from hourglass_jax.testing import random_variables

  model_cfg = ModelConfig.from_dict(cfg.model)
  params = random_variables(build_model(model_cfg), jnp.zeros((1, 8), jnp.int32))["params"]
  return params, decode.init_cache(model_cfg, batch, cfg.data.seq_len), jnp.zeros((batch,), jnp.int32)


def measure_decode(args, clock: Clock, programs: Programs) -> list[dict]:
  import jax

  from benchmarks.common import median

  cfg = decode_config(args.dry_run)
  rows = []
  for batch in args.decode_batches:
    row = dict(batch=batch, tokens=args.decode_tokens, cache=cfg.data.seq_len)
    rows.append(row)
    if clock.left() < (3 if args.dry_run else 10):
      row["skipped"] = "out of time"
      continue
    try:
      program, row["compile_s"] = programs.get(("decode", batch), clock.left() - 5)
      arguments = decode_arguments(cfg, batch)
      call = lambda: jax.block_until_ready(program(*arguments))
      seconds = median(timed(call, min(args.measure_s, max(0.0, clock.left() - 10)), max(3, args.max_steps // 10)))
      row.update(seconds=seconds, tokens_per_s=batch * args.decode_tokens / seconds)
    except concurrent.futures.TimeoutError:
      row["skipped"] = "out of time (still compiling)"
    except Exception as error:  # noqa: BLE001
      row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
    print(f"decode batch {batch}: " + _short(row), flush=True)
  return rows


def measure_speculative(args, clock: Clock) -> list[dict]:
  """Speculative decoding of the decoding model at batch 1 and 16, plain against the n-gram draft
  (benchmarks/speculative.py's `battery_rows`)."""
  from benchmarks import speculative

  return speculative.battery_rows(decode_config(args.dry_run), SPECULATIVE_BATCHES, args.dry_run, clock.left())


def _short(row: dict) -> str:
  keys = ("attention", "params", "compile_s", "memory_bytes", "step_s", "bytes_per_s", "mfu_nominal_peak",
          "tokens_per_s", "skipped", "error")
  return ", ".join(f"{k} {row[k]:.4g}" if isinstance(row[k], float) else f"{k} {row[k]}" for k in keys if k in row)


def _slug(text: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def submit_programs(args, programs: Programs):
  """Every train case and decoding batch, in the order the stages measure them. Configs are made and modules
  imported here, in the main thread: two threads importing the package at once can meet a half-imported module."""
  import functools

  import benchmarks.steps  # noqa: F401
  import hourglass_jax.testing  # noqa: F401

  import jax

  def train(keys):
    for key in keys if "train" not in args.skip_set else ():
      case = TRAIN_CASES[key]
      if case["model"].get("attention_impl") == "cudnn" and jax.default_backend() != "gpu":
        continue
      cfg = train_config(case["preset"], case["model"], args.dry_run, case)
      programs.submit(("train", key), functools.partial(compile_train_case, cfg, case["blocks"]))

  presets, ablations = split_cases(args.cases)
  train(presets)
  if "decode" not in args.skip_set:
    cfg = decode_config(args.dry_run)
    for batch in args.decode_batches:
      programs.submit(("decode", batch), functools.partial(compile_decode, cfg, batch, args.decode_tokens))
  train(ablations)


def split_cases(cases: str) -> tuple[list[str], list[str]]:
  """--cases as (the presets, measured before decoding; the ablations, after it)."""
  keys = cases.split(",")
  return [k for k in keys if k in PRESET_CASES], [k for k in keys if k not in PRESET_CASES]


def main(argv=None) -> dict:
  args = parse_args(argv)
  args.skip_set = set(filter(None, args.skip.split(",")))
  clock = Clock(args.budget_s)
  record = dict(args={k: v for k, v in vars(args).items() if k != "skip_set"}, dry_run=args.dry_run)
  programs = Programs(args.compile_workers)
  try:
    submit_programs(args, programs)  # compiles start now, beside the smoke tests
    if "tests" not in args.skip_set:
      record["tests"] = run_tests(args, clock)
      print(f"smoke tests: {record['tests']['verdict']}, {record['tests']['counts']}, failed: "
            f"{record['tests']['failures']}", flush=True)
    record["environment"] = environment(args)
    presets, ablations = split_cases(args.cases)
    train = "train" not in args.skip_set
    record.update(train=[], profile={})
    if train:  # the presets, decoding and the speculative stage before the ablations: the rows asked for first
      record["train"] += measure_train(args, presets, record["environment"], clock, programs, record["profile"])
    if "decode" not in args.skip_set:
      record["decode"] = measure_decode(args, clock, programs)
    if "speculative" not in args.skip_set:
      record["speculative"] = measure_speculative(args, clock)
    if train:
      record["train"] += measure_train(args, ablations, record["environment"], clock, programs, record["profile"])
    if args.full_tests:
      record["full_tests"] = run_tests(args, clock, DRY_TESTS if args.dry_run else GPU_TESTS, args.full_tests_s)
  finally:
    programs.close()
  from benchmarks.common import RESULTS, append_result
  from hourglass_jax.runtime import files

  record["wall_s"] = round(time.perf_counter() - clock.start, 1)
  name = "device_" + ("dry_run_" if args.dry_run else "") + _slug(record["environment"]["device_kind"])
  results = pathlib.Path(args.results) if args.results else RESULTS
  path = append_result(name, record, results)
  markdown = path.with_suffix(".md")
  files.write_text(markdown, summary_markdown(record))
  print(summary_markdown(record))
  print(f"results: {path}\nsummary: {markdown}")
  return record


if __name__ == "__main__":
  main()
