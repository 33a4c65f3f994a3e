"""Bits per byte (text) or per dim (images) over a whole held-out split under the configured eval protocol, and
`hourglass-eval`'s evaluation of a checkpoint."""

import math

import jax
import ml_collections

from hourglass_jax import sharding
from hourglass_jax.data import pipeline, sources
from hourglass_jax.train.checkpoint import read_params
from hourglass_jax.train.trainer import Evaluator


def evaluate(evaluator: Evaluator, params, split: str, max_batches: int = 0) -> dict:
  """Mean loss (nats) and bits per scored token over `split` (all of it when max_batches is 0), and what the model
  sows into 'metrics' (`metrics`, by module path; empty for most models), averaged over batches weighted by their
  real windows: a padded last batch counts as its few windows, and its padding (copies of the last window,
  eval_iterator) adds no rate of its own."""
  source = evaluator.eval_source(split)
  batches = pipeline.num_eval_batches(source, evaluator.batch_size, max_batches)
  step, outs, sown = evaluator.eval_step, [], []
  for tokens, weights in pipeline.eval_iterator(source, evaluator.batch_size, evaluator.rows, max_batches):
    out, metrics = step(params, evaluator.global_array(tokens), evaluator.global_array(weights))
    outs.append(out)
    sown.append(metrics)
  # Summed on the host in float64: float32 counts stop being exact past 2^24 tokens (a 90M-byte split).
  outs = sharding.to_host(outs)
  total = {key: sum(float(out[key]) for out in outs) for key in ("loss_sum", "tokens", "rows")}
  sown = sharding.to_host(sown)
  metrics = {name: sum(float(m[name]) * float(out["rows"]) for m, out in zip(sown, outs)) / max(total["rows"], 1.0)
             for name in (sown[0] if sown else {})}
  loss = total["loss_sum"] / max(total["tokens"], 1.0)
  data = evaluator.cfg.data
  kind = sources.dataset_kind(data.name)
  protocol = "images" if kind == "image" else data.get("eval_protocol", "windows")
  return dict(loss=loss, bits=loss / math.log(2), tokens=int(total["tokens"]), batches=batches,
              windows=min(len(source), batches * evaluator.batch_size), whole_split=batches * evaluator.batch_size
              >= len(source), unit="dim" if kind == "image" else "byte", protocol=protocol, metrics=metrics)


def describe(result: dict, split: str) -> str:
  scope = "whole split" if result["whole_split"] else f"first {result['batches']} batches"
  what = result["protocol"] if result["protocol"] in ("images", "windows") else f"{result['protocol']} windows"
  sown = "".join(f"; {name} {value:.4g}" for name, value in result["metrics"].items())
  return (f"{split} bits/{result['unit']} {result['bits']:.4f} (loss {result['loss']:.4f} nats; "
          f"{result['windows']:,} {what}, {result['tokens']:,} scored tokens, {scope}{sown})")


def evaluate_checkpoint(cfg: ml_collections.ConfigDict, workdir: str, split: str | None = None,
                        log=print) -> dict:
  """Restores the params alone of the newest checkpoint in `workdir` onto this host's devices and evaluates them
  on `split` (default data.eval_split): no optimizer, no train step, no train split."""
  evaluator = Evaluator(cfg, sharding.make_mesh(cfg.mesh))
  split = split or cfg.data.eval_split
  with jax.set_mesh(evaluator.mesh):
    params, step, _ = read_params(workdir, evaluator.abstract, cfg, log=log)
    result = evaluate(evaluator, params, split, cfg.data.eval_batches)
  log(f"step {step}: {describe(result, split)}")
  return dict(result, step=step)
