"""The `data` config section, declared once (hourglass_jax/settings.py)."""

import dataclasses

from hourglass_jax.data.catalog import SPLIT_ALIASES, SPLIT_NAMES
from hourglass_jax.data.eval_windows import PROTOCOLS
from hourglass_jax.settings import Section

SPLITS = (*SPLIT_NAMES, *SPLIT_ALIASES)  # the split names and the configs' spellings of them


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSettings(Section):
  """name: a TFDS dataset ('stdlib_text' = the embedded offline corpus, 'enwik8', 'text_files', 'digits' = offline
  images, 'cifar10', 'downsampled_imagenet/32x32' | '/64x64'; hourglass_jax/data/catalog.py) read from data_dir
  ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets), or 'text_file' (path, read directly) | 'synthetic' (random
  tokens, benchmarks). train_stride 0 = seq_len / 4. batch_size is global (all devices). eval_protocol: 'windows'
  (non-overlapping) | 'sliding' (stride W/2, score the last W/2) | 'long_context' (score the last W - eval_context
  of each window), over windows of eval_seq_len (0 = seq_len); images are whole sequences. eval_batches: batches
  per periodic evaluation, 0 = the whole split."""
  name: str = "stdlib_text"
  path: str = ""
  data_dir: str = ""
  seq_len: int = 256
  train_stride: int = 64
  batch_size: int = 8
  eval_split: str = "valid"
  eval_batches: int = 0
  eval_protocol: str = "windows"
  eval_seq_len: int = 0
  eval_context: int = 0
  NAME = "data"

  def check_values(self) -> None:
    self.at_least(1, "seq_len", "batch_size")
    self.at_least(0, "train_stride", "eval_batches", "eval_seq_len", "eval_context")
    self.choice("eval_split", SPLITS)
    self.choice("eval_protocol", PROTOCOLS)
