"""Tiny: the smallest useful model, for tests and smoke runs (seconds on one CPU core)."""

from hourglass_jax.config.base import base_config


def get_config():
  cfg = base_config()
  cfg.model.update(d_model=32, num_heads=4, d_ff=64, hierarchy="1@1 2@3 1@1", dropout=0.0)
  cfg.data.update(name="stdlib_text", seq_len=48, train_stride=12, batch_size=4)
  cfg.data.update(eval_batches=8)
  cfg.train.update(steps=20, learning_rate=3e-3, warmup_steps=2, log_every=5, eval_every=10)
  cfg.checkpoint.update(every_steps=10, keep=2)
  return cfg
