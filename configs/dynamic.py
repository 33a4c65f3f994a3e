"""Learned shortening on one CPU: a small Hourglass whose shortened level pools segments with dynamic boundaries
(dynamic token pooling, Nawrot et al. 2023) on the embedded corpus (Python code); minutes on a laptop.

    .venv/bin/hourglass-train --config=configs/dynamic.py:whitespace --workdir=workdirs/dynamic
    (the default without :NAME; or :routing, :entropy, :gumbel; :whitespace,gumbel nests two dynamic levels, one
    name per level)

Each predictor aims at one boundary per 4 bytes: 'whitespace' closes a segment after every ASCII punctuation byte
and once per run of spaces (0.245 boundaries a byte of Python); 'routing' (H-Net) where a position differs from the
one before, held near the target by its ratio loss (weight 0.3 for one level); 'entropy' (BLT) where its own
next-byte head gets less sure; 'gumbel' where a small MLP's sampled cut says so. A further predictor pools the
segments of the level above ('gumbel' or 'routing' there), each level past the first with 2 layers before and after
it and 4 at the center. segment_capacity=1.0 gives the shortened level as many slots as a fixed level at factor 4
has, so it costs what a fixed level does (docs/choosing.md#learned-shortening)."""

from hourglass_jax.config.base import base_config
from hourglass_jax.config.dynamic import with_dynamic_shortening
from hourglass_jax.model.hourglass import CODE_BOUNDARY_BYTES


def get_config(predictor: str = "whitespace"):  # the lowest bits per byte in the study (docs/choosing.md)
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=128, num_heads=4, d_ff=512, hierarchy="2@1 4@4 2@1", dropout=0.0,
                   segment_capacity=1.0)
  cfg.data.update(name="stdlib_text", seq_len=256, batch_size=16, eval_batches=20)
  cfg.train.update(steps=2_000, learning_rate=1e-3, warmup_steps=100, log_every=50, eval_every=500)
  cfg.checkpoint.update(every_steps=500)
  cfg = with_dynamic_shortening(cfg, predictor, "dynamic", inner_layers=(2, 4), cpu=True)
  # The default bytes cut Python at 0.40 (indentation: a cut per space); these at 0.245, English alike (0.237).
  cfg.model.update(boundary_bytes=CODE_BOUNDARY_BYTES.decode(), boundary_run_bytes=" ")
  return cfg
