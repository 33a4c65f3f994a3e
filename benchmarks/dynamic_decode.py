"""Cached decoding speed of a dynamic (learned) shortening level against a fixed one at the same target rate.

configs/dynamic.py's model (2@1 4@4 2@1, d 128) with shorten='avg' / upsample='repeat' (fixed, k=4) against the same
model with shorten='dynamic' and each predictor, random weights. Each program prefills `--prompt` tokens of a text
(`--text`, default the embedded corpus), then decodes `--steps` more of it one token at a time (teacher-forced, so
the boundaries are those of real text). A fixed level runs its center for every row once every k tokens; a dynamic
one for the rows that close a segment, in chunks of ceil(B/k) rows, on the steps where any row closes one. The
record gives the fraction of such steps (`center_steps`) and the rows the center runs for per step, as a fraction
of the batch (`center_rows`: 1/k for the fixed level). The
'gumbel' predictor's logit bias is shifted until evaluation cuts the text once per k bytes, as training targets.
'routing' is left out: its cosine rule has no bias to match the rate with, and random weights give it an arbitrary
rate; it decodes through the same path, with two d x d projections per token. Programs run interleaved (one of
each per round) and the ratios are paired per round. Time on a quiet machine (load < 1.5). Usage:

    .venv/bin/python -m benchmarks.dynamic_decode [--rounds 6] [--batches 1,8] [--quick]
"""

import argparse
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from benchmarks.common import (finish_record, interleave, load_config, loadavg, median, paired_ratios,
                               parse_overrides, parse_with_quick)
from hourglass_jax.data.builders.embedded import stdlib_bytes
from hourglass_jax.model import ModelConfig, build_model, decode
from hourglass_jax.model.config import without_dynamic_settings
from hourglass_jax.testing import random_variables

PREDICTORS = ("whitespace", "gumbel")  # see the module doc for routing


def configs(args) -> dict:
  """{name: ModelConfig}: the fixed baseline, then each predictor."""
  def config(predictor: str, fixed: bool = False, **model):
    fields = dict(load_config("dynamic", predictor).model)
    fields.update(parse_overrides(args.model), **model)
    return ModelConfig.from_dict(without_dynamic_settings(fields) | dict(shorten="avg", upsample="repeat")
                                 if fixed else fields)
  return {"fixed_avg_k4": config("gumbel", fixed=True),
          **{f"dynamic_{p}": config(p) for p in PREDICTORS}}


def text_rows(batch: int, length: int, path: str = "") -> np.ndarray:
  """int32 [batch, length]: consecutive slices of a text file, or of the embedded corpus past its first 64 KiB
  (licence headers)."""
  skip = 0 if path else 1 << 16
  data = np.frombuffer(pathlib.Path(path).read_bytes(), np.uint8) if path else stdlib_bytes(skip + batch * length)
  if data.size < skip + batch * length:
    raise ValueError(f"{path or 'the embedded corpus'} has {data.size} bytes; {batch} rows of {length} need "
                     f"{skip + batch * length}.")
  return data[skip:skip + batch * length].astype(np.int32).reshape(batch, length)


def boundaries(cfg: ModelConfig, variables, tokens_BxL) -> np.ndarray:
  """bool [B, L]: the dynamic level's decisions in evaluation (what the decoder will take)."""
  _, sown = build_model(cfg).apply(variables, tokens_BxL, mutable=["intermediates"])
  return np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])


def rate_matched(cfg: ModelConfig, variables, tokens_BxL, first: int):
  """`variables` with the gumbel predictor's logit bias shifted (bisection) so evaluation cuts positions first..
  at rate 1/k."""
  target = 1 / cfg.parsed_hierarchy.relative_factor(0)
  params = jax.tree.map(lambda a: a, variables["params"])
  bias = params["body"]["shorten"]["predictor"]["logit"]["bias"]
  low, high = -20.0, 20.0
  for _ in range(24):
    shift = (low + high) / 2
    params["body"]["shorten"]["predictor"]["logit"]["bias"] = bias + shift
    if boundaries(cfg, {"params": params}, tokens_BxL)[:, first:].mean() > target:
      high = shift
    else:
      low = shift
  return {"params": params}


def decode_program(cfg: ModelConfig, params, tokens_BxL, prompt: int):
  """(call, facts): a compiled loop of decode steps over tokens[:, prompt:] from the prompt's prefilled cache."""
  length = tokens_BxL.shape[1]
  cache, _ = jax.jit(lambda p, t: decode.prefill(p, cfg, t, length))(params, tokens_BxL[:, :prompt])

  def run(params, cache, tokens_BxL):
    def body(t, carry):
      cache, total = carry
      cache, logits_BxV = decode.decode_step(params, cfg, cache, lax.dynamic_index_in_dim(tokens_BxL, t, 1, False), t)
      return cache, total + logits_BxV[:, 0]
    return lax.fori_loop(prompt, length, body, (cache, jnp.zeros(tokens_BxL.shape[0])))[1]

  compiled = jax.jit(run).lower(params, cache, tokens_BxL).compile()
  return lambda: jax.block_until_ready(compiled(params, cache, tokens_BxL))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--batches", default="1,8")
  parser.add_argument("--prompt", type=int, default=128)
  parser.add_argument("--steps", type=int, default=256)
  parser.add_argument("--text", default="", help="a text file to decode (default: the embedded corpus)")
  parser.add_argument("--model", default="", help="model overrides, e.g. 'd_model=64,num_heads=4'")
  parser.add_argument("--results", default=None, help="results folder (default benchmarks/results)")
  parser.add_argument("--quick", action="store_true", help="2 rounds, batch 1, 64 steps")
  parser.add_argument("--name", default="dynamic_decode")
  args = parse_with_quick(parser, argv, dict(rounds=2, batches="1", steps=64))
  load_before = loadavg()
  cfgs = configs(args)
  length = args.prompt + args.steps
  calls, facts = {}, {}
  for batch in (int(b) for b in args.batches.split(",")):
    tokens_BxL = jnp.asarray(text_rows(batch, length, args.text))
    for name, cfg in cfgs.items():
      variables = {"params": decode.unbox_params(random_variables(build_model(cfg), tokens_BxL[:1]))}
      if cfg.dynamic and cfg.boundaries == "gumbel":
        variables = rate_matched(cfg, variables, tokens_BxL, args.prompt)
      key = f"{name}_batch{batch}"
      calls[key] = decode_program(cfg, variables["params"], tokens_BxL, args.prompt)
      calls[key]()  # warm up
      k = cfg.parsed_hierarchy.relative_factor(0)
      closing_BxS = (boundaries(cfg, variables, tokens_BxL) if cfg.dynamic
                     else np.arange(length)[None, :] % k == k - 1)[:, args.prompt:]
      chunk = -(-batch // k) if cfg.dynamic else batch
      chunks_S = -(-closing_BxS.sum(axis=0) // chunk)
      facts[key] = dict(batch=batch, boundary_rate=round(float(closing_BxS.mean()), 3),
                        center_steps=round(float(closing_BxS.any(axis=0).mean()), 3),
                        center_rows=round(float((chunks_S * chunk).mean() / batch), 3))
      print(f"{key}: compiled; {facts[key]}", flush=True)
  timed = interleave(calls, args.rounds)
  rows = {}
  for key, seconds in timed["times"].items():
    base = timed["times"][f"fixed_avg_k4_batch{facts[key]['batch']}"]
    rows[key] = dict(facts[key], median_s=round(median(seconds), 4),
                     tokens_per_s=round(args.steps * facts[key]["batch"] / median(seconds), 1),
                     time_vs_fixed=round(median(paired_ratios(seconds, base)), 3))
    print(f"{key:<28} {rows[key]['tokens_per_s']:9.1f} tokens/s  {rows[key]['time_vs_fixed']:.3f}x fixed's time  "
          f"center on {rows[key]['center_steps']:.0%} of steps, for {rows[key]['center_rows']:.0%} of rows a step")
  return finish_record(args, load_before, timed, rows)


if __name__ == "__main__":
  main()
