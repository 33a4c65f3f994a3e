"""The `data` config section, declared once (hourglass_jax/runtime/settings.py), with the dataset its name resolves
to."""

import dataclasses

from hourglass_jax.data import catalog
from hourglass_jax.data.batches.eval_windows import PROTOCOLS
from hourglass_jax.data.catalog import SPLIT_ALIASES, SPLIT_NAMES
from hourglass_jax.runtime.settings import Section

SPLITS = (*SPLIT_NAMES, *SPLIT_ALIASES)  # the split names and the configs' spellings of them


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSettings(Section):
  """What a run reads and how it is scored; the datasets are in hourglass_jax/data/catalog.py and docs/data.md."""
  # a TFDS dataset ('stdlib_text' = the embedded offline corpus, 'enwik8', 'text_files', 'digits' = offline images,
  # 'cifar10', 'downsampled_imagenet/32x32' | '/64x64'), or 'text_file' (path) | 'synthetic' (random tokens)
  name: str = "stdlib_text"
  path: str = ""  # name='text_file': the file to read (split 90/5/5 in order)
  data_dir: str = ""  # the TFDS data directory ('' = $TFDS_DATA_DIR, else ~/tensorflow_datasets)
  seq_len: int = 256  # the training window, in tokens
  train_stride: int = 64  # bytes between the starts of training windows (0 = seq_len / 4)
  batch_size: int = 8  # the global batch (all devices and processes)
  eval_split: str = "valid"  # the split the periodic evaluations score ('valid' or 'test')
  eval_batches: int = 0  # batches per periodic evaluation (0 = the whole split)
  # 'windows' (non-overlapping) | 'sliding' (stride W/2, score the last W/2) | 'long_context' (score the last
  # W - eval_context of each window), over windows W of eval_seq_len; images are scored as whole sequences
  eval_protocol: str = "windows"
  eval_seq_len: int = 0  # the evaluation window (0 = seq_len)
  eval_context: int = 0  # 'long_context': the tokens of each window read as context only, not scored
  # what `name` is (text or image, its image shape...), looked up once when the section is made: not a setting
  spec: catalog.DatasetSpec = dataclasses.field(init=False, repr=False, compare=False)
  NAME = "data"

  def check_values(self) -> None:
    self.at_least(1, "seq_len", "batch_size")
    self.at_least(0, "train_stride", "eval_batches", "eval_seq_len", "eval_context")
    self.choice("eval_split", SPLITS)
    self.choice("eval_protocol", PROTOCOLS)
    object.__setattr__(self, "spec", catalog.spec(self.name))  # an unknown name is refused here, in one line
