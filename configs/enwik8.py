"""enwik8 as in the Hourglass paper: 5@1 24@3 5@1, d 512, attention(avg) / attention(repeat), dropout 0.2."""

from hourglass_jax.config_base import base_config


def get_config():
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=512, num_heads=8, d_ff=2048, hierarchy="5@1 24@3 5@1",
                   shorten="attention_avg", upsample="attention_repeat", dropout=0.2)
  cfg.data.update(name="enwik8", seq_len=2049, train_stride=512, batch_size=8)
  cfg.train.update(steps=263_000, learning_rate=4.1e-4, schedule="cosine", warmup_steps=4_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=5_000)
  cfg.checkpoint.update(every_steps=2_000)
  return cfg
