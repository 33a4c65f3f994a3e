"""The benchmarked models, each a full training config: the vanilla baseline, Hourglass and top-down.

Default-sized (d 128, 4 heads, ff 512, configs/default.py): `vanilla` (8@1), `hourglass` (2@1 4@3 2@1 with the
paper's attention resampling, as the recorded results were measured; configs/default.py itself uses avg/repeat) and
`topdown` (scales 16,4,1 with 2,2,4 layers): 8 layers each, 4 of them at full resolution in the hierarchical ones.
`hourglass_enwik8` is configs/enwik8.py (5@1 24@3 5@1, d 512) and `vanilla_enwik8` its 10-layer full-resolution
part alone. Data is synthetic (random bytes): the step's cost does not depend on the data.
"""

from benchmarks.common import load_config

# The peer comparison's 'wide' Hourglass (issue 14's shape), as overrides of `hourglass`: d 512, 8 heads, ff 2048,
# 4/2/4 blocks at factor 4, avg / repeat.
PEER_WIDE = dict(d_model=512, num_heads=8, d_ff=2048, hierarchy="4@1 2@4 4@1", shorten="avg", upsample="repeat")

# The default-sized ones keep dropout 0.1, which configs/default.py had when their results were recorded.
PRESETS = {
    "vanilla": ("default", dict(kind="vanilla", hierarchy="8@1", dropout=0.1)),
    "hourglass": ("default", dict(shorten="attention_avg", upsample="attention_repeat", dropout=0.1)),  # the paper's
    "topdown": ("default", dict(kind="topdown", scales="16,4,1", layers_per_scale="2,2,4", dropout=0.1)),
    "hourglass_enwik8": ("enwik8", dict()),
    "vanilla_enwik8": ("enwik8", dict(kind="vanilla", hierarchy="10@1")),
}


def bench_config(preset: str, seq_len: int, batch: int, dtype: str = "float32", **model):
  """The preset's config for a `batch` x `seq_len` train step in `dtype` (compute; params stay float32)."""
  name, overrides = PRESETS[preset]
  cfg = load_config(name)
  cfg.model.update(dtype=dtype, **overrides)
  cfg.model.update(model)
  cfg.data.update(name="synthetic", seq_len=seq_len, batch_size=batch, eval_batches=1)
  cfg.train.update(steps=1_000_000, warmup_steps=10, eval_every=0, sample_bytes=0, grad_accum_steps=1)
  cfg.checkpoint.update(every_steps=0)
  return cfg
