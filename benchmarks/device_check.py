"""The device battery: one command for a lent GPU (at most about 8 minutes on one H100), everything recorded.

    bash benchmarks/device_check.sh                  (or: python benchmarks/device_check.py [--budget_s 420])
    python benchmarks/device_check.py --dry-run      the same code at tiny sizes on a CPU (CI runs it)

In order, each stage stopped at its time budget and the whole run at --budget_s (what is left over is recorded as
skipped, never silently dropped):
  1. the GPU-marked tests in a pytest subprocess (before this process takes the GPU's memory): the attention
     dispatcher and the flash kernel against the reference, cached decoding parity, a bfloat16 run of every kind;
  2. the device, jax and plugin versions, and a measured bfloat16 matmul peak;
  3. train-step throughput and MFU (vs the measured peak and the device's nominal bf16 peak) of configs/gpu.py:
     the enwik8 model with attention dropout 0.2 (the fused Pallas kernel) and 0 (cuDNN), :large (d 1024, ~430M
     parameters; bytes/s set against AU-Net's 225k bytes/s per H100 at 1B, scaled by parameters), :dynamic and its
     :fixed twin;
  4. cached decoding tokens/s of the enwik8 model at batch 1, 16 and 128.
Every program is compiled once (ahead of time, persistent cache in .jax_cache) and timed until --measure_s.

Writes results/device_<device>.json (appended) and results/device_<device>.md (benchmarks/device_summary.py).
"""

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(ROOT))

from benchmarks.device_summary import latest_summary, summary_markdown  # noqa: E402,F401  (the generator's API)

# (group, pytest arguments): each group a subprocess of its own, so a slow one cannot void the others' outcome
GPU_TESTS = [("attention", ["tests/test_attention.py", "tests/test_flash_dropout.py"]),
             ("decoding parity", ["tests/test_decode.py", "-k", "hourglass_decoding_matches_forward or "
                                  "vanilla_decoding_matches_forward"]),
             ("every kind trains (bfloat16)", ["tests/test_train_kinds.py"])]
DRY_TESTS = [("dispatcher", ["tests/test_flash_dropout.py::test_dispatcher_picks_flash_on_gpu_with_dropout"])]
# key: (row name, configs/gpu.py preset, model overrides)
TRAIN_CASES = {"dropout": ("enwik8 dropout 0.2", "", {}),
               "no_attention_dropout": ("enwik8 attention dropout 0", "", dict(attention_dropout=0.0)),
               "large": ("large", "large", {}), "dynamic": ("dynamic (whitespace)", "dynamic", {}),
               "fixed": ("fixed twin", "fixed", {}),
               # not run by default: the kernel 'auto' used with dropout before the flash kernel, to compare
               "dropout_block": ("enwik8 dropout 0.2, block attention", "", dict(attention_impl="block"))}
DEFAULT_CASES = "dropout,no_attention_dropout,large,dynamic,fixed"
DECODE_BATCHES = (1, 16, 128)
AUNET_BYTES_PER_S, AUNET_PARAMS = 225e3, 1e9  # AU-Net, 1B parameters, per H100 (the anchor)
# --dry-run: every model tiny, one timed step, decoding 4 tokens.
DRY = dict(model=dict(d_model=32, num_heads=2, d_ff=64), seq_len=48, batch=2, decode_batches=(1, 2, 4),
           decode_tokens=4, hierarchy={"": "1@1 1@3 1@1", "large": "1@1 1@3 1@1", "dynamic": "1@1 1@4 1@1",
                                       "fixed": "1@1 1@4 1@1"})


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="tiny sizes on any backend (CI)")
  parser.add_argument("--budget_s", type=float, default=420.0, help="the whole battery's wall-clock bound")
  parser.add_argument("--tests_s", type=float, default=120.0, help="bound of the pytest stage")
  parser.add_argument("--measure_s", type=float, default=8.0, help="timed seconds per measurement")
  parser.add_argument("--max_steps", type=int, default=30, help="timed steps per measurement at most")
  parser.add_argument("--decode_tokens", type=int, default=64)
  parser.add_argument("--probe_size", type=int, default=8192, help="side of the bfloat16 peak matmul")
  parser.add_argument("--skip", default="", help="stages to leave out: tests,train,decode")
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


def run_tests(args, clock: Clock) -> dict:
  """The GPU-marked tests, unmarked-slow ones only (on a CPU they skip, so --dry-run runs one logic test), group
  by group in pytest subprocesses, within --tests_s together."""
  env = dict(os.environ)
  if not args.dry_run:
    env.update(JAX_PLATFORMS="cuda", XLA_PYTHON_CLIENT_PREALLOCATE="false")
  deadline = time.perf_counter() + min(args.tests_s, clock.left())
  groups, totals = [], {}
  for name, tests in DRY_TESTS if args.dry_run else GPU_TESTS:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-m", "not slow", *tests]
    group = dict(name=name, command=" ".join(command[1:]))
    groups.append(group)
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
  failures = [f for g in groups for f in g["failures"]]
  return dict(groups=groups, counts=totals, failures=failures,
              timed_out=any(g.get("timed_out") or g.get("skipped") for g in groups),
              command="-m pytest -m 'not slow' " + " ".join(" ".join(t) for _, t in
                                                             (DRY_TESTS if args.dry_run else GPU_TESTS)))


def pytest_outcome(output: str) -> dict:
  """{'counts': {'passed': n, ...}, 'failures': [test ids]} from pytest's -q output."""
  summary = output.strip().splitlines()[-1] if output.strip() else ""
  counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", summary)}
  return dict(counts=counts, failures=re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M))


def environment(args) -> dict:
  import jax

  from benchmarks.common import machine_info
  from benchmarks.matmul_peak import MatmulProbe
  from hourglass_jax.train import metrics

  versions = {}
  for package in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "flax", "optax"):
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
  return dict(machine=machine_info(), versions=versions, device_kind=device.device_kind,
              platform_version=getattr(device.client, "platform_version", ""),
              memory_limit=(stats or {}).get("bytes_limit"), peak_measured_bf16=probe.best,
              peak_nominal_bf16=nominal, peak_nominal_source=source)


def train_config(preset: str, overrides: dict, dry_run: bool):
  """configs/gpu.py's preset as a benchmark step: synthetic data, no eval, checkpoint or sample."""
  from benchmarks.common import load_config

  cfg = load_config("gpu", preset)
  cfg.model.update(overrides)
  if dry_run:
    cfg.model.update(hierarchy=DRY["hierarchy"][preset], **DRY["model"])
    cfg.data.update(seq_len=DRY["seq_len"], batch_size=DRY["batch"])
  cfg.data.update(name="synthetic", eval_batches=1)
  cfg.train.update(steps=1_000_000, warmup_steps=10, eval_every=0, sample_bytes=0, grad_accum_steps=1)
  cfg.checkpoint.update(every_steps=0)
  return cfg


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


def timed(call, measure_s: float, max_steps: int) -> list[float]:
  """Seconds per call after one untimed warm call, until `measure_s` passes or `max_steps` ran (at least one)."""
  call()
  times, deadline = [], time.perf_counter() + measure_s
  while not times or (time.perf_counter() < deadline and len(times) < max_steps):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return times


def measure_train(args, env: dict, clock: Clock) -> list[dict]:
  from benchmarks.common import median
  from benchmarks.steps import StepRunner, compile_step

  rows = []
  for key in args.cases.split(","):
    name, preset, overrides = TRAIN_CASES[key]
    row = dict(name=name, preset=preset, overrides=overrides)
    rows.append(row)
    if clock.left() < (5 if args.dry_run else 60):  # an enwik8 step compiled in 65 s on an H100
      row["skipped"] = "out of time"
      continue
    try:
      cfg = train_config(preset, overrides, args.dry_run)
      row.update(batch=cfg.data.batch_size, seq_len=cfg.data.seq_len, dtype=cfg.model.dtype,
                 attention=attention_kernel(cfg))
      compiled = compile_step(cfg)
      row.update(compiled[2])
      limit = env.get("memory_limit")
      if limit and row["memory_bytes"] and row["memory_bytes"] > limit:
        row["skipped"] = f"needs {row['memory_bytes'] / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB"
        continue
      runner = StepRunner(cfg, compiled)
      times = timed(runner, min(args.measure_s, max(0.0, clock.left() - 30)), args.max_steps)
      runner.close()
      step = median(times)
      tokens = row["batch"] * row["seq_len"]
      row.update(step_times=times, step_s=step, bytes_per_s=tokens / step,
                 mfu_measured_peak=row["model_flops"] / step / env["peak_measured_bf16"],
                 mfu_nominal_peak=row["model_flops"] / step / env["peak_nominal_bf16"])
      if preset == "large":
        row["aunet_bytes_per_s_scaled"] = AUNET_BYTES_PER_S * AUNET_PARAMS / row["params"]
    except Exception as error:  # noqa: BLE001 -- one failed case must not lose the others' figures
      row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
    print(f"train {name}: " + _short(row), flush=True)
  return rows


def decode_program(cfg, batch: int, tokens: int):
  """A compiled loop of `tokens` cached decoding steps at batch `batch` from an empty cache of seq_len tokens."""
  import jax
  import jax.numpy as jnp

  from hourglass_jax.model import ModelConfig, build_model, decode
  from hourglass_jax.testing import random_variables

  model_cfg = ModelConfig.from_dict(cfg.model)
  params = random_variables(build_model(model_cfg), jnp.zeros((1, 8), jnp.int32))["params"]

  def run(params, cache, token_B):
    def body(i, carry):
      cache, token_B = carry
      cache, logits_BxV = decode.decode_step(params, model_cfg, cache, token_B, i)
      return cache, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    return jax.lax.fori_loop(0, tokens, body, (cache, token_B))[1]

  args = (params, decode.init_cache(model_cfg, batch, cfg.data.seq_len), jnp.zeros((batch,), jnp.int32))
  program = jax.jit(run).lower(*args).compile()
  return lambda: jax.block_until_ready(program(*args))


def measure_decode(args, clock: Clock) -> list[dict]:
  from benchmarks.common import median

  cfg = train_config("", dict(dropout=0.0), args.dry_run)
  rows = []
  for batch in args.decode_batches:
    row = dict(batch=batch, tokens=args.decode_tokens, cache=cfg.data.seq_len)
    rows.append(row)
    if clock.left() < (3 if args.dry_run else 20):
      row["skipped"] = "out of time"
      continue
    try:
      start = time.perf_counter()
      call = decode_program(cfg, batch, args.decode_tokens)
      row["compile_s"] = round(time.perf_counter() - start, 1)
      seconds = median(timed(call, min(args.measure_s, max(0.0, clock.left() - 10)), max(3, args.max_steps // 10)))
      row.update(seconds=seconds, tokens_per_s=batch * args.decode_tokens / seconds)
    except Exception as error:  # noqa: BLE001
      row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
    print(f"decode batch {batch}: " + _short(row), flush=True)
  return rows


def _short(row: dict) -> str:
  keys = ("attention", "params", "compile_s", "memory_bytes", "step_s", "bytes_per_s", "mfu_nominal_peak",
          "tokens_per_s", "skipped", "error")
  return ", ".join(f"{k} {row[k]:.4g}" if isinstance(row[k], float) else f"{k} {row[k]}" for k in keys if k in row)


def _slug(text: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def main(argv=None) -> dict:
  args = parse_args(argv)
  clock = Clock(args.budget_s)
  skip = set(filter(None, args.skip.split(",")))
  record = dict(args=vars(args), dry_run=args.dry_run)
  if "tests" not in skip:  # first: the subprocess needs the GPU's memory before this process takes it
    record["tests"] = run_tests(args, clock)
    print(f"tests: {record['tests']['counts']}, failed: {record['tests']['failures']}", flush=True)
  from benchmarks.common import RESULTS, append_result

  record["environment"] = environment(args)
  if "train" not in skip:
    record["train"] = measure_train(args, record["environment"], clock)
  if "decode" not in skip:
    record["decode"] = measure_decode(args, clock)
  record["wall_s"] = round(time.perf_counter() - clock.start, 1)
  name = "device_" + ("dry_run_" if args.dry_run else "") + _slug(record["environment"]["device_kind"])
  results = pathlib.Path(args.results) if args.results else RESULTS
  path = append_result(name, record, results)
  markdown = path.with_suffix(".md")
  markdown.write_text(summary_markdown(record))
  print(summary_markdown(record))
  print(f"results: {path}\nsummary: {markdown}")
  return record


if __name__ == "__main__":
  main()
