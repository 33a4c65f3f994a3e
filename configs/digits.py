"""Offline images: a tiny Hourglass on scikit-learn's 8x8 digits (64 grey values per image, bits per dim), so image
training and sampling work on any machine (pip install 'hourglass-jax[images]'; built on first use, no download)."""

from hourglass_jax.config.base import base_config


def get_config():
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=64, num_heads=4, d_ff=256, hierarchy="1@1 2@2 1@1", shorten="linear",
                   upsample="linear", dropout=0.0)  # linear resampling: the paper's best for images
  cfg.data.update(name="digits", seq_len=64, batch_size=16, eval_split="valid", eval_batches=0)
  cfg.train.update(steps=300, learning_rate=3e-3, warmup_steps=30, log_every=20, eval_every=100, sample_bytes=0)
  cfg.checkpoint.update(every_steps=100)
  return cfg
