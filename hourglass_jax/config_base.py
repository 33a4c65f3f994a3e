"""The shared ConfigDict skeleton every `configs/*.py` starts from (sections model, data, train, mesh, checkpoint)."""

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section; config files override what their experiment changes."""
  cfg = ml_collections.ConfigDict()

  cfg.model = ml_collections.ConfigDict(dict(
      kind="hourglass", vocab_size=256, d_model=512, num_heads=8, d_ff=2048, hierarchy="5@1 24@3 5@1",
      shorten="attention_avg", upsample="attention_repeat", position="rope", dropout=0.0, dtype="float32",
      attention_impl="auto"))

  cfg.data = ml_collections.ConfigDict(dict(
      name="stdlib_text", seq_len=256, train_stride=64, batch_size=8))

  cfg.train = ml_collections.ConfigDict(dict(
      steps=1000, learning_rate=1e-3, schedule="cosine", warmup_steps=100, b1=0.9, b2=0.98, eps=1e-9,
      weight_decay=0.0, grad_clip_norm=1.0, seed=0, log_every=10, eval_every=200))

  cfg.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  cfg.checkpoint = ml_collections.ConfigDict(dict(every_steps=200, keep=3))
  return cfg
