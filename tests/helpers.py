"""The test suite's shared helpers, in one module (test modules import from here, never from each other):

- model tests: SMALL / small_config (one set of dimensions, so eager-mode op compilations are reused across tests),
  the optimized_programs fixture, the causality check (LENGTHS, assert_causal), and option grids (option_grid: every
  pair of options, or the whole product with HOURGLASS_FULL_GRID=1);
- config files: CONFIGS (the repository's configs/ folder) and load_config;
- training-system tests: one config (batch 8, dropout, constant learning rate after warmup, a one-layer model unless
  the test is about the Hourglass itself) so runs of any length compile the same programs and share the persistent
  compilation cache, in-process and in subprocesses (8 CPU devices each): tiny_config / FLAGS, train_command, run,
  command_env, free_port, trained_run.

Not helpers: tests/gcs_emulator.py (a fake GCS server) and tests/scale_out_probe.py (imported by subprocesses)."""

import functools
import importlib.util
import itertools
import json
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.model import ModelConfig, build_model, decode
from hourglass_jax.model.config import MULTISCALE_KINDS
from hourglass_jax.model.hourglass.dynamic.segments import segment_ids, segments_holding
from hourglass_jax.testing import causality_violations, random_variables

# --- model tests -------------------------------------------------------------------------------------------------

SMALL = dict(vocab_size=50, d_model=32, num_heads=4, d_ff=64)


def small_config(**overrides) -> ModelConfig:
  values = dict(SMALL, kind="hourglass", hierarchy="1@1 2@3 1@1")
  values.update(overrides)
  return ModelConfig(**values)


@pytest.fixture(autouse=True, scope="module")
def optimized_programs():
  """Import into a test module whose programs run long enough (many executions, benchmark loops) that XLA's backend
  optimisations pay for themselves: the suite turns them off (tests/conftest.py), this module and the subprocesses
  it starts turn them back on."""
  previous = jax.config.read("jax_disable_most_optimizations")
  variable = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
  jax.config.update("jax_disable_most_optimizations", False)
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"
  yield
  jax.config.update("jax_disable_most_optimizations", previous)
  if variable is None:
    os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
  else:
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = variable


FULL_GRID = bool(os.environ.get("HOURGLASS_FULL_GRID"))


def option_grid(*options) -> list[tuple]:
  """Cases over several options (each a sequence of values): a covering design in which every value of every option
  and every pair of values of two options appears at least once, or with HOURGLASS_FULL_GRID=1 the whole product.
  Greedy and deterministic (the first case covering the most uncovered pairs wins), so test ids are stable."""
  product = list(itertools.product(*options))
  if FULL_GRID or len(options) < 3:
    return product
  pairs = lambda case: {(i, case[i], j, case[j]) for i, j in itertools.combinations(range(len(case)), 2)}
  uncovered, chosen = set().union(*map(pairs, product)), []
  while uncovered:
    best = max(product, key=lambda case: len(pairs(case) & uncovered))
    chosen.append(best)
    uncovered -= pairs(best)
  return chosen


# Causality by perturbation (tests/test_causality.py, tests/test_multiscale.py). 12 is a multiple of every factor
# product used there, 11 of none; both pad to 12 inside, and the batch is padded to a fixed size, so all those tests
# share array shapes and reuse JAX's eager op compilations.
LENGTHS = (12, 11)
BATCH = 13


def describe(cfg: ModelConfig) -> str:
  if cfg.kind in MULTISCALE_KINDS:
    return f"{cfg.kind} {cfg.scales} {cfg.downsampler}/{cfg.upsampler} {cfg.position}"
  dynamic = f" {cfg.boundaries} {cfg.segment_pooling}" if cfg.shorten == "dynamic" else ""
  dynamic += " sampled" if cfg.shorten == "dynamic" and cfg.gumbel_evaluation == "sample" else ""
  dynamic += " runs" if cfg.shorten == "dynamic" and cfg.boundary_run_bytes else ""
  return f"{cfg.kind} {cfg.hierarchy} {cfg.shorten}/{cfg.upsample}{dynamic} {cfg.position}"


@functools.lru_cache(maxsize=4)  # a compiled program holds hundreds of memory maps: keep few alive
def jitted_apply(model):
  """`model.apply` compiled, with `mutable`, `capture_intermediates` and `deterministic` static (pass `mutable` as a
  tuple). A model of the suite compiles in about 2 s and then runs in milliseconds, where each eager `model.apply`
  (op by op, its scans traced and compiled anew) takes seconds."""
  return jax.jit(model.apply, static_argnames=("mutable", "capture_intermediates", "deterministic"))


def dynamic_variables(model, tokens_BxL, seed: int = 0):
  """random_variables with an 'entropy' predictor's threshold theta itself drawn like the other parameters (the
  parameter is theta / log2(vocab); a draw of the parameter would put theta beyond a random head's entropy
  differences, and no draw would cut some positions and not others)."""
  variables = random_variables(model, tokens_BxL, seed=seed)
  shorten = variables["params"].get("body", {}).get("shorten", {})
  if "entropy" in shorten:
    scale = math.log2(shorten["entropy"]["head"]["bias"].unbox().shape[-1])
    shorten["entropy"]["threshold"] = jax.tree.map(lambda a: a / scale, shorten["entropy"]["threshold"])
  return variables


def sown(model, variables, tokens, **kwargs):
  """What the model sowed ({'losses': ..., 'metrics': ...}) for `tokens`."""
  return jitted_apply(model)(variables, tokens, mutable=("losses", "metrics"), **kwargs)[1]


def qkv(t: int, s: int, *, b: int = 2, n: int = 3, h: int = 8, seed: int = 0):
  """Random float32 queries [b, t, n, h] and keys and values [b, s, n, h] for the attention tests."""
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((b, t, n, h), (b, s, n, h), (b, s, n, h))]


def mixed_variables(model, length: int, **kwargs):
  """Random variables (the first of a fixed series of draws) under which a random sequence closes some segments
  and leaves others open: otherwise a causality check of the segments tests nothing."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, SMALL["vocab_size"], (1, length)), jnp.int32)
  for seed in range(20):
    variables = dynamic_variables(model, tokens, seed=seed)
    rate = float(sown(model, variables, tokens, **kwargs)["metrics"]["body"]["shorten"]["boundary_rate"][0])
    if 0.1 < rate < 0.9:
      return variables
  raise AssertionError("no draw of variables gives a mixed boundary rate")


def centered_gumbel_levels(model, variables, tokens_BxL):
  """`variables` with each nested 'gumbel' level's logit bias (below the first level) moved so that half of the
  segment slots `tokens_BxL` fills cut in evaluation: a random draw leaves the logits of a level's similar
  segment means on one side of 0, so that no draw of a few dozen mixes two levels. Levels are set outermost
  first, as a level's segments depend on the cuts above it."""
  body, level, filled_B = variables["params"]["body"], [], None
  while "inner" in body and "shorten" in body["inner"]:
    level, body = level + ["inner"], body["inner"]
    _, sown = jitted_apply(model)(variables, tokens_BxL, capture_intermediates=True, mutable=("intermediates",))
    above = functools.reduce(lambda tree, key: tree[key], ["body"] + level[:-1], sown["intermediates"])
    cuts_BxL = above["shorten"]["boundaries"][0]
    filled_B = segments_holding(segment_ids(cuts_BxL, cuts_BxL.shape[1] + 1), filled_B)
    if "predictor" not in body["shorten"]:
      continue
    logits_BxM = np.asarray(above["inner"]["shorten"]["predictor"]["logit"]["__call__"][0][..., 0])
    filled = np.concatenate([row[:n] for row, n in zip(logits_BxM, np.asarray(filled_B))])
    body["shorten"]["predictor"]["logit"]["bias"] = jax.tree.map(
        lambda b: b - np.median(filled) - 1e-6, body["shorten"]["predictor"]["logit"]["bias"])
  return variables


def assert_causal(cfg: ModelConfig, length: int) -> None:
  model = build_model(cfg)
  variables = random_variables(model, jnp.zeros((1, length), jnp.int32))
  apply = jitted_apply(model)
  problems = causality_violations(lambda tokens: apply(variables, tokens), length, SMALL["vocab_size"],
                                  batch_size=BATCH)
  assert not problems, f"{describe(cfg)}: {problems[:3]}"


# --- cached decoding: prefill, decode_step and K-token extensions against the forward pass (test_decode.py, the
# predictors' conformance grid in test_predictors.py) ---------------------------------------------------------

# One batch (BATCH) and one total length (= max_len) everywhere, so programs of different configs share shapes.
LENGTH = 12
FULL = bool(os.environ.get("HOURGLASS_FULL_DECODE_TESTS"))
VOCAB = SMALL["vocab_size"]
# NumPy, so that slicing it does not compile a JAX op per slice.
TOKENS = np.random.default_rng(0).integers(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)

# The decoding tests' model shapes (test_decode.py's parity grid, test_speculative.py's drafts of every kind).
SINGLE_LEVEL = "1@1 2@3 1@1"
MULTI_LEVEL = "1@1 1@2 1@4 1@2 1@1"
TOPDOWN = dict(kind="topdown", scales="4,2,1", layers_per_scale="1,1,1")
BOTTOMUP = dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2")
RETINA = dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:1,1:3,3:12")
DYNAMIC = dict(hierarchy=SINGLE_LEVEL, shorten="dynamic", upsample="repeat")
# The conformance grid decodes every predictor (test_predictors.py); greedy generation runs on its 'gumbel' case.
DYNAMIC_GEN = small_config(**DYNAMIC, boundaries="gumbel", position="relative")
NESTED = dict(DYNAMIC, hierarchy=MULTI_LEVEL)
NESTED_CASES = [small_config(**NESTED, boundaries="gumbel", position="rope"),
                small_config(**NESTED, boundaries="whitespace,routing", position="relative"),
                small_config(**NESTED, boundaries="entropy,gumbel", position="rope", segment_pooling="linear"),
                small_config(**NESTED, boundaries="routing", position="relative")]
GEN_CASE = 1  # test_hourglass_decoding_matches_forward's case 1, whose programs are compiled already
GEN_CFG = small_config(hierarchy=SINGLE_LEVEL, shorten="linear", upsample="linear", position="relative")


def multiscale_config(fields, **overrides) -> ModelConfig:
  """A multi-scale model of the shared widths (SMALL) with `fields` (TOPDOWN, BOTTOMUP, RETINA) and overrides."""
  return ModelConfig(**{**SMALL, **fields, **overrides})



EXTEND_SIZES = (1, 2, 3, 5, 8)


def extend_sizes(case: int = 0) -> tuple[int, ...]:
  return EXTEND_SIZES if FULL else (EXTEND_SIZES[case % len(EXTEND_SIZES)],)


def extension_schedule(num: int, start: int, seed: int = 0):
  """What a speculative decoder feeds, row by row (int32 arrays [I, BATCH] and [I, BATCH, num]): from position
  `start` each row feeds `num` tokens of which its first `kept` (1..num, at random) are TOKENS' own and the rest
  other tokens (proposals a verifier rejects), then goes on from its first rejected one (rows at their own
  positions); a row near the end goes back to LENGTH - num and feeds TOKENS' tokens again. Runs until every row has
  fed all of TOKENS from `start`; returns (positions, tokens, kept)."""
  rng = np.random.default_rng(seed + num)
  position_B = np.full(BATCH, min(start, LENGTH - num))
  covered_B = np.full(BATCH, start)  # the first position whose logits no extension has checked yet
  positions, tokens, kept = [], [], []
  while (covered_B < LENGTH).any():
    kept_B = rng.integers(1, num + 1, size=BATCH)
    tokens_BxK = rng.integers(0, VOCAB, size=(BATCH, num))
    for b in range(BATCH):
      real = max(kept_B[b], covered_B[b] - position_B[b])  # re-fed positions are TOKENS' own
      kept_B[b] = real = min(real, num)
      tokens_BxK[b, :real] = TOKENS[b, position_B[b]:position_B[b] + real]
    positions.append(position_B.copy())
    tokens.append(tokens_BxK)
    kept.append(kept_B)
    covered_B = np.maximum(covered_B, position_B + kept_B)
    position_B = np.minimum(position_B + kept_B, LENGTH - num)
  return np.array(positions, np.int32), np.array(tokens, np.int32), np.array(kept)


def prompt_lengths(cfg, case: int = 0) -> tuple[int, ...]:
  """Prompts to prefill besides 0 (decoding from an empty cache): alternating over cases, as each length costs a
  compile, 5 (a multiple of no factor) or a multiple of every factor; the full run takes 1, 5, 7 and the multiple."""
  multiple = cfg.pad_multiple * (8 // cfg.pad_multiple)
  return (1, 5, 7, multiple) if FULL else ((5, multiple)[case % 2],)


@functools.cache
def model_and_params(cfg):
  """Random variables; for learned boundary predictors the first draw under which TOKENS close some segments and
  leave others open in evaluation, at every learned level (otherwise a dynamic case would test no segment at
  all). Nested 'gumbel' levels are centred on TOKENS' segments (`centered_gumbel_levels`); nested levels try
  more draws (a random router rarely cuts some of a row's few segments and not all)."""
  model = build_model(cfg)
  for seed in range(20 if not cfg.dynamic or cfg.parsed_hierarchy.depth == 1 else 80):
    variables = dynamic_variables(model, jnp.zeros((1, LENGTH), jnp.int32), seed=seed)
    if cfg.dynamic and cfg.parsed_hierarchy.depth > 1:
      variables = centered_gumbel_levels(model, variables, jnp.asarray(TOKENS))
    if not cfg.dynamic or all(0.1 < rate < 0.9 for predictor, rate in zip(cfg.level_predictors,
                                                                          level_rates(model, variables))
                              if predictor.key != "whitespace"):
      return model, decode.unbox_params(variables)
  raise AssertionError(f"no draw of variables gives {describe(cfg)} a mixed boundary rate")


def level_rates(model, variables) -> list[float]:
  """Each dynamic level's boundary rate on TOKENS in evaluation, outermost first (over the segment slots that hold
  positions, at a nested level)."""
  metrics, rates = jitted_apply(model)(variables, TOKENS, mutable=("metrics",))[1]["metrics"]["body"], []
  while "shorten" in metrics:
    rates.append(float(metrics["shorten"]["boundary_rate"][0]))
    metrics = metrics.get("inner", {})
  return rates


def eval_boundaries(model, variables, tokens_BxL=TOKENS):
  """bool [B, L]: the dynamic level's boundary decisions on `tokens_BxL` in evaluation."""
  _, sown = jitted_apply(model)(variables, tokens_BxL, mutable=("intermediates",))
  return np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])


# Compiled programs stay alive while their jitted function does, and each maps hundreds of memory regions: an
# unbounded cache over the 138 parity cases pushed an xdist worker past the kernel's 65,530 mappings (vm.max_map_count),
# where XLA crashed. So only the newest few are kept (the persistent compilation cache makes a recompile cheap).
LIVE_PROGRAMS = 4


@functools.lru_cache(maxsize=LIVE_PROGRAMS)
def reference_program(cfg, prompts: tuple[int, ...], sizes: tuple[int, ...] = ()):
  """(full forward logits, empty cache, prefills of tokens[:, :P] for P in prompts, the logits of each
  `extension_schedule` of `sizes` fed from the first prefill) as one compiled program: XLA's compile time dominates
  these tests, and it grows less than the number of programs."""
  model = build_model(cfg)

  def extended(params, cache, schedule):
    step = lambda cache, fed: decode.extend(params, cfg, cache, fed[1], fed[0])
    return jax.lax.scan(step, cache, schedule)[1]

  def run(params, tokens_BxL, schedules):
    prefills = [decode.prefill(params, cfg, tokens_BxL[:, :length], LENGTH) for length in prompts]
    extensions = [extended(params, prefills[0][0], schedule) for schedule in schedules]
    return (model.apply({"params": params}, tokens_BxL), decode.init_cache(cfg, BATCH, LENGTH, params), prefills,
            extensions)

  return jax.jit(run)


def schedules(prompts, sizes):
  return [extension_schedule(num, prompts[0]) for num in sizes]


def run_reference(cfg, params, prompts, sizes=()):
  """`reference_program`'s outputs for TOKENS, with the schedules of `sizes`."""
  return reference_program(cfg, prompts, sizes)(params, TOKENS, [s[:2] for s in schedules(prompts, sizes)])


@functools.lru_cache(maxsize=LIVE_PROGRAMS)
def jitted_step(cfg):
  return jax.jit(lambda params, cache, token_B, t: decode.decode_step(params, cfg, cache, token_B, t))


def decoded_logits(cfg, params, cache, first_logits_BxV, prompt_len, tokens_BxL=TOKENS):
  """Logits at positions prompt_len-1 (the prefill's, if any) .. LENGTH-1, decoding the rest of tokens_BxL."""
  out = [] if first_logits_BxV is None else [first_logits_BxV]
  for t in range(prompt_len, LENGTH):
    cache, logits_BxV = jitted_step(cfg)(params, cache, tokens_BxL[:, t], t)
    out.append(logits_BxV)
  return np.stack([np.asarray(x) for x in out], axis=1)


def assert_decoding_matches_forward(cfg, case: int = 0):
  """Prefill + steps from every prompt, and every extension schedule from the first, give the forward's logits."""
  _, params = model_and_params(cfg)
  prompts, sizes = prompt_lengths(cfg, case), extend_sizes(case)
  full_BxLxV, empty, prefills, extensions = run_reference(cfg, params, prompts, sizes)
  full_BxLxV = np.asarray(full_BxLxV)
  runs = [(0, empty, None)] + [(length, *prefilled) for length, prefilled in zip(prompts, prefills)]
  for prompt_len, cache, first_logits_BxV in runs:
    logits = decoded_logits(cfg, params, cache, first_logits_BxV, prompt_len)
    np.testing.assert_allclose(logits, full_BxLxV[:, max(prompt_len - 1, 0):], atol=1e-4, rtol=0,
                               err_msg=f"{describe(cfg)} prompt {prompt_len}")
  for num, (positions, _, kept), logits_IxBxKxV in zip(sizes, schedules(prompts, sizes), extensions):
    assert_extension_matches(full_BxLxV, positions, kept, np.asarray(logits_IxBxKxV), f"{describe(cfg)} K={num}")


def assert_extension_matches(full_BxLxV, positions_IxB, kept_IxB, logits_IxBxKxV, what: str):
  """Each extension's logits at the tokens each row kept equal the forward pass's at those positions."""
  for i, b in itertools.product(range(len(positions_IxB)), range(BATCH)):
    at = positions_IxB[i, b]
    np.testing.assert_allclose(logits_IxBxKxV[i, b, :kept_IxB[i, b]], full_BxLxV[b, at:at + kept_IxB[i, b]],
                               atol=1e-4, rtol=0, err_msg=f"{what}, extension {i}, row {b} at {at}")


# --- config files ------------------------------------------------------------------------------------------------

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def load_config(name: str, *argument: str) -> ml_collections.ConfigDict:
  """configs/<name>.py's get_config(), with the ':argument' of --config=configs/<name>.py:argument if given."""
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*argument)


# --- training-system tests ---------------------------------------------------------------------------------------

ONE_LAYER = dict(kind="vanilla", hierarchy="1@1")
# The Hourglass tests' settings: a small Hourglass (shift, shorten, upsample) that compiles quickly, batch 16.
HOURGLASS = dict(model=dict(kind="hourglass", hierarchy="1@1 1@2 1@1", shorten="avg", upsample="repeat",
                            dropout=0.0), data=dict(batch_size=16))
FLAGS = ("--config.model.kind=vanilla", "--config.model.hierarchy=1@1", "--config.model.dropout=0.1",
         "--config.data.batch_size=8", "--config.data.eval_batches=1", "--config.train.schedule=constant",
         "--config.train.learning_rate=0.01", "--config.train.eval_every=0", "--config.train.log_every=2",
         "--config.train.peak_flops_per_device=1e15", "--config.checkpoint.every_steps=0")


def tiny_config(steps: int = 6, **sections) -> ml_collections.ConfigDict:
  """configs/tiny.py as FLAGS set it (one vanilla layer), with per-section overrides."""
  cfg = load_config("tiny")
  cfg.model.update(dropout=0.1, **ONE_LAYER)
  cfg.data.update(batch_size=8, eval_batches=1)
  cfg.train.update(steps=steps, schedule="constant", learning_rate=1e-2, eval_every=0, log_every=2,
                   peak_flops_per_device=1e15)
  cfg.checkpoint.update(every_steps=0)
  for section, values in sections.items():
    cfg[section].update(values)
  return cfg


def tiny_run(steps: int = 6, **sections):
  """tiny_config's RunConfig (what the entry points make of it)."""
  return run_config(tiny_config(steps, **sections))


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on (for a coordinator or a local server)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def command_env(devices: int = 8) -> dict:
  """Environment for a subprocess with `devices` CPU devices (the compilation cache dir is inherited)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CONFIGS.parent), env.get("PYTHONPATH")]))
  return env


def train_command(workdir, *flags: str, entry: str = "train_entry") -> list[str]:
  """`hourglass-train` (or `hourglass-eval` with entry='eval_entry') on the shared config."""
  return [sys.executable, "-c", f"from hourglass_jax.cli.main import {entry}; {entry}()",
          f"--config={CONFIGS / 'tiny.py'}", f"--workdir={workdir}", *FLAGS, *flags]


def run(command, timeout: int = 300, devices: int = 8) -> subprocess.CompletedProcess:
  return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=command_env(devices))


def run_two_processes(code: str, *args: str, timeout: int = 420) -> list:
  """Runs `python -c code <coordinator> <rank> *args` as two jax processes of 2 CPU devices each; asserts both
  succeed and returns each one's report, the JSON of its last printed line."""
  port = free_port()
  processes = [subprocess.Popen([sys.executable, "-c", code, f"127.0.0.1:{port}", str(rank), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=command_env(devices=2))
               for rank in range(2)]
  try:
    outputs = [p.communicate(timeout=timeout) for p in processes]
  finally:
    for p in processes:
      p.kill()
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def quiet(_message: str) -> None:
  pass


def trained_run(workdir, steps: int = 4, every_steps: int = 2):
  """Trains the shared config with checkpoints every `every_steps` steps into `workdir` (the integrity and export
  tests share this run, so their programs hit the same cached compiles); returns the config, its trainer, and
  the newest checkpoint's state (on the host) and data state."""
  from hourglass_jax.runtime import sharding
  from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
  from hourglass_jax.train.compiled.trainer import Trainer
  from hourglass_jax.train.loop.loop import train_and_evaluate

  cfg = tiny_config(steps=steps, checkpoint=dict(every_steps=every_steps))
  train_and_evaluate(cfg, workdir, log=quiet)
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh), Checkpoints(workdir / "checkpoints", read_only=True, log=quiet) as checkpoints:
    state, data_state, step = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)))
  assert step == steps
  return cfg, trainer, jax.device_get(state), data_state


def copy_checkpoints(workdir, tmp_path) -> pathlib.Path:
  """tmp_path/run holding a copy of `workdir`'s checkpoints, to damage or edit without touching the shared run."""
  copy = pathlib.Path(tmp_path) / "run"
  shutil.copytree(pathlib.Path(workdir) / "checkpoints", copy / "checkpoints")
  return copy


def restore_latest(trainer, cfg, directory, read_only: bool = False, **options):
  """(Checkpoints.restore_latest's (state, data state, step) for `trainer` and `cfg` from `directory`, the lines it
  logged)."""
  from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record

  messages = []
  with jax.set_mesh(trainer.mesh), Checkpoints(directory, read_only=read_only, log=messages.append) as checkpoints:
    restored = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)), **options)
  return restored, messages


def run_plot(*args):
  """hourglass-plot in this process, with `args` as its command line; returns what it exits with."""
  from absl import flags
  from unittest import mock

  from hourglass_jax.cli import plot

  flags.FLAGS.unparse_flags()
  with mock.patch.object(sys, "argv", ["hourglass-plot", *map(str, args)]), pytest.raises(SystemExit) as exit_:
    plot.main()
  flags.FLAGS.unparse_flags()
  return exit_.value.code


def mix32_numpy(x):
  """lowbias32 (hourglass_jax.ops.dropout.mix32) in numpy uint32 arithmetic, with wrapping multiplies."""
  with np.errstate(over="ignore"):
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)
