"""Speculative decoding against plain cached decoding: bytes per pass of the model, what a pass costs in plain
steps, and the wall-time speed-up, for each draft and with generate()'s defaults.

Targets: configs/default.py:self_draft (the 1.65M-parameter Hourglass `2@1 4@3 2@1` with 4 draft heads, 1.79M
with them) trained --steps steps on code (the embedded corpus, the Python standard library) and on prose (--prose,
tinyshakespeare by default; skipped when the file is missing). Drafts: 'self' (the model's own heads), 'ngram'
(prompt lookup, no model) and a small vanilla `2@1` (d 64, 0.13M parameters) trained as long on the same text.
Missing runs are trained first, into --workdirs.

Each case (corpus x batch x temperature) generates --new_tokens bytes after prompts of --prompt_bytes bytes from
the validation split: plain cached decoding, then each draft at --draft_tokens proposals per pass with the
fallback off (fallback_below 0: speculation itself) and with generate()'s defaults (the fallback on measured time),
all compiled first and timed interleaved for --rounds rounds; speed-ups are medians of the rounds' paired ratios.
Greedy runs also check that speculation gave the plain tokens. --rounds 0 records only what does not depend on
time (bytes per pass, proposals kept): a loaded machine may measure those.

--pass_cost_batches: what a self-draft pass (greedy, code, fallback off) costs in plain steps at each batch, the
CPU's row of model/decode/fallback.py's PASS_COSTS. --gpu_estimate instead compiles a pass and a step for an H100
without one (the CUDA plugin's offline venv, docs/gpu.md) and prices both with benchmarks/hlo_kernels.py's
roofline: the GPU's row, and with the CPU's bytes per pass the speed-up to expect at batch 16 there.
--target_workdirs scores runs trained elsewhere (the shortening study's --keep_workdirs, whose heads read the last
layer or the shortened level's output: model/draft_heads.py) instead of training the targets.

  .venv/bin/python benchmarks/speculative.py [--steps 3000] [--batches 1,16] [--rounds 7]
  PYTHONPATH=$PWD .venv-gpu-offline/bin/python benchmarks/speculative.py --gpu_estimate

Writes benchmarks/results/speculative.json and .md; BENCHMARKS.md shows the .md (make bench-report).
"""

import argparse
import json
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from hourglass_jax.data.batches import sources  # noqa: E402
from hourglass_jax.data.batches.settings import DataSettings  # noqa: E402
from hourglass_jax.model import ModelConfig  # noqa: E402
from hourglass_jax.model.decode import drafts, fallback, sampling  # noqa: E402
from hourglass_jax.runtime import files  # noqa: E402
from hourglass_jax.train.checkpointing.checkpoint import read_params  # noqa: E402
from hourglass_jax.train.loop.loop import train_and_evaluate  # noqa: E402

DRAFT_MODEL = dict(kind="vanilla", hierarchy="2@1", d_model=64, num_heads=2, d_ff=256, draft_heads=0,
                   draft_loss_weight=0.0, draft_heads_from="last")
PROSE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"
DRAFTS = ("self", "ngram", "model")
HEADS_COST = 0.02  # the most bits/byte the draft heads may cost at equal steps (results/draft_heads.json)


def _latest(results: pathlib.Path, name: str):
  path = results / name
  return json.loads(path.read_text())[-1] if path.is_file() else None


def _self_row(record: dict, corpus: str, batch: int):
  return next((row for row in record["rows"] if row["corpus"] == corpus and row["batch"] == batch
               and row["temperature"] == 0 and "self" in row), None)


def targets(record: dict, results: pathlib.Path) -> list[tuple[str, str, str]]:
  """(target, measured, met) for each of the targets the self-draft is held to: the CPU cells from `record`, the
  H100's from the latest --gpu_estimate record, the heads' quality cost from the shortening study's draft_heads.json
  ('-' where a cell was not measured)."""
  show = lambda value, fmt: "-" if value is None else format(value, fmt)
  met = lambda value, ok: "-" if value is None else ("met" if ok(value) else "not met")
  cells = []
  for corpus, goal in (("prose", 1.5), ("code", 2.0)):
    row = _self_row(record, corpus, 1)
    speedup = row["self"].get("speedup") if row else None
    cells.append((f"self, batch 1, {corpus}: >= {goal}x", show(speedup, ".2f") + "x" * bool(row),
                  met(speedup, lambda v, goal=goal: v >= goal)))
  for corpus in ("prose", "code"):
    row = _self_row(record, corpus, 1)
    per_pass = row["self"]["tokens_per_pass"] if row else None
    cells.append((f"self, batch 1, {corpus}: >= 2.5 bytes/pass", show(per_pass, ".2f"),
                  met(per_pass, lambda v: v >= 2.5)))
  cpu = next((r["pass_over_step"] for r in record.get("pass_costs", []) if r["batch"] == 16), None)
  cells.append(("K=4 pass, batch 16, CPU: <= 3 steps", show(cpu, ".2f"), met(cpu, lambda v: v <= 3)))
  gpu_record = _latest(results, f"{record['args']['name']}_gpu.json")
  gpu = (gpu_record or {}).get("gpu", {}).get("default:self_draft batch 16", {}).get("pass_over_step")
  cells.append(("K=4 pass, batch 16, H100 (offline): <= 1.5 steps", show(gpu, ".2f"),
                met(gpu, lambda v: v <= 1.5)))
  row = _self_row(record, "code", 16)
  predicted = row["self"]["tokens_per_pass"] / gpu if row and gpu else None
  cells.append(("H100 batch-16 speed-up (predicted): >= 1.3x",
                show(predicted, ".2f"), met(predicted, lambda v: v >= 1.3)))
  floors = [row[name]["defaults_speedup"] for row in record["rows"] for name in record["args"]["drafts"].split(",")
            if "defaults_speedup" in row.get(name, {})]
  floor = min(floors) if floors else None
  cells.append(("defaults, every cell: >= 0.95x", show(floor, ".2f"),
                met(floor, lambda v: v >= 0.95)))
  heads = {}
  for run in json.loads((results / "draft_heads.json").read_text()) if (results / "draft_heads.json").is_file() else []:
    heads[run["model"]] = run["valid_bits"]
  cost = heads["fixed_avg_heads_last"] - heads["fixed_avg"] if {"fixed_avg", "fixed_avg_heads_last"} <= heads.keys() \
      else None
  cells.append(("heads' cost at equal steps: <= +0.02 bits/byte", show(cost, "+.4f"),
                met(cost, lambda v: v <= HEADS_COST)))
  return cells


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdirs", default="workdirs/speculative", help="where the trained runs are (or go)")
  parser.add_argument("--steps", type=int, default=3000, help="training steps of each target and draft")
  parser.add_argument("--prose", default=str(PROSE), help="a text file for the prose case ('' to skip it)")
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--drafts", default=",".join(DRAFTS))
  parser.add_argument("--draft_tokens", type=int, default=4)
  parser.add_argument("--prompt_bytes", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=160)
  parser.add_argument("--rounds", type=int, default=7, help="timed rounds (0: bytes per pass only, no timing)")
  parser.add_argument("--pass_cost_batches", default="1,16,128", help="batches whose pass cost is timed ('' none)")
  parser.add_argument("--target_workdirs", default="", metavar="code=DIR,prose=DIR",
                      help="score these trained runs (with draft heads) instead of training the targets, e.g. the "
                           "shortening study's --keep_workdirs runs")
  parser.add_argument("--model", default="", help="target overrides of configs/default.py:self_draft, e.g. d_model=32")
  parser.add_argument("--draft_model", default="", help="draft overrides of the vanilla 2@1, e.g. d_model=16")
  parser.add_argument("--seq_len", type=int, default=0, help="training length (0: configs/default.py's 256)")
  parser.add_argument("--gpu_estimate", action="store_true", help="price a pass and a step compiled for an H100")
  parser.add_argument("--name", default="speculative")
  parser.add_argument("--results", default=None)
  return parser.parse_args(argv)


def run_config(corpus: str, role: str, args):
  """The configs/default.py:self_draft run of `role` ('target' or 'draft') on `corpus` ('code' or 'prose')."""
  cfg = common.load_config("default", "self_draft")
  cfg.train.update(steps=args.steps, eval_every=args.steps, log_every=100)
  cfg.checkpoint.update(every_steps=args.steps)
  cfg.model.update(**common.parse_overrides(args.model))
  if role == "draft":
    cfg.model.update(**dict(DRAFT_MODEL, **common.parse_overrides(args.draft_model)))
    cfg.train.update(learning_rate=3e-3)
  if args.seq_len:
    cfg.data.update(seq_len=args.seq_len)
  if corpus == "prose":
    cfg.data.update(name="text_file", path=args.prose)
  return cfg


def trained(corpus: str, role: str, args):
  """(ModelConfig, params, cfg) of the run (--target_workdirs', or trained first when its workdir holds no
  checkpoint)."""
  cfg = run_config(corpus, role, args)
  given = dict(item.split("=", 1) for item in filter(None, args.target_workdirs.split(",")))
  workdir = pathlib.Path(given[corpus] if role == "target" and corpus in given else args.workdirs) / (
      "" if role == "target" and corpus in given else f"{corpus}_{role}")
  if not (workdir / "checkpoints").is_dir():
    print(f"training {workdir} ({args.steps} steps)", flush=True)
    train_and_evaluate(cfg, workdir, log=lambda message: None)
  params, step, record = read_params(workdir, None, log=lambda message: None)
  model_cfg = ModelConfig.from_dict(record["model"])
  print(f"{workdir}: step {step}, {model_cfg.kind} {model_cfg.hierarchy} d {model_cfg.d_model}", flush=True)
  return model_cfg, params, cfg


def prompts(cfg, batch: int, length: int) -> np.ndarray:
  """`batch` prompts of `length` bytes, spread over the validation split."""
  text = sources.split_tokens(DataSettings.of(cfg.data), "validation")
  starts = np.linspace(0, len(text) - length - 1, batch).astype(int)
  return np.stack([text[s:s + length] for s in starts]).astype(np.int32)


def draft_arguments(name: str, draft_model) -> dict:
  return dict(draft=drafts.Model(draft_model[0]), draft_params=draft_model[1]) if name == "model" else dict(
      draft=name)


def case(corpus: str, target, draft_model, batch: int, temperature: float, args) -> dict:
  """One corpus x batch x temperature: bytes per pass of each draft, and with --rounds the timings."""
  model_cfg, params, cfg = target
  prompt_BxP = prompts(cfg, batch, args.prompt_bytes)
  names = args.drafts.split(",")
  runs = {"plain": {}, **{name: dict(draft_arguments(name, draft_model), fallback_below=0) for name in names}}
  if args.rounds:
    runs.update({f"{name} defaults": dict(draft_arguments(name, draft_model)) for name in names})
  outputs, calls = {}, {}
  for name, speculation in runs.items():
    extra = dict(speculation, draft_tokens=args.draft_tokens, return_stats=True) if speculation else {}
    generate = lambda extra=extra: sampling.generate(params, model_cfg, prompt_BxP, max_new_tokens=args.new_tokens,
                                                     rng=0, temperature=temperature, **extra)
    begin = time.perf_counter()
    outputs[name] = jax.block_until_ready(generate())  # compiles
    print(f"  {corpus} batch {batch} temperature {temperature} {name}: compiled in "
          f"{time.perf_counter() - begin:.1f}s", flush=True)
    calls[name] = lambda generate=generate: jax.block_until_ready(generate())
  row = dict(corpus=corpus, batch=batch, temperature=temperature)
  for name in names:
    tokens, stats = outputs[name]
    row[name] = dict(tokens_per_pass=stats.tokens_per_pass, passes=int(stats.passes),
                     kept_per_pass=float(np.sum(stats.kept_B)) / max(int(np.sum(stats.passes_B)), 1))
    if temperature == 0:
      row[name]["same_tokens_as_plain"] = bool(np.array_equal(np.asarray(tokens), np.asarray(outputs["plain"])))
  if not args.rounds:
    print(f"  -> " + "; ".join(f"{name} {row[name]['tokens_per_pass']:.2f} bytes/pass" for name in names), flush=True)
    return row
  timed = common.interleave(calls, args.rounds)
  plain_s = common.median(timed["times"]["plain"])
  row.update(plain_seconds=plain_s, plain_tokens_per_s=batch * args.new_tokens / plain_s, loads=timed["loads"])
  paired = lambda name: common.paired_ratios(timed["times"]["plain"], timed["times"][name])
  for name in names:
    seconds = common.median(timed["times"][name])
    defaults = outputs[f"{name} defaults"][1]
    row[name].update(seconds=seconds, tokens_per_s=batch * args.new_tokens / seconds,
                     speedup=common.median(paired(name)), paired_speedups=paired(name),
                     seconds_per_pass_over_step=(seconds / row[name]["passes"]) / (plain_s / (args.new_tokens - 1)),
                     defaults_speedup=common.median(paired(f"{name} defaults")),
                     defaults_line=defaults.describe(name, args.draft_tokens))
  print(f"  -> plain {row['plain_tokens_per_s']:,.0f} tok/s; " + "; ".join(
      f"{name} {row[name]['tokens_per_pass']:.2f} tok/pass, {row[name]['speedup']:.2f}x, defaults "
      f"{row[name]['defaults_speedup']:.2f}x" for name in names), flush=True)
  return row


def pass_costs(target, batches, args) -> list[dict]:
  """A self-draft pass (greedy, fallback off) against plain steps at each batch: seconds per pass over seconds per
  step, interleaved rounds (fallback.PASS_COSTS' CPU row)."""
  model_cfg, params, cfg = target
  rows = []
  for batch in batches:
    prompt_BxP = prompts(cfg, batch, args.prompt_bytes)
    run = lambda **extra: jax.block_until_ready(sampling.generate(
        params, model_cfg, prompt_BxP, max_new_tokens=args.new_tokens, rng=0, temperature=0.0, **extra))
    spec = dict(draft="self", draft_tokens=args.draft_tokens, fallback_below=0, return_stats=True)
    run(), run(**spec)  # compiles both
    timed = common.interleave({"plain": run, "self": lambda: run(**spec)}, max(args.rounds, 1))
    plain_s, spec_s = (common.median(timed["times"][name]) for name in ("plain", "self"))
    stats = run(**spec)[1]
    per_step = plain_s / (args.new_tokens - 1)
    rows.append(dict(batch=batch, pass_over_step=(spec_s / int(stats.passes)) / per_step,
                     tokens_per_pass=stats.tokens_per_pass, plain_seconds=plain_s, self_seconds=spec_s,
                     loads=timed["loads"]))
    print(f"pass cost at batch {batch}: {rows[-1]['pass_over_step']:.2f} plain steps", flush=True)
  return rows


def in_place_scatters(hlo_text: str) -> list[dict]:
  """benchmarks/hlo_kernels.py's kernels of a program, a scatter fusion's bytes taken as XLA runs it, in place:
  its updates and indices read, the updated elements written (hlo_kernels counts the whole scattered-into operand,
  a row-by-row cache write here)."""
  from benchmarks import hlo_kernels

  computations, _ = hlo_kernels.parse(hlo_text)
  calls = {i.name: i.attr("calls") for body in computations.values() for i in body if i.opcode == "fusion"}
  out = []
  for kernel in hlo_kernels.kernels(hlo_text):
    fused = computations.get(calls.get(kernel["name"]) or "", [])
    if fused and fused[-1].opcode == "scatter":
      shapes = {i.name: i.type for i in fused}
      indices, updates = (hlo_kernels.nbytes(shapes.get(name, "")) for name in fused[-1].operands[1:3])
      kernel = dict(kernel, bytes=float(indices + 2 * updates))
    out.append(kernel)
  return out


def gpu_estimate(args, batches=(1, 16, 128)) -> dict:
  """Roofline seconds (benchmarks/hlo_kernels.py, an H100) of a pass of K+1 tokens at per-row positions and of a
  plain step, each compiled for an H100 without one (benchmarks/gpu_offline.py's device description), for
  configs/default.py:self_draft's model and the device battery's decoding model (configs/gpu.py), at a context of
  about 1k tokens. A step is the mean over one period of the total shortening factor (the shortened levels run at
  the entries that complete one of their tokens)."""
  import jax.numpy as jnp

  from benchmarks import battery_configs, gpu_offline, hlo_kernels
  from hourglass_jax.model import build_model, decode
  from hourglass_jax.model.decode.steps import row_positions
  from hourglass_jax.testing import variable_shapes

  if gpu_offline.cuda_plugin() is None:
    raise SystemExit("--gpu_estimate needs the CUDA plugin's offline venv (docs/gpu.md, 'Compiling for a GPU "
                     "without one'): PYTHONPATH=$PWD .venv-gpu-offline/bin/python benchmarks/speculative.py "
                     "--gpu_estimate")
  device = gpu_offline.gpu_devices("h100")[0]
  mesh = jax.sharding.Mesh(np.array([device]), ("x",))
  everywhere = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  placed = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=everywhere), tree)
  total = lambda compiled: hlo_kernels.roofline(in_place_scatters(compiled.as_text()),
                                                hlo_kernels.GPUS["h100"])["total"]  # launches, flops, bytes, seconds
  models = {"default:self_draft": ModelConfig.from_dict(run_config("code", "target", args).model),
            "gpu.py (battery)": ModelConfig.from_dict(battery_configs.decode_config(False).model)}
  out = {}
  for label, cfg in models.items():
    params = placed(variable_shapes(build_model(cfg), (1, cfg.pad_multiple), jnp.int32)["params"])
    factor, num = cfg.pad_multiple, args.draft_tokens
    base = -(-1024 // factor) * factor  # a context of about 1k tokens
    for batch in batches:
      cache = placed(jax.eval_shape(lambda p: decode.init_cache(cfg, batch, base + factor + num + 1, p), params))
      row = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=everywhere)
      # A step at each entry of one period of the shortening: the shortened levels run at those that complete one.
      # The cache donated, as the decode loop's state is: updated in place, not copied.
      steps = [total(jax.jit(lambda p, c, t, at=at: decode.extend(p, cfg, c, t, at), donate_argnums=1).lower(
          params, cache, row((batch, 1))).compile()) for at in range(base, base + factor)]
      step = {name: sum(s[name] for s in steps) / factor for name in steps[0]}
      # Rows at their own positions, as the decode loop feeds them (one row: a scalar, loop.py's row_positions).
      spec = total(jax.jit(lambda p, c, t, at: decode.extend(p, cfg, c, t, row_positions(at)), donate_argnums=1)
                   .lower(params, cache, row((batch, num + 1)), row((batch,))).compile())
      key = f"{label} batch {batch}"
      out[key] = dict(model=label, batch=batch, pass_over_step=spec["seconds"] / step["seconds"],
                      **{f"pass_{name}": value for name, value in spec.items()},
                      **{f"step_{name}": value for name, value in step.items()})
      print(f"H100 estimate, {label}, batch {batch}: a pass of {num + 1} tokens costs "
            f"{out[key]['pass_over_step']:.2f} steps", flush=True)
  return out


def battery_rows(cfg, batches, dry_run: bool, seconds_left: float) -> list[dict]:
  """The device battery's speculative stage (benchmarks/device_check.py): the decoding model of `cfg` (gpu.py's
  enwik8 model; random weights) greedy at each batch, plain against the n-gram draft, on prompts that repeat a
  random 16-byte phrase. Random weights decode repetitive text, so the tokens per pass are an upper bound of real
  text's; what a pass costs in plain steps carries over, and says which acceptance speculation needs there."""
  from hourglass_jax.model import build_model
  from hourglass_jax.testing import random_variables

  model_cfg = ModelConfig.from_dict(cfg.model)
  params = random_variables(build_model(model_cfg), np.zeros((1, 8), np.int32))["params"]
  new = 8 if dry_run else 128
  rows, deadline = [], time.perf_counter() + seconds_left
  for batch in batches:
    row = dict(batch=batch, tokens=new, draft="ngram", draft_tokens=4)
    rows.append(row)
    if deadline - time.perf_counter() < (3 if dry_run else 20):
      row["skipped"] = "out of time"
      continue
    phrase = np.random.default_rng(batch).integers(0, model_cfg.vocab_size, (batch, 16))
    prompt_BxP = np.tile(phrase, (1, 4)).astype(np.int32)
    run = lambda **extra: jax.block_until_ready(sampling.generate(
        params, model_cfg, prompt_BxP, max_new_tokens=new, rng=0, temperature=0.0, **extra))
    spec = dict(draft="ngram", draft_tokens=4, fallback_below=0, return_stats=True)
    try:
      run(), run(**spec)  # compiles both
      timed = common.interleave({"plain": run, "ngram": lambda: run(**spec)}, 1 if dry_run else 3)
      plain_s, spec_s = (common.median(timed["times"][name]) for name in ("plain", "ngram"))
      stats = run(**spec)[1]
      row.update(plain_tokens_per_s=batch * new / plain_s, tokens_per_s=batch * new / spec_s,
                 speedup=plain_s / spec_s, tokens_per_pass=stats.tokens_per_pass,
                 acceptance=f"{stats.tokens_per_pass:.2f} tokens/pass, {plain_s / spec_s:.2f}x plain",
                 pass_over_step=(spec_s / int(stats.passes)) / (plain_s / (new - 1)))
    except Exception as error:  # noqa: BLE001  (the battery records a failed case and goes on)
      row["error"] = f"{type(error).__name__}: {str(error)[:500]}"
    print(f"speculative batch {batch}: {row}", flush=True)
  return rows


def markdown(record: dict, results: pathlib.Path = common.RESULTS) -> str:
  args = record["args"]
  names = args["drafts"].split(",")
  lines = [f"# Speculative decoding\n",
           f"configs/default.py:self_draft" + (", draft model vanilla `2@1` d 64" if "model" in names else "") +
           f"; {args['steps']} steps per corpus. {args['prompt_bytes']}-byte prompts, {args['new_tokens']} new "
           f"bytes, K={args['draft_tokens']}"]
  timed = any("plain_tokens_per_s" in row for row in record["rows"])
  if timed:
    lines[-1] += (f", medians of {args['rounds']} rounds. Cell: bytes/pass, speed-up, pass in steps (fallback "
                  "off); defaults' speed-up.\n")
    lines += [f"| corpus | batch | temperature | plain bytes/s | {' | '.join(names)} | load |",
              "|---|---:|---:|---:|" + "---|" * len(names) + "---:|"]
    cell = lambda r: (f"{r['tokens_per_pass']:.2f}, {r['speedup']:.2f}x, {r['seconds_per_pass_over_step']:.2f}; "
                      f"{r['defaults_speedup']:.2f}x")
    for row in record["rows"]:
      lines.append(f"| {row['corpus']} | {row['batch']} | {row['temperature']:g} | {row['plain_tokens_per_s']:,.0f} | "
                   + " | ".join(cell(row[name]) for name in names) + f" | {max(row['loads']):.1f} |")
  else:
    lines[-1] += ". Bytes per pass of the target (fallback off; no timing).\n"
    lines += [f"| corpus | target | heads read | batch | temperature | {' | '.join(names)} |",
              "|---|---|---|---:|---:|" + "---:|" * len(names)]
    for row in record["rows"]:
      lines.append(f"| {row['corpus']} | {row['target']} | {row['tap']} | {row['batch']} | {row['temperature']:g} | "
                   + " | ".join(f"{row[name]['tokens_per_pass']:.2f}" for name in names) + " |")
  if record.get("pass_costs"):
    lines += ["", "A self-draft pass (greedy, code) in plain steps (fallback.PASS_COSTS' CPU row):\n",
              "| batch | pass / step | bytes per pass |", "|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['pass_over_step']:.2f} | {r['tokens_per_pass']:.2f} |"
              for r in record["pass_costs"]]
  if record.get("gpu"):
    lines += ["", "Compiled for an H100 without one, priced by benchmarks/hlo_kernels.py's roofline:\n",
              "| model | batch | pass / step |", "|---|---:|---:|"]
    lines += [f"| {r['model']} | {r['batch']} | {r['pass_over_step']:.2f} |" for r in record["gpu"].values()]
  lines += ["", f"Targets (greedy; `{args['name']}_gpu.json`, `draft_heads.json`):\n",
            "| target | measured | |", "|---|---:|---|"]
  lines += [f"| {target} | {value} | {verdict} |" for target, value, verdict in targets(record, results)]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.gpu_estimate:
    record = dict(args=vars(args), gpu=gpu_estimate(args))
    print(f"results: {common.append_result(args.name + '_gpu', record, args.results)}")
    return record
  load_before = common.loadavg()
  corpora = ["code"] + (["prose"] if args.prose and pathlib.Path(args.prose).is_file() else [])
  if args.prose and "prose" not in corpora:
    print(f"--prose={args.prose}: no such file; the prose case is skipped", flush=True)
  rows, costs = [], []
  for corpus in corpora:
    draft_model = trained(corpus, "draft", args) if "model" in args.drafts.split(",") else None
    target = trained(corpus, "target", args)
    for batch in map(int, args.batches.split(",")):
      for temperature in map(float, args.temperatures.split(",")):
        rows.append(dict(case(corpus, target, draft_model, batch, temperature, args), tap=target[0].draft_heads_from,
                         target=f"{target[0].hierarchy}, {target[0].draft_heads} heads"))
    if corpus == "code" and args.rounds and args.pass_cost_batches:
      costs = pass_costs(target, [int(b) for b in args.pass_cost_batches.split(",")], args)
  record = dict(args=vars(args), load_before=load_before, rows=rows, pass_costs=costs)
  path = common.append_result(args.name, record, args.results)
  results = pathlib.Path(args.results or common.RESULTS)
  files.write_text(results / f"{args.name}.md", markdown(record, results))
  print(f"results: {path} and {results / (args.name + '.md')}")
  return record


if __name__ == "__main__":
  main()
