"""The device battery's run configs (benchmarks/device_check.py): configs/gpu.py's presets as benchmark steps, at
full size or at the dry run's tiny sizes, and the timer its stages share. speculative.py and gpu_offline.py price
the same models, so they read them here rather than from the battery that runs them."""

import time

# --dry-run: every model tiny, one timed step, decoding 4 tokens.
DRY = dict(model=dict(d_model=32, num_heads=2, d_ff=64), seq_len=48, batch=2, decode_batches=(1, 2, 4),
           decode_tokens=4, hierarchy={"": "1@1 1@3 1@1", "large": "1@1 1@3 1@1", "dynamic": "1@1 1@4 1@1",
                                       "fixed": "1@1 1@4 1@1", "vanilla": "3@1"})


def train_config(preset: str, overrides: dict, dry_run: bool, case: dict | None = None):
  """configs/gpu.py's preset as a benchmark step: synthetic data, no eval, checkpoint or sample; `case` (a
  TRAIN_CASES entry) may change the batch and the remat policy."""
  from benchmarks.common import load_config

  cfg = load_config("gpu", preset)
  cfg.model.update(overrides)
  if case and case["batch"]:
    cfg.data.batch_size = case["batch"]
  if dry_run:
    hierarchy = DRY["hierarchy"]["vanilla" if cfg.model.kind == "vanilla" else preset]
    cfg.model.update(hierarchy=hierarchy, **DRY["model"])
    cfg.data.update(seq_len=DRY["seq_len"], batch_size=DRY["batch"])
  cfg.data.update(name="synthetic", eval_batches=1)
  cfg.train.update(steps=1_000_000, warmup_steps=10, eval_every=0, sample_bytes=0, grad_accum_steps=1)
  if case and case["remat"]:
    cfg.model.remat_policy = case["remat"]
  cfg.checkpoint.update(every_steps=0)
  return cfg


def decode_config(dry_run: bool):
  return train_config("", dict(dropout=0.0), dry_run)


def timed(call, measure_s: float, max_steps: int) -> list[float]:
  """Seconds per call after one untimed warm call, until `measure_s` passes or `max_steps` ran (at least one)."""
  call()
  times, deadline = [], time.perf_counter() + measure_s
  while not times or (time.perf_counter() < deadline and len(times) < max_steps):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
  return times
