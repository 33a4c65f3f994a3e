"""Multi-scale LM presets mirroring the BookCorpus ablations of Subramanian et al. (2020), byte-level.

Pick one with `--config=configs/bookcorpus.py:PRESET`, e.g. `configs/bookcorpus.py:topdown_64_16_4_1`; add `_tiny`
(`topdown_64_16_4_1_tiny`) for the same architecture at d 32 / 4 heads / ff 64 on 128-byte windows of the
embedded corpus, a CPU-sized run. Full size: d 512 / 8 heads / ff 2048 on 512-token windows, vocab 256 (bytes:
there is no BookCorpus tokenizer here). Shorter scale lists take the trailing part of the paper's 2,4,8,12 layers,
so every model has 12 layers at scale 1. The training settings are this project's, not the paper's.
"""

from hourglass_jax.config.base import base_config

MULTISCALE_DEFAULTS = dict(scales="64,16,4,1", layers_per_scale="2,4,8,12", heads_per_scale="", downsampler="avg",
                           upsampler="transposed_conv", retina_windows="")
PRESETS = {
    "vanilla": dict(kind="vanilla", hierarchy="12@1"),
    "topdown_4_1": dict(kind="topdown", scales="4,1", layers_per_scale="8,12"),
    "topdown_16_4_1": dict(kind="topdown", scales="16,4,1", layers_per_scale="4,8,12"),
    "topdown_64_16_4_1": dict(kind="topdown", scales="64,16,4,1", layers_per_scale="2,4,8,12"),
    "bottomup_64_16_4_1": dict(kind="bottomup", scales="64,16,4,1", layers_per_scale="2,4,8,12"),
    "retina_16_4_1": dict(kind="retina", hierarchy="12@1", scales="16,4,1", heads_per_scale="2,2,4",
                          retina_windows="0:8,8:256,256:512"),
}
TINY = dict(d_model=32, num_heads=4, d_ff=64)
TINY_RETINA = dict(heads_per_scale="1,1,2", retina_windows="0:8,8:64,64:128")
NAMES = tuple(PRESETS) + tuple(f"{name}_tiny" for name in PRESETS)


def get_config(preset: str = "topdown_64_16_4_1"):
  if preset not in NAMES:
    raise ValueError(f"configs/bookcorpus.py: unknown preset {preset!r}; choose one of {', '.join(NAMES)}.")
  name = preset.removesuffix("_tiny")
  tiny = name != preset
  cfg = base_config()
  cfg.model.update(vocab_size=256, d_model=512, num_heads=8, d_ff=2048, dropout=0.1, **MULTISCALE_DEFAULTS)
  cfg.model.update(PRESETS[name])
  cfg.data.update(name="bookcorpus", seq_len=512, train_stride=512, batch_size=16)
  cfg.train.update(steps=200_000, learning_rate=3e-4, schedule="cosine", warmup_steps=4_000,
                   b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0, eval_every=5_000)
  cfg.checkpoint.update(every_steps=2_000)
  if tiny:
    cfg.model.update(dropout=0.0, **TINY)
    if cfg.model.kind == "retina":
      cfg.model.update(TINY_RETINA)
    cfg.data.update(name="stdlib_text", seq_len=128, train_stride=32, batch_size=4)
    cfg.train.update(steps=20, learning_rate=3e-3, warmup_steps=2, log_every=5, eval_every=10)
    cfg.checkpoint.update(every_steps=10, keep=2)
  return cfg
