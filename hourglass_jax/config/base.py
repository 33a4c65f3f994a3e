"""The shared ConfigDict skeleton every `configs/*.py` starts from (sections model, data, train, mesh, checkpoint)."""

import ml_collections
from ml_collections import config_dict

from hourglass_jax.model.config import config_section_fields
from hourglass_jax.sharding import DEFAULT_RULES


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section; config files override what their experiment changes."""
  cfg = ml_collections.ConfigDict()

  # The model section is ModelConfig's fields and defaults (hourglass_jax/model/config.py documents them), so every
  # field can be overridden from the command line; fields another section sets (remat_policy: train.remat) are
  # left out. attention_dropout unset (None) = model.dropout.
  model = config_section_fields()
  cfg.model = ml_collections.ConfigDict(dict(model, attention_dropout=config_dict.placeholder(float)))

  # name: a TFDS dataset ('stdlib_text' = embedded offline corpus, 'enwik8', 'text_files', 'digits' = offline
  # images, 'cifar10', 'downsampled_imagenet/32x32' | '/64x64'; see hourglass_jax/data/catalog.py) read from
  # data_dir ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets), or 'text_file' (data.path, read directly) |
  # 'synthetic' (random tokens, benchmarks). train_stride 0 = seq_len / 4. batch_size is global (all devices).
  # eval_protocol: 'windows' (non-overlapping) | 'sliding' (stride W/2, score the last W/2) | 'long_context'
  # (score the last W - eval_context of each window), over windows of eval_seq_len (0 = seq_len); images are
  # whole sequences. eval_batches: batches per evaluation, 0 = the whole split.
  cfg.data = ml_collections.ConfigDict(dict(
      name="stdlib_text", path="", data_dir="", seq_len=256, train_stride=64, batch_size=8, eval_split="valid",
      eval_batches=0, eval_protocol="windows", eval_seq_len=0, eval_context=0))

  # schedule: 'cosine' | 'rsqrt' | 'constant', each after a linear warmup from 0. grad_clip_norm 0 = off.
  # remat: recompute each block's activations in the backward pass; remat_policy: what a block still saves,
  # 'nothing_saveable' (least memory) | 'dots_saveable' (keeps matmul outputs: less recompute, more memory).
  # peak_flops_per_device: for MFU; 0 = look the device up (GPU/TPU) or measure a float32 matmul (CPU).
  cfg.train = ml_collections.ConfigDict(dict(
      steps=1000, learning_rate=1e-3, schedule="cosine", warmup_steps=100, min_lr_ratio=0.0, b1=0.9, b2=0.98,
      eps=1e-9, weight_decay=0.0, grad_clip_norm=1.0, grad_accum_steps=1, remat=False,
      remat_policy="nothing_saveable", seed=0, log_every=10,
      eval_every=200, sample_bytes=0, peak_flops_per_device=0.0))

  # Mesh axis sizes, -1 = all remaining devices; `rules` maps logical axes to mesh axes.
  cfg.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, rules=DEFAULT_RULES))

  # every_steps 0 = save only at the end and on preemption; keep = how many of the latest checkpoints stay.
  # allow_settings_change: resume / evaluate / sample a checkpoint although model fields that change its function
  # without changing a shape (a factor in `hierarchy`, the shortening method...) differ from its recorded ones.
  # allow_unverified: restore a checkpoint that records no fingerprints (of the current format: or no settings)
  # beside its data or in Orbax's metadata (deleted, lost, or saved before fingerprints), without verifying it.
  cfg.checkpoint = ml_collections.ConfigDict(dict(every_steps=200, keep=3, async_save=True,
                                                  allow_settings_change=False, allow_unverified=False))
  return cfg
