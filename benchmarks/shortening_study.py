"""Compute-matched study of shortening: validation bits per byte against training FLOPs for the vanilla baseline,
fixed-factor Hourglass (avg, linear and attention resampling) and each learned-shortening predictor.

    .venv/bin/python benchmarks/shortening_study.py [--corpus PATH] [--models vanilla,fixed_avg,...]
        [--budgets_tflop 1,4,16] [--learning_rates 1e-3,3e-3,1e-2] [--seeds 0,1] [--layers 2,4,2]
        [--max_minutes M] [--quick]

Every model has the same widths (d 128 / 4 heads / ff 512 by default, no dropout) and trains on the same data order,
batch and length; the shortened ones use `2@1 4@4 2@1` (factor 4; the learned ones aim at one boundary per 4 bytes
with --segment_capacity 1.0: as many segment slots as the fixed level has), vanilla `8@1`. --layers 2,8,2 gives the
shortened level most of the layers instead (`2@1 8@4 2@1`, vanilla `12@1`), as Nawrot et al. 2023 do. A run trains
for budget / (the model's analytic FLOPs per step) steps with a cosine schedule after 5% warmup, then scores the
whole validation split (bits per byte; for the learned ones also the boundary rate realised in evaluation).

Procedure, per corpus: each model's learning rate is the one of --learning_rates with the lowest validation bits per
byte at the middle budget (the first seed; of an even count of budgets the lower middle, so --budgets_tflop
1,4,16,64 reuses the sweep of 1,4,16); then every budget x seed trains with that rate. Runs are appended to
results/<name>.json one at a time, a summary each (settings, scores, boundary rates, machine; no loss curve), and a
rerun skips every run already recorded there (same corpus, model, budget, seed, rate, widths, layers, shape, segment
capacity, read rule), so the study can run in pieces: --max_minutes starts no run past that many minutes.
results/<name>.md (the table) and results/<name>.png (bits per byte against FLOPs) are rewritten from all recorded
runs at the end of each call; --report_only rewrites them without training.
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import (RESULTS, append_result, loadavg, parse_overrides, parse_with_quick,  # noqa: E402
                               text_corpus)
from benchmarks.models import bench_config  # noqa: E402
from benchmarks.steps import model_flops  # noqa: E402
from hourglass_jax.config.dynamic import with_dynamic_shortening  # noqa: E402
from hourglass_jax.model.hourglass import BOUNDARY_PREDICTORS, CODE_BOUNDARY_BYTES  # noqa: E402
from hourglass_jax.runtime import memory_maps  # noqa: E402
from hourglass_jax.train.checks import TrainError  # noqa: E402
from hourglass_jax.train.loop.loop import train_and_evaluate  # noqa: E402

FACTOR = 4
DRAFT_LOSS_WEIGHT = 0.3  # configs/default.py:self_draft's
LAYERS = "2,4,2"  # blocks before, inside and after the shortened level (the runs recorded without `layers`)
# 'whitespace' for source code: every ASCII punctuation byte cuts, a run of spaces once (near 1/4 on Python)
WHITESPACE_CODE = dict(boundaries="whitespace", boundary_bytes=CODE_BOUNDARY_BYTES.decode(), boundary_run_bytes=" ")
MODELS = {  # each model's settings besides its hierarchy, which `hierarchy` builds from --layers
    "vanilla": dict(kind="vanilla"),
    "fixed_avg": dict(shorten="avg", upsample="repeat"),
    "fixed_linear": dict(shorten="linear", upsample="linear"),
    "fixed_attention": dict(shorten="attention_avg", upsample="attention_repeat"),
    **{f"dynamic_{predictor}": dict(boundaries=predictor) for predictor in BOUNDARY_PREDICTORS},
    # 'gumbel' evaluated with training's draw: its threshold evaluation cuts far less often after short training
    "dynamic_gumbel_sampled": dict(boundaries="gumbel", gumbel_evaluation="sample"),
    "dynamic_whitespace_code": WHITESPACE_CODE,
    # the same cuts, each segment pooled as the mean of W_s x_t + b by position s in it (segment_pooling='linear')
    "dynamic_whitespace_code_linear": dict(WHITESPACE_CODE, segment_pooling="linear"),
    # fixed_avg with 4 draft heads (model/draft_heads.py) reading the last layer or the shortened level's output,
    # trained for fixed_avg's steps (the heads' FLOPs are not charged to the budget): their cost in bits per byte
    **{f"fixed_avg_heads_{tap}": dict(shorten="avg", upsample="repeat", draft_heads=4, draft_heads_from=tap,
                                      draft_loss_weight=DRAFT_LOSS_WEIGHT) for tap in ("last", "short")},
}
LN2 = math.log(2.0)
FIRST_CAPACITY = 1.5  # the learned models' segment capacity in runs recorded before --segment_capacity
# A learned level's positions read a segment from its closing position on ('closing'); runs recorded without the
# field read it one position later ('next'), and routing cut one position later.
SEGMENT_READ = "closing"
QUICK = dict(budgets_tflop="0.002,0.004,0.008", learning_rates="3e-3", seeds="0", seq_len=32, batch=8,
             model="d_model=32,num_heads=4,d_ff=64", models="vanilla,fixed_avg,dynamic_whitespace")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny models and budgets: checks the script in a minute")
  parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
  parser.add_argument("--budgets_tflop", default="1,4,16", help="analytic training FLOPs per run, ascending")
  parser.add_argument("--learning_rates", default="1e-3,3e-3,1e-2", help="tried per model at the middle budget")
  parser.add_argument("--seeds", default="0,1")
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--model", default="d_model=128,num_heads=4,d_ff=512", help="width overrides (every model)")
  parser.add_argument("--layers", default=LAYERS, help="blocks before,inside,after the shortened level (vanilla: "
                                                       "their sum at full length)")
  parser.add_argument("--segment_capacity", type=float, default=1.0,
                      help="the learned models' segment slots, times the target count L/k (model.segment_capacity); "
                           "1.0 gives the center the fixed level's slots and FLOPs")
  parser.add_argument("--corpus", default="", metavar="PATH",
                      help="a text file (split 90/5/5 in order); default: the embedded corpus (data.name=stdlib_text)")
  parser.add_argument("--max_minutes", type=float, default=0.0, help="start no run after this long (0: no limit)")
  parser.add_argument("--report_only", action="store_true", help="rewrite the table and plot; train nothing")
  parser.add_argument("--results", default="", help="folder of the results (default benchmarks/results)")
  parser.add_argument("--name", default="shortening_study")
  parser.add_argument("--no_plot", action="store_true")
  parser.add_argument("--keep_workdirs", default="", metavar="DIR",
                      help="keep each run's workdir (its checkpoint) in DIR/<model>_<budget>T_seed<seed>_<corpus>")
  args = parse_with_quick(parser, argv, QUICK)
  unknown = [m for m in args.models.split(",") if m not in MODELS]
  if unknown:
    parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
  layers = args.layers.split(",")
  if len(layers) != 3 or not all(n.isdigit() and int(n) > 0 for n in layers):
    parser.error(f"--layers={args.layers}: give three positive block counts, before,inside,after (e.g. 2,8,2)")
  budgets = floats(args.budgets_tflop)
  if budgets != sorted(budgets) or len(set(budgets)) != len(budgets):
    parser.error(f"--budgets_tflop={args.budgets_tflop}: give distinct budgets in ascending order")
  return args


def floats(text: str) -> list[float]:
  return [float(x) for x in text.split(",")]


def hierarchy(args, model: str) -> str:
  """`model`'s hierarchy at --layers: `before@1 inside@FACTOR after@1`, or one full-length stack of them all."""
  before, inside, after = (int(n) for n in args.layers.split(","))
  if MODELS[model].get("kind") == "vanilla":
    return f"{before + inside + after}@1"
  return f"{before}@1 {inside}@{FACTOR} {after}@1"


def corpus_facts(path: str) -> dict:
  """The corpus as a user can reproduce it (file name, size, SHA-256; never this machine's path) and its id."""
  if not path:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return dict(id=f"stdlib_text-py{version}",
                description=f"the embedded corpus (data.name=stdlib_text: the Python {version} standard library)")
  corpus = text_corpus(path)
  return dict(id=f"{corpus['name']}-{corpus['sha256'][:12]}",
              description=f"{corpus['name']} ({corpus['size']:,} bytes, sha256 {corpus['sha256']})")


def study_config(args, model: str, budget_tflop: float, seed: int, learning_rate: float):
  """The training config of one run: `model` at the study's widths, trained for `budget_tflop` of analytic FLOPs."""
  overrides = dict(MODELS[model])
  predictor = overrides.pop("boundaries", None)
  cfg = bench_config("hourglass", args.seq_len, args.batch, dropout=0.0, **parse_overrides(args.model))
  cfg.model.update(overrides, hierarchy=hierarchy(args, model))
  if predictor:
    cfg = with_dynamic_shortening(cfg, predictor, "shortening_study")
    cfg.model.segment_capacity = args.segment_capacity
  if args.corpus:
    cfg.data.update(name="text_file", path=str(pathlib.Path(args.corpus).expanduser()))
  else:
    cfg.data.update(name="stdlib_text")
  cfg.data.update(train_stride=args.seq_len, eval_batches=0)
  without_heads = cfg.copy_and_resolve_references()
  without_heads.model.update(draft_heads=0, draft_heads_from="last", draft_loss_weight=0.0)
  steps = max(2, round(budget_tflop * 1e12 / model_flops(without_heads)))  # heads train at the model's steps
  cfg.train.update(steps=steps, seed=seed, learning_rate=learning_rate, schedule="cosine",
                   warmup_steps=max(1, steps // 20), log_every=max(1, steps // 20), eval_every=0,
                   peak_flops_per_device=0.0)
  return cfg


def capacity(args, model: str) -> float | None:
  """The segment capacity of `model`'s runs at this call (None for a model without learned segments)."""
  return args.segment_capacity if model.startswith("dynamic_") else None


def recorded_capacity(run: dict) -> float | None:
  """The segment capacity a recorded run trained at (FIRST_CAPACITY for a learned run recorded without one)."""
  if not run["model"].startswith("dynamic_"):
    return None
  return run.get("segment_capacity") or FIRST_CAPACITY


def segment_read(model: str) -> str | None:
  """The segment read rule of `model`'s runs at this call (None for a model without learned segments)."""
  return SEGMENT_READ if model.startswith("dynamic_") else None


def recorded_read(run: dict) -> str | None:
  """The read rule a recorded run trained with ('next' for a learned run recorded without one)."""
  if not run["model"].startswith("dynamic_"):
    return None
  return run.get("segment_read") or "next"


def run_key(args, corpus_id: str, model: str, budget: float, seed: int, learning_rate: float) -> str:
  # Runs at FIRST_CAPACITY keep the keys they were recorded with, without a suffix; so do runs of the 'next' rule.
  slots = capacity(args, model)
  suffix = "" if slots in (None, FIRST_CAPACITY) else f"|capacity{slots:g}"
  suffix += f"|read-{segment_read(model)}" if segment_read(model) else ""
  suffix += "" if args.layers == LAYERS else f"|layers{args.layers.replace(',', '-')}"
  return (f"{corpus_id}|{model}|{budget:g}T|seed{seed}|lr{learning_rate:g}|{args.model}|{args.batch}x{args.seq_len}"
          f"{suffix}")


def train_once(cfg, keep: pathlib.Path | None = None) -> dict:
  """Trains cfg in a temporary workdir (or `keep`, kept: its checkpoint, e.g. for benchmarks/speculative.py): the
  run's summary, validation bits per byte (None if the loss diverged), sown metrics and the final training loss (not
  every step's: the study reads only the summary).
  Training stopped by a signal ends the study with a message (its workdir is temporary: nothing to resume from)."""
  start = time.perf_counter()
  memory_maps.warn_if_low()
  with tempfile.TemporaryDirectory() if keep is None else contextlib.nullcontext(str(keep)) as workdir:
    try:
      summary = train_and_evaluate(cfg, workdir, log=lambda message: None)
    except TrainError as error:  # a learning rate too high for the model: recorded, and loses the sweep
      return dict(valid_bits=None, error=str(error).splitlines()[0], wall_s=round(time.perf_counter() - start, 1))
  memory_maps.release_programs()  # each run compiles its own programs: keep the process under vm.max_map_count
  if summary["stopped"] != "done":  # SIGTERM or Ctrl-C: the run is not scored, so nothing is recorded
    raise SystemExit(f"shortening_study: training was {summary['stopped']} at step {summary['step']} of "
                     f"{cfg.train.steps}; that run is not recorded, rerun the same command to train it again.")
  return dict(valid_bits=summary["eval"]["bits"], valid_tokens=summary["eval"]["tokens"],
              eval_metrics=summary["eval"]["metrics"], final_train_bits=summary["losses"][cfg.train.steps] / LN2,
              tokens_per_s=summary.get("tokens_per_second"), wall_s=round(time.perf_counter() - start, 1))


def keep_dir(args, corpus_id: str, model: str, budget: float, seed: int) -> pathlib.Path | None:
  """Where --keep_workdirs keeps a run's workdir (None: a temporary one)."""
  if not args.keep_workdirs:
    return None
  return pathlib.Path(args.keep_workdirs) / f"{model}_{budget:g}T_seed{seed}_{corpus_id.split('-')[0]}"


def recorded_runs(args, path: pathlib.Path) -> list[dict]:
  """The runs in the results file at this call's widths, layers, shape, segment capacity and read rule (others stay
  in the file, unread)."""
  runs = json.loads(path.read_text()) if path.exists() else []
  shape = (args.model, args.layers, args.batch, args.seq_len)
  return [r for r in runs if (r["widths"], r.get("layers", LAYERS), r["batch"], r["seq_len"]) == shape
          and recorded_capacity(r) == capacity(args, r["model"]) and recorded_read(r) == segment_read(r["model"])]


def score(run: dict) -> float:
  return run["valid_bits"] if run.get("valid_bits") is not None else math.inf


def sweep_budget(budgets: list[float]) -> float:
  """The middle budget, where the rates are swept: of an even count the lower middle, so adding a larger budget to a
  finished study reuses its sweep."""
  return budgets[(len(budgets) - 1) // 2]


def pick_learning_rates(runs: list[dict], corpus_id: str, middle: float, seed: int = 0) -> dict:
  """{model: the rate with the lowest validation bits per byte at the middle budget and the sweep's seed}."""
  best = {}
  for run in runs:
    if run["corpus_id"] == corpus_id and run["budget_tflop"] == middle and run["seed"] == seed:
      if run["model"] not in best or score(run) < score(best[run["model"]]):
        best[run["model"]] = run
  return {model: run["learning_rate"] for model, run in best.items()}


def planned_runs(args, corpus_id: str, runs: list[dict]) -> list[tuple]:
  """(stage, model, budget, seed, rate) still to train, in order: the rate sweep, then each budget's seeds."""
  budgets, rates = floats(args.budgets_tflop), floats(args.learning_rates)
  seeds, models = [int(s) for s in args.seeds.split(",")], args.models.split(",")
  middle, done = sweep_budget(budgets), {run["key"] for run in runs}
  plan = [("sweep", m, middle, seeds[0], lr) for lr in rates for m in models]
  if all(run_key(args, corpus_id, *p[1:]) in done for p in plan):  # swept: each model's best rate is known
    chosen = pick_learning_rates(runs, corpus_id, middle, seeds[0])
    plan += [("grid", m, b, s, chosen[m]) for b in budgets for s in seeds for m in models]
  return [p for p in dict.fromkeys(plan) if run_key(args, corpus_id, *p[1:]) not in done]


def eval_metric(run: dict, name: str) -> float | None:
  """The first level's `name` ('boundary_rate', 'segment_overflow') in evaluation; None for a fixed model."""
  values = [v for k, v in run.get("eval_metrics", {}).items() if k.endswith(name)]
  return values[0] if values else None


def boundary_rate(run: dict) -> float | None:
  return eval_metric(run, "boundary_rate")


def chosen_runs(runs: list[dict], corpus_id: str, budgets: list[float], sweep_seed: int = 0) -> list[dict]:
  """The corpus's runs at each model's chosen rate (the sweep's best at the middle budget)."""
  chosen = pick_learning_rates(runs, corpus_id, sweep_budget(budgets), sweep_seed)
  return [r for r in runs if r["corpus_id"] == corpus_id and r["learning_rate"] == chosen.get(r["model"])
          and r["budget_tflop"] in budgets]


TABLE_NOTE = ("Mean over seeds (number of seeds in parentheses); a diverged run counts as inf; * the rate sweep is "
              "not finished (the best rate so far).")


def table(runs: list[dict], corpus_id: str, budgets: list[float], models: list[str], sweep_seed: int = 0,
          sweep_rates: int = 0, gaps: bool = True) -> str:
  """Markdown: per model its chosen rate, mean validation bits per byte (seeds) at each budget, and the evaluation
  boundary rate of the learned ones; with `gaps`, TABLE_NOTE and per budget the gap of the best learned model to
  fixed_avg and vanilla. A rate is marked '*' while fewer than `sweep_rates` rates have been tried at the middle
  budget."""
  chosen = pick_learning_rates(runs, corpus_id, sweep_budget(budgets), sweep_seed)
  picked = chosen_runs(runs, corpus_id, budgets, sweep_seed)
  cell, lines = {(m, b): [r for r in picked if r["model"] == m and r["budget_tflop"] == b]
                 for m in models for b in budgets}, []
  lines.append("| model | learning rate | " + " | ".join(f"{b:g} TFLOP" for b in budgets)
               + " | eval boundary rate | eval overflow |")
  lines.append("|---|---:|" + "---:|" * len(budgets) + "---:|---:|")
  for model in models:
    values = []
    for budget in budgets:
      bits = [score(r) for r in cell[model, budget]]
      values.append("" if not bits else f"{statistics.mean(bits):.3f} ({len(bits)})")
    top = next((cell[model, b] for b in reversed(budgets) if cell[model, b]), [])
    learned = {name: [eval_metric(r, name) for r in top if eval_metric(r, name) is not None]
               for name in ("boundary_rate", "segment_overflow")}
    rate_text, overflow_text = (f"{statistics.mean(v):.3f}" if v else "" for v in learned.values())
    tried = {r["learning_rate"] for r in runs if r["corpus_id"] == corpus_id and r["model"] == model
             and r["budget_tflop"] == sweep_budget(budgets) and r["seed"] == sweep_seed}
    mark = "*" if len(tried) < sweep_rates else ""
    lines.append(f"| {model} | {chosen.get(model, '')}{mark} | " + " | ".join(values)
                 + f" | {rate_text} | {overflow_text} |")
  if not gaps:
    return "\n".join(lines)
  lines += ["", TABLE_NOTE]
  for budget in budgets:
    means = {m: statistics.mean(map(score, cell[m, budget])) for m in models if cell[m, budget]}
    learned = {m: v for m, v in means.items() if m.startswith("dynamic_")}
    if learned and "fixed_avg" in means:
      best = min(learned, key=learned.get)
      vanilla = f", vanilla {means['vanilla'] - learned[best]:+.3f}" if "vanilla" in means else ""
      lines.append(f"- {budget:g} TFLOP: best learned {best} {learned[best]:.3f}; fixed_avg "
                   f"{means['fixed_avg'] - learned[best]:+.3f}{vanilla} relative to it")
  return "\n".join(lines)


def report(args, runs: list[dict], out_dir: pathlib.Path) -> pathlib.Path:
  budgets, models, sweep_seed = floats(args.budgets_tflop), args.models.split(","), int(args.seeds.split(",")[0])
  sections = []
  for corpus_id in dict.fromkeys(r["corpus_id"] for r in runs):
    description = next(r["corpus"] for r in runs if r["corpus_id"] == corpus_id)
    text = table(runs, corpus_id, budgets, models, sweep_seed, len(floats(args.learning_rates)))
    sections.append(f"## {description}\n\n{text}\n")
  path, results = out_dir / f"{args.name}.md", out_dir / f"{args.name}.json"
  earlier = [r for r in (json.loads(results.read_text()) if results.exists() else [])
             if recorded_read(r) not in (None, SEGMENT_READ)]
  unread = f" (the learned runs of the earlier rule stay in {args.name}.json, unread)" if earlier else ""
  path.write_text(f"# Compute-matched shortening study ({args.name})\n\nWidths {args.model}, hierarchy "
                  f"`{hierarchy(args, 'fixed_avg')}` (vanilla `{hierarchy(args, 'vanilla')}`), batch {args.batch} x "
                  f"{args.seq_len} bytes, no dropout, AdamW with 5% warmup and cosine decay; the rate picked per model "
                  f"from {args.learning_rates} at the middle budget (seed {sweep_seed}); learned models at segment "
                  f"capacity {args.segment_capacity:g}, each position reading a segment from its closing position "
                  f"on{unread}.\n\n"
                  + "\n".join(sections))
  if not args.no_plot and runs:
    from benchmarks import plots
    picked = [r for c in dict.fromkeys(r["corpus_id"] for r in runs) for r in chosen_runs(runs, c, budgets, sweep_seed)]
    print(f"plot: {plots.bits_against_flops(picked, models, out_dir / f'{args.name}.png')}")
  return path


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  corpus = corpus_facts(args.corpus)  # before training: a missing file fails here
  out_dir = pathlib.Path(args.results) if args.results else RESULTS
  path = out_dir / f"{args.name}.json"
  start, trained = time.perf_counter(), []
  while not args.report_only:
    plan = planned_runs(args, corpus["id"], recorded_runs(args, path))
    if not plan:
      break
    if args.max_minutes and time.perf_counter() - start > 60 * args.max_minutes:
      print(f"--max_minutes={args.max_minutes:g} reached with {len(plan)} runs left; rerun to go on")
      break
    stage, model, budget, seed, learning_rate = plan[0]
    cfg = study_config(args, model, budget, seed, learning_rate)
    print(f"[{(time.perf_counter() - start) / 60:.1f} min, {len(plan)} runs left] {stage}: {model} "
          f"{budget:g} TFLOP seed {seed} rate {learning_rate:g} ({cfg.train.steps} steps)", flush=True)
    run = dict(key=run_key(args, corpus["id"], model, budget, seed, learning_rate), corpus_id=corpus["id"],
               corpus=corpus["description"], stage=stage, model=model, budget_tflop=budget, seed=seed,
               learning_rate=learning_rate, steps=cfg.train.steps, flops_per_step=model_flops(cfg),
               hierarchy=cfg.model.hierarchy, segment_capacity=capacity(args, model),
               segment_read=segment_read(model), widths=args.model, layers=args.layers,
               batch=args.batch, seq_len=args.seq_len,
               **train_once(cfg, keep_dir(args, corpus["id"], model, budget, seed)), load=loadavg())
    append_result(args.name, run, out_dir)
    trained.append(run)
    print(f"  valid {score(run):.4f} bits/byte, boundary rate {boundary_rate(run)}, {run['wall_s']} s, "
          f"load {run['load'][0]}", flush=True)
  print(f"table: {report(args, recorded_runs(args, path), out_dir)}")
  return trained


if __name__ == "__main__":
  main()
