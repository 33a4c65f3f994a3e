"""Downsampled ImageNet 64x64 as in the Hourglass paper: 3@1 12@3 3@1, d 768, linear / linear."""

from hourglass_jax.config.base import base_config
from hourglass_jax.config.pod_scale import LONG_SEQUENCE_PRESETS, apply_preset


def get_config(preset: str = ""):
  """The paper's settings; `:pod`, `:pod_fsdp` or `:pod_tensor` for a TPU pod slice (hourglass_jax/config/pod_scale.py)."""
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=768, num_heads=8, d_ff=3072, hierarchy="3@1 12@3 3@1",
                   shorten="linear", upsample="linear", dropout=0.0)
  # Prepare first: hourglass-data prepare downsampled_imagenet/64x64 --manual_dir=DIR_WITH_THE_TARS [--data_dir=DIR].
  cfg.data.update(name="downsampled_imagenet/64x64", data_dir="", seq_len=12288, train_stride=12288, batch_size=8,
                  eval_split="validation")
  cfg.train.update(steps=500_000, learning_rate=3.5e-4, schedule="rsqrt", warmup_steps=8_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=10_000)
  cfg.checkpoint.update(every_steps=2_000)
  return apply_preset(cfg, preset, "imagenet64", LONG_SEQUENCE_PRESETS)
