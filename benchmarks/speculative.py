"""Speculative decoding against plain cached decoding: tokens per pass of the model and wall-time speed-up.

Targets: configs/default.py (the 1.65M-parameter Hourglass `2@1 4@3 2@1`) trained --steps steps on code (the
embedded corpus, the Python standard library) and on prose (--prose, tinyshakespeare by default; skipped when the
file is missing). Drafts: 'ngram' (prompt lookup, no model) and a small vanilla `2@1` (d 64, 0.13M parameters)
trained as long on the same text. Missing runs are trained first, into --workdirs.

Each case (corpus x batch x temperature) generates --new_tokens bytes after prompts of --prompt_bytes bytes from
the validation split: plain cached decoding, then each draft at --draft_tokens proposals per pass, all compiled
first and timed interleaved (plain, ngram, model, plain, ...) for --rounds rounds; speed-ups are medians of the
rounds' paired ratios. Greedy runs also check that speculation gave the plain tokens. Each draft runs with the
fallback to plain decoding off (fallback_below 0: speculation itself) and with generate()'s defaults. `seconds
per pass` / `seconds per plain step` is the cost a pass must repay, which sets sampling.FALLBACK_BELOW.

  .venv/bin/python benchmarks/speculative.py [--steps 3000] [--batches 1,16] [--rounds 7]

Writes benchmarks/results/speculative.json and .md; BENCHMARKS.md shows the .md (make bench-report).
"""

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from hourglass_jax.data import sources  # noqa: E402
from hourglass_jax.model import ModelConfig  # noqa: E402
from hourglass_jax.model.decode import drafts, sampling  # noqa: E402
from hourglass_jax.train.checkpoint import read_params  # noqa: E402
from hourglass_jax.train.loop import train_and_evaluate  # noqa: E402

DRAFT_MODEL = dict(kind="vanilla", hierarchy="2@1", d_model=64, num_heads=2, d_ff=256)
PROSE = ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdirs", default="workdirs/speculative", help="where the trained runs are (or go)")
  parser.add_argument("--steps", type=int, default=3000, help="training steps of each target and draft")
  parser.add_argument("--prose", default=str(PROSE), help="a text file for the prose case ('' to skip it)")
  parser.add_argument("--batches", default="1,16")
  parser.add_argument("--temperatures", default="0,1")
  parser.add_argument("--draft_tokens", type=int, default=4)
  parser.add_argument("--prompt_bytes", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=160)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--model", default="", help="target overrides of configs/default.py, e.g. d_model=32")
  parser.add_argument("--draft_model", default="", help="draft overrides of the vanilla 2@1, e.g. d_model=16")
  parser.add_argument("--seq_len", type=int, default=0, help="training length (0: configs/default.py's 256)")
  parser.add_argument("--name", default="speculative")
  parser.add_argument("--results", default=None)
  return parser.parse_args(argv)


def run_config(corpus: str, role: str, args):
  """The configs/default.py run of `role` ('target' or 'draft') on `corpus` ('code' or 'prose')."""
  cfg = common.load_config("default")
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
  """(ModelConfig, params, cfg) of the run, trained first when its workdir holds no checkpoint."""
  cfg = run_config(corpus, role, args)
  workdir = pathlib.Path(args.workdirs) / f"{corpus}_{role}"
  if not (workdir / "checkpoints").is_dir():
    print(f"training {workdir} ({args.steps} steps)", flush=True)
    train_and_evaluate(cfg, workdir, log=lambda message: None)
  params, step, record = read_params(workdir, None, log=lambda message: None)
  model_cfg = ModelConfig.from_dict(record["model"])
  print(f"{workdir}: step {step}, {model_cfg.kind} {model_cfg.hierarchy} d {model_cfg.d_model}", flush=True)
  return model_cfg, params, cfg


def prompts(cfg, batch: int, length: int) -> np.ndarray:
  """`batch` prompts of `length` bytes, spread over the validation split."""
  text = sources.split_tokens(cfg.data.name, cfg.data.get("path", ""), "validation", cfg.data.get("data_dir", ""))
  starts = np.linspace(0, len(text) - length - 1, batch).astype(int)
  return np.stack([text[s:s + length] for s in starts]).astype(np.int32)


def case(corpus: str, target, draft_model, batch: int, temperature: float, args) -> dict:
  """One corpus x batch x temperature: the timings and tokens per pass of plain and each draft."""
  model_cfg, params, cfg = target
  prompt_BxP = prompts(cfg, batch, args.prompt_bytes)
  drafted = {"ngram": dict(draft="ngram"),
             "model": dict(draft=drafts.Model(draft_model[0]), draft_params=draft_model[1])}
  runs = {"plain": {}, **{name: dict(d, fallback_below=0) for name, d in drafted.items()},
          **{f"{name} defaults": dict(d, fallback_below=None) for name, d in drafted.items()}}
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
  timed = common.interleave(calls, args.rounds)
  plain_s = common.median(timed["times"]["plain"])
  row = dict(corpus=corpus, batch=batch, temperature=temperature, plain_seconds=plain_s,
             plain_tokens_per_s=batch * args.new_tokens / plain_s, loads=timed["loads"])
  paired = lambda name: common.paired_ratios(timed["times"]["plain"], timed["times"][name])
  for name in ("ngram", "model"):
    tokens, stats = outputs[name]
    seconds = common.median(timed["times"][name])
    row[name] = dict(seconds=seconds, tokens_per_s=batch * args.new_tokens / seconds,
                     speedup=common.median(paired(name)), paired_speedups=paired(name),
                     tokens_per_pass=stats.tokens_per_pass, passes=int(stats.passes),
                     seconds_per_pass_over_step=(seconds / int(stats.passes)) / (plain_s / (args.new_tokens - 1)),
                     defaults_speedup=common.median(paired(f"{name} defaults")),
                     defaults_fell_back_at=int(outputs[f"{name} defaults"][1].fell_back_at))
    if temperature == 0:
      row[name]["same_tokens_as_plain"] = bool(np.array_equal(np.asarray(tokens), np.asarray(outputs["plain"])))
  print(f"  -> plain {row['plain_tokens_per_s']:,.0f} tok/s; " + "; ".join(
      f"{name} {row[name]['tokens_per_pass']:.2f} tok/pass, {row[name]['speedup']:.2f}x"
      for name in ("ngram", "model")), flush=True)
  return row


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


def markdown(record: dict) -> str:
  args = record["args"]
  lines = [f"# Speculative decoding\n",
           f"Target: configs/default.py's model (1.65M parameters); draft model: vanilla `2@1`, d 64; each trained "
           f"{args['steps']} steps per corpus. {args['prompt_bytes']}-byte prompts from the "
           f"validation split, {args['new_tokens']} new bytes, {args['draft_tokens']} proposals per pass, medians of "
           f"{args['rounds']} interleaved rounds. Each draft's cell, fallback off: new bytes per pass of the "
           "target, speed-up (plain time / speculative time), a pass's cost in plain steps (draft included); then "
           "the speed-up with generate()'s defaults (fallback_below None).\n",
           "| corpus | batch | temperature | plain bytes/s | ngram | model | load |",
           "|---|---:|---:|---:|---|---|---:|"]
  cell = lambda r: (f"{r['tokens_per_pass']:.2f}, {r['speedup']:.2f}x, {r['seconds_per_pass_over_step']:.2f}; "
                    f"{r['defaults_speedup']:.2f}x")
  for row in record["rows"]:
    lines.append(f"| {row['corpus']} | {row['batch']} | {row['temperature']:g} | {row['plain_tokens_per_s']:,.0f} | "
                 f"{cell(row['ngram'])} | {cell(row['model'])} | {max(row['loads']):.1f} |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  args = parse_args(argv)
  load_before = common.loadavg()
  corpora = ["code"] + (["prose"] if args.prose and pathlib.Path(args.prose).is_file() else [])
  if args.prose and "prose" not in corpora:
    print(f"--prose={args.prose}: no such file; the prose case is skipped", flush=True)
  rows = []
  for corpus in corpora:
    target, draft_model = trained(corpus, "target", args), trained(corpus, "draft", args)
    for batch in map(int, args.batches.split(",")):
      for temperature in map(float, args.temperatures.split(",")):
        rows.append(case(corpus, target, draft_model, batch, temperature, args))
  record = dict(args=vars(args), load_before=load_before, rows=rows)
  path = common.append_result(args.name, record, args.results)
  results = pathlib.Path(args.results or common.RESULTS)
  (results / f"{args.name}.md").write_text(markdown(record))
  print(f"results: {path} and {results / (args.name + '.md')}")
  return record


if __name__ == "__main__":
  main()
