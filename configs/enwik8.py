"""enwik8 as in the Hourglass paper: 5@1 24@3 5@1, d 512, attention(avg) / attention(repeat), dropout 0.2."""

from hourglass_jax.config.base import base_config
from hourglass_jax.config.pod_scale import apply_preset


def get_config(preset: str = ""):
  """The paper's settings; `:pod`, `:pod_fsdp` or `:pod_tensor` for a TPU pod slice (hourglass_jax/config/pod_scale.py)."""
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=512, num_heads=8, d_ff=2048, hierarchy="5@1 24@3 5@1",
                   shorten="attention_avg", upsample="attention_repeat", dropout=0.2)
  # Prepare first: hourglass-data prepare enwik8 [--manual_dir=DIR_WITH_enwik8.zip] [--data_dir=DIR].
  # Eval: the paper's long-context protocol (128-byte chunks after 6784 bytes of context, 6912 in all). Periodic
  # evals score the first 50 batches (a partial score, said so); hourglass-eval scores the whole split.
  cfg.data.update(name="enwik8", data_dir="", seq_len=2049, train_stride=512, batch_size=8, eval_split="valid",
                  eval_protocol="long_context", eval_seq_len=6912, eval_context=6784, eval_batches=50)
  cfg.train.update(steps=263_000, learning_rate=4.1e-4, schedule="cosine", warmup_steps=4_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=5_000)
  cfg.checkpoint.update(every_steps=2_000)
  return apply_preset(cfg, preset, "enwik8")
