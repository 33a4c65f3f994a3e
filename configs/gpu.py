"""One 80 GB GPU (an H100), bfloat16: the enwik8 model at four times the paper's batch, or a larger byte-level model.

    hourglass-train --config=configs/gpu.py --workdir=...            the paper's enwik8 model (5@1 24@3 5@1, d 512),
                                                                      batch 32, attention dropout 0.2 (the fused
                                                                      Pallas kernel: attention_impl='auto' on a GPU)
    hourglass-train --config=configs/gpu.py:large --workdir=...      d 1024, 16 heads, 4@1 24@3 4@1: about 400M
                                                                      parameters, batch 16
    hourglass-train --config=configs/gpu.py:dynamic --workdir=...    learned shortening (whitespace, 2@1 8@4 2@1)
    hourglass-train --config=configs/gpu.py:fixed --workdir=...      its fixed twin (avg pooling, same levels)

The batches are sized from the compiled step's memory analysis (benchmarks/device_check.py prints it); the
learning rate is the paper's, not retuned for the batch. Steps and intervals keep the paper's tokens (scaled by
8 / batch). How each step executes (`EXECUTION`: stacks unrolled, no remat) is chosen by the calibrated offline
estimate of benchmarks/gpu_offline.py (docs/gpu.md), not by habit; the function is the same either way.
"""

import importlib.util
import pathlib

from hourglass_jax.config.dynamic import with_dynamic_shortening

PRESETS = {
    "": dict(batch_size=32, model=dict()),
    "large": dict(batch_size=16, model=dict(d_model=1024, num_heads=16, d_ff=4096, hierarchy="4@1 24@3 4@1")),
    # capacity 1.0: a fixed level's slots and FLOPs, so :dynamic and :fixed cost the same per step
    "dynamic": dict(batch_size=32, model=dict(hierarchy="2@1 8@4 2@1", dropout=0.1, segment_capacity=1.0),
                    predictor="whitespace"),
    "fixed": dict(batch_size=32, model=dict(hierarchy="2@1 8@4 2@1", dropout=0.1, shorten="avg",
                                            upsample="repeat")),
}


# Execution only (same function, same parameters), per preset, from benchmarks/results/gpu_offline.md: every
# stack unrolled (scan_unroll=0: no loop bookkeeping, the whole step one CUDA graph; half the kernels of a scanned
# step) and no remat (with the stacks unrolled, remat dots_saveable estimates slower and every preset fits 80 GB).
EXECUTION = {preset: dict(scan_unroll=0, remat_policy="none") for preset in PRESETS}


def _enwik8_config():
  """configs/enwik8.py's settings (config files are loaded by path, not imported as a package)."""
  spec = importlib.util.spec_from_file_location("enwik8", pathlib.Path(__file__).with_name("enwik8.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(preset: str = ""):
  if preset not in PRESETS:
    raise ValueError(f"configs/gpu.py: unknown preset {preset!r}; choose one of "
                     f"{', '.join(repr(p) for p in PRESETS)} (e.g. --config=configs/gpu.py:large).")
  chosen = PRESETS[preset]
  cfg = _enwik8_config()
  ratio = cfg.data.batch_size / chosen["batch_size"]
  execution = EXECUTION[preset]
  cfg.model.update(dtype="bfloat16", scan_unroll=execution["scan_unroll"], remat_policy=execution["remat_policy"],
                   **chosen["model"])
  if "predictor" in chosen:
    cfg = with_dynamic_shortening(cfg, chosen["predictor"], "gpu")
  cfg.data.batch_size = chosen["batch_size"]
  cfg.train.update(steps=max(1, round(cfg.train.steps * ratio)),
                   warmup_steps=max(1, round(cfg.train.warmup_steps * ratio)),
                   eval_every=max(100, round(cfg.train.eval_every * ratio)))
  cfg.checkpoint.every_steps = max(100, round(cfg.checkpoint.every_steps * ratio))
  cfg.data.eval_batches = max(1, round(cfg.data.eval_batches * ratio))
  return cfg
