"""Random access to one split's bytes, stored as fixed-size chunk records (see byte_builder.py)."""

import threading

import numpy as np

_CACHED_CHUNKS = 8


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
