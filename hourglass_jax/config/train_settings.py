"""The `train` and `checkpoint` config sections, declared once (hourglass_jax/runtime/settings.py)."""

import dataclasses

import numpy as np

from hourglass_jax.runtime.settings import Section

SCHEDULES = ("cosine", "rsqrt", "constant")
MAX_STEPS = 2**31 - 1  # the train state's step counter is int32
SEEDS = 2**32  # grain's and numpy's seeds are unsigned 32-bit integers
MIN_EPS = float(np.finfo(np.float32).tiny)  # Adam's eps in float32: a smaller one is 0 or denormal (flushed to 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSettings(Section):
  """The run's length, optimizer (AdamW), schedule, logging and evaluation intervals."""
  steps: int = 1000  # optimizer steps of the run (a larger value trains a finished run on)
  learning_rate: float = 1e-3  # the peak learning rate
  schedule: str = "cosine"  # 'cosine' | 'rsqrt' | 'constant', each after a linear warmup from 0
  warmup_steps: int = 100  # steps of the linear warmup
  min_lr_ratio: float = 0.0  # 'cosine': its final learning rate, as a fraction of learning_rate
  b1: float = 0.9  # AdamW's first-moment decay
  b2: float = 0.98  # AdamW's second-moment decay
  eps: float = 1e-9  # AdamW's epsilon
  weight_decay: float = 0.0  # AdamW's decoupled weight decay, on kernels and embeddings only
  grad_clip_norm: float = 1.0  # global-norm gradient clipping (0 = off)
  grad_accum_steps: int = 1  # micro-batches per step (the batch is split, the gradients averaged)
  seed: int = 0  # initialisation, dropout and data order
  log_every: int = 10  # steps between metrics.jsonl / TensorBoard lines
  eval_every: int = 200  # steps between evaluations (every run also evaluates at its end)
  sample_bytes: int = 0  # bytes sampled at the end of a text run (0 = none)
  # for MFU: 0 = look the device up (GPU/TPU) or measure a float32 matmul (CPU)
  peak_flops_per_device: float = 0.0
  NAME = "train"

  def check_values(self) -> None:
    self.choice("schedule", SCHEDULES)
    self.at_least(1, "steps", "grad_accum_steps", "log_every")
    self.below(MAX_STEPS + 1, "steps", "the step counter is a 32-bit integer")
    self.at_least(0, "warmup_steps", "eval_every", "sample_bytes")
    if not 0 <= self.seed < SEEDS:
      raise ValueError(f"train.seed={self.seed} must be an integer in [0, 2**32 - 1]: the data order and the "
                       "initialisation take an unsigned 32-bit seed.")
    self.positive("learning_rate")
    self.at_least(0, "weight_decay", "grad_clip_norm", "peak_flops_per_device")
    for name, usual in (("b1", 0.9), ("b2", 0.98)):  # at 1, Adam's bias correction divides by 1 - 1 = 0
      self.fraction(name, f"Adam's decay rate, usually {usual}", closed=False)
    self.fraction("min_lr_ratio", "the cosine schedule's final fraction of learning_rate", closed=True)
    if self.eps < MIN_EPS:
      raise ValueError(f"train.eps={self.eps!r} must be > 0, and at least {MIN_EPS:.2g} (float32's smallest normal "
                       "number): Adam divides by sqrt(v) + eps, and v is 0 for a parameter whose gradients have all "
                       "been 0 so far, so the update would be NaN. 1e-8 or 1e-9 is usual.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSettings(Section):
  """How often a run saves and how many checkpoints stay, and the checks a restore may skip on request."""
  every_steps: int = 200  # steps between saves (0 = only at the end and on preemption)
  keep: int = 3  # how many of the latest checkpoints stay
  async_save: bool = True  # save in the background while training goes on
  # resume / evaluate / sample a checkpoint although model fields that change its function without changing a shape
  # (a factor in `hierarchy`, the shortening method...) differ from its recorded ones
  allow_settings_change: bool = False
  # restore a checkpoint that records no fingerprints (deleted, lost, or saved before fingerprints) unverified
  allow_unverified: bool = False
  NAME = "checkpoint"

  def check_values(self) -> None:
    self.at_least(1, "keep")
    self.at_least(0, "every_steps")
