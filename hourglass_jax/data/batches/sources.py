"""From the `data` section (a DataSettings, its dataset already resolved) to a random-access source for the grain
pipelines (make_source), with the checks the section cannot make alone (check_data_config): windows over a split's
bytes (TFDS text datasets through tfds_io, or one local file read directly), eval windows (eval_windows.py), images
as whole sequences (image_source.py), and synthetic tokens.

Every source has `len()` and `[i] -> int32[seq_len + 1]` (inputs are item[:-1], targets item[1:]); eval sources
may add `weights(i) -> float32[seq_len]` (eval_windows.py).
"""

import functools
import importlib.util
import pathlib

import numpy as np

from hourglass_jax.data import catalog
from hourglass_jax.data.batches.eval_windows import ScoredWindows, protocol_context
from hourglass_jax.data.batches.image_source import open_images
from hourglass_jax.data.batches.settings import SPLITS, DataSettings


class WindowSource:
  """Windows of `seq_len + 1` tokens starting every `stride` tokens of a 1-D token array."""

  def __init__(self, tokens: np.ndarray, seq_len: int, stride: int):
    self.tokens, self.seq_len, self.stride = tokens, seq_len, stride
    self._len = max(0, (len(tokens) - seq_len - 1) // stride + 1)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> np.ndarray:
    start = int(index) * self.stride
    return self.tokens[start:start + self.seq_len + 1].astype(np.int32)


class SyntheticSource:
  """Uniform random tokens, each window drawn from its own seed: for smoke tests and benchmarks."""

  def __init__(self, vocab_size: int, seq_len: int, seed: int, length: int = 1_000_000):
    self.vocab_size, self.seq_len, self.seed, self._len = vocab_size, seq_len, seed, length

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> np.ndarray:
    rng = np.random.default_rng((self.seed, int(index)))
    return rng.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int32)


@functools.lru_cache(maxsize=4)
def _file_bytes(path: str) -> np.ndarray:
  return np.fromfile(pathlib.Path(path).expanduser(), np.uint8)


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split {split!r} is unknown; choose one of {', '.join(SPLITS)}.")


def split_stream(data: DataSettings, split: str):
  """The bytes of one split of the text source `data` names, as an array (text_file) or a lazy ByteStream (TFDS
  datasets)."""
  _check_split(split)
  if data.name == "text_file":
    everything = _file_bytes(data.path)
    lo, hi = catalog.split_bounds(len(everything))[catalog.SPLIT_ALIASES.get(split, split)]  # 90/5/5 in order
    return everything[lo:hi]
  if data.spec.kind != "text":
    raise ValueError(f"data.name={data.name!r} is an image dataset, not a byte stream.")
  from hourglass_jax.data.io import tfds_io  # pylint: disable=import-outside-toplevel  (TFDS import costs ~1 s)
  from hourglass_jax.data.builders.byte_chunks import ByteStream  # pylint: disable=import-outside-toplevel

  return ByteStream(tfds_io.open_split(data.spec, split, data.data_dir))


def split_tokens(data: DataSettings, split: str) -> np.ndarray:
  """All bytes of one split of the text source `data` names as uint8 (stdlib_text / text_files: split by document;
  enwik8 and text_file: 90/5/5 in order)."""
  return np.asarray(split_stream(data, split), np.uint8)


def eval_geometry(data: DataSettings) -> tuple[int, int]:
  """(window, context) of the configured text eval protocol (eval_windows.py)."""
  window = data.eval_seq_len or data.seq_len
  return window, protocol_context(data.eval_protocol, window, data.eval_context)


def check_data_config(data: DataSettings, vocab_size: int) -> None:
  """What the section's own checks (its types, ranges, choices and name: data/batches/settings.py) cannot see: the
  file a text_file names, the model's vocabulary, an image's length, the eval protocol's window; before anything is
  read."""
  name, shape = data.name, data.spec.image_shape
  if name == "text_file" and not pathlib.Path(data.path).expanduser().is_file():
    raise FileNotFoundError(f"data.name='text_file' needs data.path to name a readable file; got "
                            f"data.path={data.path!r}.")
  if name != "synthetic" and vocab_size < 256:
    raise ValueError(f"data.name={name!r} yields bytes 0..255 but model.vocab_size={vocab_size}; "
                     "set model.vocab_size=256.")
  if name == "digits" and importlib.util.find_spec("sklearn") is None:
    raise ValueError("data.name='digits' needs scikit-learn, which ships the digits: pip install "
                     "'hourglass-jax[images]' (or pip install scikit-learn).")
  if shape is not None:
    if data.seq_len != int(np.prod(shape)):
      raise ValueError(f"data.seq_len={data.seq_len} but {name} images are {'x'.join(map(str, shape))} = "
                       f"{int(np.prod(shape))} values; set data.seq_len={int(np.prod(shape))} (an image is one "
                       "whole sequence).")
  elif name != "synthetic":
    eval_geometry(data)


def make_source(data: DataSettings, split: str, vocab_size: int, seed: int, *, eval_windows: bool = False):
  """The source of `split`: training windows at data.train_stride (0 = seq_len / 4), or with eval_windows the
  configured eval protocol's windows, which score every byte but the first once; images are whole sequences."""
  name, seq_len, kind = data.name, data.seq_len, data.spec.kind
  if kind == "synthetic":
    split_index = catalog.SPLIT_NAMES.index(catalog.SPLIT_ALIASES.get(split, split))
    return SyntheticSource(vocab_size, seq_len, seed + 1 + split_index)
  if kind == "image":
    return open_images(data, split)
  tokens = split_stream(data, split)
  if eval_windows:
    window, context = eval_geometry(data)
    if len(tokens) < window + 1:
      raise ValueError(f"the {split} split of data.name={name!r} ({len(tokens):,} bytes) is shorter than one eval "
                       f"window + 1 = {window + 1} bytes; lower data.eval_seq_len / data.seq_len or use a larger "
                       "corpus.")
    return ScoredWindows(tokens, window, context)
  source = WindowSource(tokens, seq_len, data.train_stride or max(1, seq_len // 4))
  if not len(source):
    raise ValueError(f"the {split} split of data.name={name!r} ({len(tokens):,} bytes) is shorter than data.seq_len "
                     f"+ 1 = {seq_len + 1} bytes; lower data.seq_len or use a larger corpus.")
  return source
