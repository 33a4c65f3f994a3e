"""Bits per byte (text) or per dim (images) over a held-out split under the configured eval protocol (the whole
split, or its first batches: a partial score, said so wherever it is shown), and `hourglass-eval`'s evaluation of a
checkpoint (the whole split unless asked for a partial score)."""

import math

import jax

from hourglass_jax.config.run import RunConfig
from hourglass_jax.data.batches import pipeline
from hourglass_jax.runtime import sharding
from hourglass_jax.train.checkpointing import model_source
from hourglass_jax.train.compiled.trainer import Evaluator
from hourglass_jax.train.loop.progress import progress_bar
from hourglass_jax.train.reporting import run_files


def evaluate(evaluator: Evaluator, params, split: str, max_batches: int = 0, progress: bool = False) -> dict:
  """Mean loss (nats) and bits per scored token over `split` (all of it when max_batches is 0, else its first
  max_batches batches: `whole_split` False, `batches` of `total_batches`), and what the model sows into 'metrics'
  (`metrics`, by module path; empty for most models), averaged over batches weighted by their real windows: a padded
  last batch counts as its few windows, and its padding (copies of the last window, eval_iterator) adds no rate of
  its own. `progress`: a progress bar over the batches (process 0)."""
  source = evaluator.eval_source(split)
  batches = pipeline.num_eval_batches(source, evaluator.batch_size, max_batches)
  step, outs, sown = evaluator.eval_step, [], []
  bar = progress_bar(total=batches, desc=f"eval {split}", unit="batch", leave=False,
                     disable=not progress or jax.process_index() != 0)
  for tokens, weights in pipeline.eval_iterator(source, evaluator.batch_size, evaluator.rows, max_batches):
    out, metrics = step(params, evaluator.global_array(tokens), evaluator.global_array(weights))
    if outs and not bar.disable:
      jax.block_until_ready(outs[-1])  # the bar counts finished batches, one kept in flight
      bar.update(1)
    outs.append(out)
    sown.append(metrics)
  if outs and not bar.disable:
    jax.block_until_ready(outs[-1])
    bar.update(1)  # the last batch: the bar ends at 100%
  bar.close()
  # Summed on the host in float64: float32 counts stop being exact past 2^24 tokens (a 90M-byte split).
  outs = sharding.to_host(outs)
  total = {key: sum(float(out[key]) for out in outs) for key in ("loss_sum", "tokens", "rows")}
  sown = sharding.to_host(sown)
  metrics = {name: sum(float(m[name]) * float(out["rows"]) for m, out in zip(sown, outs)) / max(total["rows"], 1.0)
             for name in (sown[0] if sown else {})}
  loss = total["loss_sum"] / max(total["tokens"], 1.0)
  data = evaluator.run.data
  protocol = "images" if data.spec.kind == "image" else data.eval_protocol
  every = pipeline.num_eval_batches(source, evaluator.batch_size, 0)
  return dict(loss=loss, bits=loss / math.log(2), tokens=int(total["tokens"]), batches=batches, total_batches=every,
              windows=min(len(source), batches * evaluator.batch_size), whole_split=batches >= every,
              unit=data.spec.unit, protocol=protocol, metrics=metrics)


def scope(result: dict) -> str:
  """'whole split', or 'partial: first B of N batches (P%)' for a score of part of the split."""
  if result["whole_split"]:
    return "whole split"
  return (f"partial: first {result['batches']:,} of {result['total_batches']:,} batches "
          f"({result['batches'] / result['total_batches']:.0%})")


def describe(result: dict, split: str) -> str:
  what = result["protocol"] if result["protocol"] in ("images", "windows") else f"{result['protocol']} windows"
  sown = "".join(f"; {name} {value:.4g}" for name, value in result["metrics"].items())
  return (f"{split} bits/{result['unit']} {result['bits']:.4f} (loss {result['loss']:.4f} nats; "
          f"{result['windows']:,} {what}, {result['tokens']:,} scored tokens, {scope(result)}{sown})")


def evaluate_checkpoint(run: RunConfig, workdir: str, split: str | None = None,
                        log=print, max_batches: int = 0, progress: bool = False, record: bool = False) -> dict:
  """Restores the params alone of the newest checkpoint in `workdir` (or of the export folder it names, `run` then
  made from model_source.export_config) onto this host's devices and evaluates them on `split` (default
  data.eval_split): the whole split, or its first `max_batches` batches (a partial score; the trainer's periodic
  evaluations take data.eval_batches, which does not apply here). No optimizer, no train step, no train split.
  `record`: a workdir's whole-split score is written to its evaluations/ (run_files), process 0; an export folder
  is never written to."""
  if max_batches < 0:
    raise ValueError(f"--batches={max_batches} must be >= 0 (0 = the whole split).")
  evaluator = Evaluator(run, sharding.make_mesh(run.mesh))
  split = split or run.data.eval_split
  with jax.set_mesh(evaluator.mesh):
    params, step = model_source.read(workdir, evaluator.abstract, run, log=log)
    result = evaluate(evaluator, params, split, max_batches, progress)
  log(f"step {step}: {describe(result, split)}")
  if record and result["whole_split"] and jax.process_index() == 0 and not model_source.is_export(workdir):
    run_files.record_evaluation(workdir, step, split, result, log)
  return dict(result, step=step)
