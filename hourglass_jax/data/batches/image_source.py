"""Image records (from tfds_io.open_split) as token sequences for the grain pipelines: one image = one sequence of
H*W*C values; `open_images` opens a configured image dataset's split (training, evaluation, sampling prompts)."""

import numpy as np

from hourglass_jax.data.batches.images import images_to_tokens
from hourglass_jax.data.batches.settings import DataSettings

START_TOKEN = 0


class ImageSource:
  """`[i] -> int32[1 + H*W*C]`: a start token (0) then image i in raster order, channels interleaved, so the model
  predicts all H*W*C values (bits per dim count each of them)."""

  def __init__(self, records, key: str = "image"):
    if not len(records):
      raise ValueError("the split holds no images; prepare the dataset again.")
    self.records, self.key = records, key
    self.shape = tuple(np.asarray(records[0][key]).shape)
    if len(self.shape) == 2:  # a grey image stored without its channel axis
      self.shape = (*self.shape, 1)

  @property
  def seq_len(self) -> int:
    return int(np.prod(self.shape))

  def __len__(self) -> int:
    return len(self.records)

  def image(self, index: int) -> np.ndarray:
    """Image `index` as uint8 [H, W, C]."""
    image = np.asarray(self.records[int(index)][self.key], np.uint8)
    if image.size != self.seq_len:
      raise ValueError(f"image {index} has shape {image.shape}, not {self.shape} like the first one; this split "
                       "mixes image sizes, which one sequence length cannot hold.")
    return image.reshape(self.shape)

  def __getitem__(self, index: int) -> np.ndarray:
    tokens = images_to_tokens(self.image(index)[None])[0]
    return np.concatenate([np.array([START_TOKEN], np.int32), tokens])


def open_images(data: DataSettings, split: str) -> ImageSource:
  """`split` of the image dataset `data` names, checked against data.seq_len (one image is one sequence)."""
  from hourglass_jax.data.io import tfds_io  # pylint: disable=import-outside-toplevel  (TFDS import costs ~1 s)

  source = ImageSource(tfds_io.open_split(data.spec, split, data.data_dir))
  if source.seq_len != data.seq_len:
    raise ValueError(f"{data.name} {split} images are {'x'.join(map(str, source.shape))} = {source.seq_len} values "
                     f"but data.seq_len={data.seq_len}; set data.seq_len={source.seq_len}.")
  return source
