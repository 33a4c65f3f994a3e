"""Learned shortening on one CPU: a small Hourglass whose shortened level pools segments with dynamic boundaries
(dynamic token pooling, Nawrot et al. 2023) on the embedded text corpus; minutes on a laptop.

    hourglass-train --config=configs/dynamic.py:gumbel --workdir=/tmp/dynamic   (or :whitespace, :routing, :entropy)

'gumbel' learns where segments close (target: one boundary per 4 bytes); 'routing' (H-Net) closes one at a
position that differs from the one before, held near the same rate by its ratio loss (weight 0.3 here for one
level: at H-Net's 0.03 and this learning rate it drifted to 0.34 boundaries a byte in 800 steps, README);
'entropy' (BLT) ends one where its own next-byte head gets less sure, with a learned threshold; 'whitespace' closes
one after each space, newline or punctuation byte (about one per 4.2 bytes of English; here, for the Python
corpus, after every ASCII punctuation byte and once per run of spaces: 0.245 boundaries a byte). Two predictors
(:whitespace,gumbel) nest two dynamic levels, each at factor 4: the second pools the first's segments ('gumbel' or
'routing' there). The model section documents the fields."""

from hourglass_jax.config.base import base_config
from hourglass_jax.config.dynamic import ROUTING_RATIO_LOSS_WEIGHT, with_dynamic_shortening
from hourglass_jax.model.hourglass import CODE_BOUNDARY_BYTES

# At H-Net's 0.03 one routing level drifted to 0.34 boundaries a byte in 800 steps at this learning rate (0.247 at
# 0.3); the second level of :whitespace,routing held 0.248 at 0.03.
SINGLE_ROUTING_LOSS_WEIGHT = 0.3


def get_config(predictor: str = "gumbel"):
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=128, num_heads=4, d_ff=512, hierarchy="2@1 4@4 2@1", dropout=0.0,
                   segment_capacity=1.5)
  cfg.data.update(name="stdlib_text", seq_len=256, batch_size=16, eval_batches=20)
  cfg.train.update(steps=2_000, learning_rate=1e-3, warmup_steps=100, log_every=50, eval_every=500)
  cfg.checkpoint.update(every_steps=500)
  cfg = with_dynamic_shortening(cfg, predictor, "dynamic", nested_hierarchy="2@1 2@4 4@16 2@4 2@1",
                                routing_loss_weight=SINGLE_ROUTING_LOSS_WEIGHT if predictor.strip() == "routing"
                                else ROUTING_RATIO_LOSS_WEIGHT)
  # The default bytes cut Python at 0.40 (indentation: a cut per space); these at 0.245, English alike (0.237).
  cfg.model.update(boundary_bytes=CODE_BOUNDARY_BYTES.decode(), boundary_run_bytes=" ")
  return cfg
