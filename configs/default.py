"""Default: a CPU-sized Hourglass on the embedded offline corpus (the `make train` job, a few minutes on 2 cores).

    --config=configs/default.py:self_draft  adds 4 draft heads, so that the model drafts for itself in speculative
                                            decoding (hourglass-sample --draft=self; docs/generation.md)
"""

from hourglass_jax.config.base import base_config

VARIANTS = ("self_draft",)


def get_config(variant: str = ""):
  if variant not in ("",) + VARIANTS:
    raise ValueError(f"--config=configs/default.py:{variant}: no such variant; use one of {', '.join(VARIANTS)} "
                     "or none.")
  cfg = base_config()
  # avg/repeat: the best fixed resampling at this size in benchmarks/shortening_study.py (docs/choosing.md). The
  # training recipe is the study's (learning rate 3e-3, 5% warmup, no dropout, windows every seq_len bytes): after
  # 1,000 steps 1.82 bits/byte on the whole valid split against 2.20 with 1e-3, dropout 0.1 and stride 64
  # (benchmarks/results/cli_output.md).
  cfg.model.update(d_model=128, num_heads=4, d_ff=512, hierarchy="2@1 4@3 2@1", dropout=0.0, shorten="avg",
                   upsample="repeat")
  cfg.data.update(name="stdlib_text", seq_len=256, train_stride=256, batch_size=8, eval_batches=20)
  cfg.train.update(steps=160, learning_rate=3e-3, warmup_steps=8, log_every=10, eval_every=80, sample_bytes=128)
  cfg.checkpoint.update(every_steps=80)
  if variant == "self_draft":  # heads for bytes t+2 .. t+5, trained beside the model (model/draft_heads.py)
    cfg.model.update(draft_heads=4, draft_heads_from="last", draft_loss_weight=0.3)
  return cfg
