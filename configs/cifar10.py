"""CIFAR-10 as in the Hourglass paper: 1@1 8@3 1@1, attention(linear) both ways."""

from hourglass_jax.config.base import base_config
from hourglass_jax.config.pod_scale import apply_preset


def get_config(preset: str = ""):
  """The paper's settings; `:pod`, `:pod_fsdp` or `:pod_tensor` for a TPU pod slice (hourglass_jax/config/pod_scale.py)."""
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=512, num_heads=8, d_ff=2048, hierarchy="1@1 8@3 1@1",
                   shorten="attention_linear", upsample="attention_linear", dropout=0.0)
  # Prepare first: hourglass-data prepare cifar10 [--manual_dir=DIR_WITH_cifar-10-binary.tar.gz] [--data_dir=DIR].
  cfg.data.update(name="cifar10", data_dir="", seq_len=3072, train_stride=3072, batch_size=8, eval_split="test")
  cfg.train.update(steps=100_000, learning_rate=1e-3, schedule="cosine", warmup_steps=5_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=5_000)
  cfg.checkpoint.update(every_steps=2_000)
  return apply_preset(cfg, preset, "cifar10")
