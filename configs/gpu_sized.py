"""One 80 GB GPU, a model sized for your corpus by docs/choosing.md's rule: about one parameter per 5 bytes of
training text and 4 passes over it, configs/gpu.py's settings otherwise (bfloat16, batch 32 x 2049).

    hourglass-train --config=configs/gpu_sized.py:my_text.txt --workdir=workdirs/mine   # sized from the file,
                                                                                         # which it trains on
    hourglass-train --config=configs/gpu_sized.py:50MB --workdir=workdirs/mine \\
        --config.data.name=text_files --config.data.data_dir=workdirs/data/my_texts       # a size; your data set

The argument is a text file (read as data.name='text_file', split 90/5/5 in order) or the corpus size (50MB,
1.5GB; decimal units); the training text is the first 90% of it. The model is an Hourglass 2@1 8@3 2@1 with
avg/repeat resampling (the best fixed shortening at small sizes, docs/choosing.md) whose width d_model (a multiple
of 64, heads of 64) brings its parameters nearest to a fifth of the training bytes; steps make 4 passes. No
dropout (4 passes need none; watch the validation curve past them). The learning rate is configs/default.py's 3e-3
at d 128, scaled by 128 / d_model for wider models; not tuned here.
"""

import importlib.util
import math
import pathlib
import re

from hourglass_jax.model import ModelConfig
from hourglass_jax.model.counting import total_params

BYTES_PER_PARAM, PASSES, TRAIN_SHARE = 5, 4, 0.9  # the rule, and the share of a corpus the train split holds
HIERARCHY, HEAD_DIM = "2@1 8@3 2@1", 64
WIDTHS = tuple(range(128, 2049, 64))
UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


def _gpu_config():
  """configs/gpu.py's settings (config files are loaded by path, not imported as a package)."""
  spec = importlib.util.spec_from_file_location("gpu", pathlib.Path(__file__).with_name("gpu.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def corpus_bytes(corpus: str) -> tuple[int, str | None]:
  """(the corpus's size in bytes, the file to train on or None) of the config's argument."""
  path = pathlib.Path(corpus).expanduser()
  if path.is_file():
    return path.stat().st_size, str(path)
  match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)B?", corpus.strip(), re.I)
  if not match:
    raise ValueError(f"configs/gpu_sized.py: {corpus!r} is neither a file nor a size such as 50MB; pass "
                     "--config=configs/gpu_sized.py:FILE or :SIZE.")
  return int(float(match.group(1)) * UNITS[match.group(2).upper()]), None


def sized_model(train_bytes: int) -> dict:
  """The model section's size: the width whose parameter count is nearest (in ratio) to train_bytes / 5."""
  goal = train_bytes / BYTES_PER_PARAM
  shapes = [dict(d_model=d, num_heads=d // HEAD_DIM, d_ff=4 * d) for d in WIDTHS]
  counts = [total_params(ModelConfig(kind="hourglass", hierarchy=HIERARCHY, shorten="avg", upsample="repeat", **shape))
            for shape in shapes]
  best = min(range(len(shapes)), key=lambda i: abs(math.log(counts[i] / goal)))
  return shapes[best]


def get_config(corpus: str = "50MB"):
  size, file = corpus_bytes(corpus)
  train_bytes = int(size * TRAIN_SHARE)
  cfg = _gpu_config()
  shape = sized_model(train_bytes)
  cfg.model.update(hierarchy=HIERARCHY, shorten="avg", upsample="repeat", dropout=0.0, **shape)
  if file is not None:
    cfg.data.update(name="text_file", path=file)
  steps = max(1, math.ceil(PASSES * train_bytes / (cfg.data.batch_size * cfg.data.seq_len)))
  learning_rate = float(f"{3e-3 * min(1.0, 128 / shape['d_model']):.2g}")
  cfg.train.update(steps=steps, warmup_steps=max(1, steps // 20), learning_rate=learning_rate,
                   eval_every=max(1, steps // 10))
  cfg.checkpoint.every_steps = max(1, steps // 10)
  return cfg
