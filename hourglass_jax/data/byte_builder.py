"""The shared layout of this project's text datasets: each split is one byte stream stored in order as fixed-size
chunks (the last one shorter), so a reader can find byte i in chunk i // chunk_bytes without scanning."""

from typing import Iterable, Iterator

import numpy as np
import tensorflow_datasets as tfds

CHUNK_BYTES = 1 << 14  # 16 KiB: a 2 KiB window reads one or two small records (64 KiB reads cost ~1.6x more)


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
