"""Downsampled ImageNet 64x64 as in the Hourglass paper: 3@1 12@3 3@1, d 768, linear / linear."""

from hourglass_jax.config_base import base_config


def get_config():
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=768, num_heads=8, d_ff=3072, hierarchy="3@1 12@3 3@1",
                   shorten="linear", upsample="linear", dropout=0.0)
  cfg.data.update(name="downsampled_imagenet/64x64", seq_len=12288, train_stride=12288, batch_size=8)
  cfg.train.update(steps=500_000, learning_rate=3.5e-4, schedule="rsqrt", warmup_steps=8_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=10_000)
  cfg.checkpoint.update(every_steps=2_000)
  return cfg
