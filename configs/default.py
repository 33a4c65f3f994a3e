"""Default: a CPU-sized Hourglass on the embedded offline corpus (the `make train` job)."""

from hourglass_jax.config_base import base_config


def get_config():
  cfg = base_config()
  cfg.model.update(d_model=128, num_heads=4, d_ff=512, hierarchy="2@1 4@3 2@1", dropout=0.1)
  cfg.data.update(name="stdlib_text", seq_len=256, train_stride=64, batch_size=8)
  cfg.train.update(steps=300, learning_rate=1e-3, warmup_steps=30, log_every=10, eval_every=100)
  return cfg
