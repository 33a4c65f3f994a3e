"""Decoding speed: cached (hourglass_jax.model.decode) vs uncached (a full forward per token), for every model kind.

Batch 1, random weights, greedy tokens. Cached: a jitted lax.fori_loop of `decode_step` over a cache sized to the
length L, run at positions L-n-1 .. L-2 (attention reads the whole fixed-size cache, so the cost is that of a
context of L). Uncached: a jitted loop that re-runs `build_model(cfg).apply` over the padded length-L buffer per
token. Programs are compiled ahead and only the steady state is timed: per length, all models run side by side in
interleaved rounds and the best round counts.

The clock is the process's CPU time with XLA on one thread (--threads 1 --clock cpu, the default): on a shared,
loaded machine wall-clock time measures the neighbours, CPU time the work. On an idle machine they agree.
A profile of the hourglass step separates the full-resolution part (steps where no shortened token completes)
from the shortened level's (steps where one does).

  .venv/bin/python benchmarks/decode_speed.py [--lengths 512,1024,2048,4096,8192] [--uncached_max 2048]

Writes benchmarks/results/decode_speed.json and .md.
"""

import argparse
import os
import sys

if __name__ == "__main__":  # XLA reads its flags once, at import
  _args = " ".join(sys.argv[1:]).replace("--threads ", "--threads=").split()
  _threads = next((a.split("=", 1)[1] for a in _args if a.startswith("--threads=")), "1")
  if _threads != "0":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                               f"intra_op_parallelism_threads={_threads}").strip()

import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

from hourglass_jax.model import ModelConfig, build_model, decode  # noqa: E402
from hourglass_jax.testing import random_variables  # noqa: E402

DIMS = dict(vocab_size=256, d_model=256, num_heads=4, d_ff=1024, position="rope")
MULTISCALE = dict(scales="16,4,1", downsampler="avg", upsampler="transposed_conv")
# name -> (fields, timed uncached too)
MODELS = {
    "hourglass 2@1 8@3 2@1 attention": (dict(kind="hourglass", hierarchy="2@1 8@3 2@1", shorten="attention_avg",
                                             upsample="attention_repeat"), True),
    "hourglass 2@1 8@3 2@1 linear": (dict(kind="hourglass", hierarchy="2@1 8@3 2@1", shorten="linear",
                                          upsample="linear"), True),
    "vanilla 7@1": (dict(kind="vanilla", hierarchy="7@1"), True),
    "hourglass 2@1 24@3 2@1 linear": (dict(kind="hourglass", hierarchy="2@1 24@3 2@1", shorten="linear",
                                           upsample="linear"), False),
    "vanilla 12@1": (dict(kind="vanilla", hierarchy="12@1"), True),
    "topdown 16,4,1 x 4,8,5": (dict(kind="topdown", layers_per_scale="4,8,5", **MULTISCALE), False),
    "bottomup 16,4,1 x 4,8,4": (dict(kind="bottomup", layers_per_scale="4,8,4", heads_per_scale="1,1,2",
                                     **MULTISCALE), False),
    "retina 7@1 16,4,1": (dict(kind="retina", hierarchy="7@1", heads_per_scale="1,1,2",
                               retina_windows="0:32,32:256,256:8192", **MULTISCALE), False),
}
# (hourglass, vanilla with the same full-resolution-equivalent layers); and the same total layers.
PAIRS = [("hourglass 2@1 8@3 2@1 attention", "vanilla 7@1"), ("hourglass 2@1 8@3 2@1 linear", "vanilla 7@1"),
         ("hourglass 2@1 24@3 2@1 linear", "vanilla 12@1"), ("hourglass 2@1 8@3 2@1 attention", "vanilla 12@1"),
         ("topdown 16,4,1 x 4,8,5", "vanilla 7@1"), ("bottomup 16,4,1 x 4,8,4", "vanilla 7@1"),
         ("retina 7@1 16,4,1", "vanilla 7@1")]
RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def equivalent_layers(cfg: ModelConfig) -> float:
  """Full-resolution-equivalent layers: every layer weighted by 1 / its level's (scale's) total factor; bottom-up
  counts its aggregation layer; retina layers count 1 each."""
  if cfg.kind in ("topdown", "bottomup"):
    scales = cfg.parsed_scales
    return sum(n / s for n, s in zip(scales.layers, scales.factors)) + (cfg.kind == "bottomup")
  hierarchy = cfg.parsed_hierarchy
  down = sum(n / f for n, f in hierarchy.levels)
  return down + sum(n / f for n, (_, f) in zip(hierarchy.post_layers, hierarchy.levels))


def cached_program(cfg, params, length, positions):
  """Decode steps at the given positions (int32 [n]) over a cache for `length` tokens."""
  def run(params, cache, token_B, positions_N):
    def body(i, carry):
      cache, token_B = carry
      cache, logits_BxV = decode.decode_step(params, cfg, cache, token_B, positions_N[i])
      return cache, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    return lax.fori_loop(0, positions_N.shape[0], body, (cache, token_B))[1]
  args = (params, decode.init_cache(cfg, 1, length), jnp.zeros((1,), jnp.int32), jnp.asarray(positions, jnp.int32))
  return jax.jit(run).lower(*args).compile(), args


def uncached_program(cfg, params, length, steps):
  model = build_model(cfg)

  def run(params, tokens_BxL, start):
    def body(i, tokens_BxL):
      t = start + i
      logits_BxLxV = model.apply({"params": params}, tokens_BxL)
      next_B = jnp.argmax(lax.dynamic_index_in_dim(logits_BxLxV, t, axis=1, keepdims=False), axis=-1)
      return tokens_BxL.at[:, t + 1].set(next_B.astype(jnp.int32))
    return lax.fori_loop(0, steps, body, tokens_BxL)
  args = (params, jnp.zeros((1, length), jnp.int32), jnp.int32(length - steps - 1))
  return jax.jit(run).lower(*args).compile(), args


def time_once(program, args, clock):
  start = clock()
  jax.block_until_ready(program(*args))
  return clock() - start


def cached_steps(length):
  return 96 if length <= 2048 else 48  # multiples of 48: whole cycles of factors 3 and 16


def best_times(programs, flags, clock):
  """Best of `rounds` interleaved runs per program (uncached ones `uncached_rounds` times)."""
  times = {key: [] for key in programs}
  for round_index in range(flags.rounds):
    for key, (program, args, _, _) in programs.items():
      if key[1] != "uncached" or round_index < flags.uncached_rounds:
        times[key].append(time_once(program, args, clock))
  return {key: min(values) for key, values in times.items()}


def measure_length(models, length, flags, clock):
  """Compiles every (model, mode) program for one length, then times them in interleaved rounds (best of)."""
  programs = {}
  steps = cached_steps(length)
  for name, (cfg, params, uncached) in models.items():
    if cfg.kind == "retina" and max(start for start, _ in cfg.parsed_scales.windows) >= length:
      continue  # a window would start beyond the context
    begin = time.perf_counter()
    positions = range(length - steps - 1, length - 1)
    programs[name, "cached"] = (*cached_program(cfg, params, length, positions), steps, time.perf_counter() - begin)
    if uncached and length <= flags.uncached_max:
      begin = time.perf_counter()
      programs[name, "uncached"] = (*uncached_program(cfg, params, length, flags.uncached_steps),
                                    flags.uncached_steps, time.perf_counter() - begin)
  best = best_times(programs, flags, clock)
  rows = []
  for (name, mode), (_, _, count, compile_s) in programs.items():
    cfg = models[name][0]
    rows.append(dict(model=name, kind=cfg.kind, equivalent_layers=round(equivalent_layers(cfg), 2), length=length,
                     mode=mode, compile_s=round(compile_s, 2), steps=count, seconds=round(best[name, mode], 4),
                     ms_per_token=round(1e3 * best[name, mode] / count, 3),
                     tokens_per_s=round(count / best[name, mode], 2)))
    print(json.dumps(rows[-1]), flush=True)
  return rows


def profile_hourglass(models, length, flags, clock):
  """Per-token cost of the hourglass step's parts: 'off' steps (position % 3 != 0: full-resolution layers and the
  up-sampling row only), 'on' steps (a shortened token completes: shorten, 8 or 24 shortened layers, up-sampling
  rows), against a vanilla stack with the full-resolution layers alone."""
  steps = 48
  base = (length - 3 * steps) // 48 * 48  # a multiple of 3: a shortened token completes there
  programs = {}
  vanilla4 = ModelConfig(**DIMS, kind="vanilla", hierarchy="4@1")
  params4 = decode.unbox_params(random_variables(build_model(vanilla4), jnp.zeros((1, 8), jnp.int32)))
  programs["vanilla 4@1", "step"] = (*cached_program(vanilla4, params4, length, range(base, base + steps)), steps,
                                     0.0)
  for name, (cfg, params, _) in models.items():
    if cfg.kind != "hourglass":
      continue
    for part, positions in (("off", [base + 1] * steps), ("on", [base] * steps),
                            ("sequence", range(base, base + steps))):
      programs[name, part] = (*cached_program(cfg, params, length, positions), steps, 0.0)
  best = best_times(programs, flags, clock)
  ms = {key: round(1e3 * value / steps, 3) for key, value in best.items()}
  rows = []
  for name in sorted({key[0] for key in ms if key[0].startswith("hourglass")}):
    off, on, seq = ms[name, "off"], ms[name, "on"], ms[name, "sequence"]
    rows.append(dict(model=name, length=length, off_ms=off, on_ms=on, sequence_ms=seq,
                     shortened_level_ms_per_token=round((on - off) / 3, 3), vanilla_4_ms=ms["vanilla 4@1", "step"],
                     predicted_sequence_ms=round((2 * off + on) / 3, 3)))
    print(json.dumps(rows[-1]), flush=True)
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
  parser.add_argument("--models", default="", help="a ';'-separated subset of the model names (default: all)")
  parser.add_argument("--uncached_max", type=int, default=2048, help="longest length timed without the cache")
  parser.add_argument("--uncached_steps", type=int, default=3)
  parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per length (best of)")
  parser.add_argument("--uncached_rounds", type=int, default=1)
  parser.add_argument("--profile_length", type=int, default=2048, help="0 = no hourglass step profile")
  parser.add_argument("--threads", default="1", help="XLA CPU threads; 0 = XLA's default (all cores)")
  parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
  parser.add_argument("--results_dir", default=str(RESULTS))
  flags = parser.parse_args()
  clock = time.process_time if flags.clock == "cpu" else time.perf_counter
  lengths = [int(x) for x in flags.lengths.split(",")]
  chosen = flags.models.split(";") if flags.models else list(MODELS)
  models = {}
  for name in chosen:
    fields, uncached = MODELS[name]
    cfg = ModelConfig(**DIMS, **fields)
    params = decode.unbox_params(random_variables(build_model(cfg), jnp.zeros((1, 512), jnp.int32)))
    models[name] = (cfg, params, uncached)
  rows = []
  for length in lengths:
    rows += measure_length(models, length, flags, clock)
  profile = profile_hourglass(models, flags.profile_length, flags, clock) if flags.profile_length else []
  write(rows, profile, lengths, flags)


def rate(rows, model, length, mode="cached"):
  found = [r["tokens_per_s"] for r in rows if (r["model"], r["length"], r["mode"]) == (model, length, mode)]
  return found[0] if found else None


def ratio(a, b):
  return round(a / b, 2) if a and b else None


def write(rows, profile, lengths, flags):
  names = [n for n in MODELS if any(r["model"] == n for r in rows)]
  table = []
  for length in lengths:
    entry = dict(length=length)
    for name in names:
      entry[f"{name} cached"] = rate(rows, name, length)
      entry[f"{name} uncached"] = rate(rows, name, length, "uncached")
      entry[f"cached/uncached {name}"] = ratio(entry[f"{name} cached"], entry[f"{name} uncached"])
    for a, b in PAIRS:
      entry[f"{a} / {b}"] = ratio(rate(rows, a, length), rate(rows, b, length))
    table.append(entry)
  machine = dict(cpu_count=os.cpu_count(), platform=platform.platform(), processor=platform.processor(),
                 jax=jax.__version__, backend=jax.default_backend(), load_average=os.getloadavg(),
                 xla_threads=flags.threads, clock=flags.clock,
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
  results = pathlib.Path(flags.results_dir)
  results.mkdir(parents=True, exist_ok=True)
  report = dict(machine=machine, dims=DIMS, models={n: MODELS[n][0] for n in names}, rows=rows, table=table,
                profile=profile)
  (results / "decode_speed.json").write_text(json.dumps(report, indent=2) + "\n")
  (results / "decode_speed.md").write_text(markdown(report, names))
  print((results / "decode_speed.md").read_text())


def markdown(report, names) -> str:
  machine, table = report["machine"], report["table"]
  fmt = lambda x: "-" if x is None else f"{x:g}"
  clock = "CPU time on one XLA thread" if machine["clock"] == "cpu" else "wall-clock time"
  eq = {r["model"]: r["equivalent_layers"] for r in report["rows"]}
  lines = [f"# Decoding speed: tokens/s, batch 1, d_model {DIMS['d_model']}", "",
           f"{clock}; {machine['cpu_count']} CPU cores, jax {machine['jax']} {machine['backend']}, load average "
           f"{machine['load_average'][0]:.1f}, {machine['date']}. Cached = KV-cache decoding "
           "(hourglass_jax.model.decode); uncached = one full forward over the padded length per token. "
           "Equivalent layers = every layer weighted by 1 / its total shortening factor.", "",
           "| model | equivalent layers | " + " | ".join(str(e["length"]) for e in table) + " |",
           "|---|---:|" + "---:|" * len(table)]
  for name in names:
    lines.append(f"| {name} (cached) | {eq[name]:g} | " + " | ".join(fmt(e[f"{name} cached"]) for e in table) + " |")
  for name in names:
    if any(e[f"{name} uncached"] for e in table):
      lines.append(f"| {name} (uncached) | {eq[name]:g} | "
                   + " | ".join(fmt(e[f"{name} uncached"]) for e in table) + " |")
  lines += ["", "Speed-ups (ratio of tokens/s):", "", "| ratio | " + " | ".join(str(e["length"]) for e in table)
            + " |", "|---|" + "---:|" * len(table)]
  for name in names:
    if any(e[f"cached/uncached {name}"] for e in table):
      lines.append(f"| cached / uncached {name} | " + " | ".join(fmt(e[f"cached/uncached {name}"]) for e in table)
                   + " |")
  for a, b in PAIRS:
    if a in names and b in names:
      lines.append(f"| {a} / {b} | " + " | ".join(fmt(e[f"{a} / {b}"]) for e in table) + " |")
  if report["profile"]:
    lines += ["", "Hourglass step profile (ms per step, same clock): off = a step where no shortened token completes "
              "(position % 3 != 0), on = a step where one does, sequence = consecutive positions; the shortened "
              "level's cost per token = (on - off) / 3; vanilla 4@1 = the full-resolution layers alone.", "",
              "| model | length | off | on | sequence | (2 off + on) / 3 | shortened level per token | vanilla 4@1 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in report["profile"]:
      lines.append(f"| {p['model']} | {p['length']} | {p['off_ms']:g} | {p['on_ms']:g} | {p['sequence_ms']:g} | "
                   f"{p['predicted_sequence_ms']:g} | {p['shortened_level_ms_per_token']:g} | "
                   f"{p['vanilla_4_ms']:g} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()
