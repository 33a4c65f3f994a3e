"""Default: a CPU-sized Hourglass on the embedded offline corpus (the `make train` job, a few minutes on 2 cores)."""

from hourglass_jax.config.base import base_config


def get_config():
  cfg = base_config()
  # avg/repeat: the best fixed resampling at this size in benchmarks/shortening_study.py (docs/choosing.md)
  cfg.model.update(d_model=128, num_heads=4, d_ff=512, hierarchy="2@1 4@3 2@1", dropout=0.1, shorten="avg",
                   upsample="repeat")
  cfg.data.update(name="stdlib_text", seq_len=256, train_stride=64, batch_size=8, eval_batches=20)
  cfg.train.update(steps=160, learning_rate=1e-3, warmup_steps=16, log_every=10, eval_every=80, sample_bytes=128)
  cfg.checkpoint.update(every_steps=80)
  return cfg
