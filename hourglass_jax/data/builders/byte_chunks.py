"""Text splits as fixed-size byte chunks: the layout every text dataset here is stored in, written and read back.

A split is one byte stream stored in order as records of `chunk_bytes` bytes (the last one shorter), so a reader
finds byte i in record i // chunk_bytes without scanning. The text builders (enwik8.py, text_files.py) write it with
ByteChunksBuilder and rechunk; ByteStream reads a split back as one byte array (sources.py, and prepare.py to
report what it built).
"""

import threading
from typing import Iterable, Iterator

import numpy as np
import tensorflow_datasets as tfds

CHUNK_BYTES = 1 << 14  # 16 KiB: a 2 KiB window reads one or two small records (64 KiB reads cost ~1.6x more)
_CACHED_CHUNKS = 8


def rechunk(pieces: Iterable[bytes], chunk_bytes: int) -> Iterator[tuple[int, dict]]:
  """(key, example) pairs of consecutive `chunk_bytes`-sized chunks of the concatenated pieces."""
  buffer, index = bytearray(), 0
  for piece in pieces:
    buffer += piece
    while len(buffer) >= chunk_bytes:
      yield index, {"bytes": np.frombuffer(bytes(buffer[:chunk_bytes]), np.uint8)}
      del buffer[:chunk_bytes]
      index += 1
  if buffer:
    yield index, {"bytes": np.frombuffer(bytes(buffer), np.uint8)}


class ByteChunksBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of the byte-stream builders: `chunk_bytes` (a build-time setting; readers infer it) and the info."""

  VERSION = tfds.core.Version("1.0.0")
  DESCRIPTION = ""
  HOMEPAGE = ""

  def __init__(self, *, chunk_bytes: int = CHUNK_BYTES, **kwargs):
    if chunk_bytes < 1:
      raise ValueError(f"chunk_bytes={chunk_bytes} must be positive.")
    self.chunk_bytes = chunk_bytes
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=self.DESCRIPTION, homepage=self.HOMEPAGE,
        features=tfds.features.FeaturesDict({"bytes": tfds.features.Tensor(
            shape=(None,), dtype=np.uint8, encoding=tfds.features.Encoding.BYTES)}),  # raw: no upcast to int64
        disable_shuffling=True)  # chunk k must stay record k of its split


class ByteStream:
  """`len()` bytes and `[start:stop] -> uint8[]` over a split's chunk records, reading only the chunks a slice
  touches (a window needs one or two), with the last few chunks cached."""

  def __init__(self, records, key: str = "bytes"):
    self.records, self.key = records, key
    self._cache: dict[int, np.ndarray] = {}
    self._lock = threading.Lock()  # grain reads with several threads
    count = len(records)
    if not count:
      raise ValueError("the split holds no bytes; prepare the dataset again from non-empty input.")
    self.chunk_bytes = len(self._chunk(0))
    self._len = (count - 1) * self.chunk_bytes + len(self._chunk(count - 1))

  def __len__(self) -> int:
    return self._len

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock")}  # for worker processes

  def __setstate__(self, state):
    self.__dict__.update(state, _cache={}, _lock=threading.Lock())

  def _chunk(self, index: int) -> np.ndarray:
    chunk = self._cache.get(index)
    if chunk is None:
      chunk = np.asarray(self.records[index][self.key], np.uint8)
      with self._lock:
        if len(self._cache) >= _CACHED_CHUNKS:
          del self._cache[next(iter(self._cache))]  # oldest first: windows move forward through a chunk
        self._cache[index] = chunk
    return chunk

  def __getitem__(self, key: slice) -> np.ndarray:
    if not isinstance(key, slice):
      raise TypeError("ByteStream supports slices only (stream[start:stop]).")
    start, stop, step = key.indices(self._len)
    if step != 1:
      raise ValueError("ByteStream slices must have step 1.")
    if stop <= start:
      return np.zeros(0, np.uint8)
    first, last = start // self.chunk_bytes, (stop - 1) // self.chunk_bytes
    data = np.concatenate([self._chunk(i) for i in range(first, last + 1)])
    offset = first * self.chunk_bytes
    return data[start - offset:stop - offset]

  def __array__(self, dtype=None, copy=None):
    return self[:].astype(dtype or np.uint8)
