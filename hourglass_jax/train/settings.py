"""The `train` and `checkpoint` config sections, declared once (hourglass_jax/settings.py)."""

import dataclasses

from hourglass_jax.settings import Section


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSettings(Section):
  """schedule: 'cosine' | 'rsqrt' | 'constant', each after a linear warmup from 0. grad_clip_norm 0 = off. remat:
  recompute each block's activations in the backward pass; remat_policy: what a block still saves,
  'nothing_saveable' (least memory) | 'dots_saveable' (keeps matmul outputs: less recompute, more memory).
  sample_bytes: bytes sampled at the end of a run (0 = none). peak_flops_per_device: for MFU; 0 = look the device
  up (GPU/TPU) or measure a float32 matmul (CPU)."""
  steps: int = 1000
  learning_rate: float = 1e-3
  schedule: str = "cosine"
  warmup_steps: int = 100
  min_lr_ratio: float = 0.0
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0
  grad_clip_norm: float = 1.0
  grad_accum_steps: int = 1
  remat: bool = False
  remat_policy: str = "nothing_saveable"
  seed: int = 0
  log_every: int = 10
  eval_every: int = 200
  sample_bytes: int = 0
  peak_flops_per_device: float = 0.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSettings(Section):
  """every_steps 0 = save only at the end and on preemption; keep = how many of the latest checkpoints stay.
  allow_settings_change: resume / evaluate / sample a checkpoint although model fields that change its function
  without changing a shape (a factor in `hierarchy`, the shortening method...) differ from its recorded ones.
  allow_unverified: restore a checkpoint that records no fingerprints (of the current format: or no settings)
  beside its data or in Orbax's metadata (deleted, lost, or saved before fingerprints), without verifying it."""
  every_steps: int = 200
  keep: int = 3
  async_save: bool = True
  allow_settings_change: bool = False
  allow_unverified: bool = False
