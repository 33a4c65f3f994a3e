"""Images <-> token sequences (raster order, channels interleaved per pixel: R,G,B,R,G,B,...; vocab 256) and PNG
grids of samples."""

import math

import numpy as np
from etils import epath

from hourglass_jax.runtime import files, paths


def _check_uint8_images(images: np.ndarray, what: str) -> np.ndarray:
  images = np.asarray(images)
  if images.ndim != 4:
    raise ValueError(f"{what} must be [N, H, W, C]; got shape {images.shape}.")
  if images.dtype != np.uint8:
    raise ValueError(f"{what} must be uint8 (0..255); got {images.dtype}. Convert with np.clip(x, 0, 255)"
                     ".astype(np.uint8) first.")
  return images


def images_to_tokens(images_NxHxWxC: np.ndarray) -> np.ndarray:
  """uint8 [N, H, W, C] -> int32 [N, H*W*C]: row by row, left to right, the channels of a pixel together."""
  images = _check_uint8_images(images_NxHxWxC, "images")
  return images.reshape(images.shape[0], -1).astype(np.int32)


def tokens_to_images(tokens_NxT: np.ndarray, height: int, width: int, channels: int) -> np.ndarray:
  """int [N, T] with T = height * width * channels and values in 0..255 -> uint8 [N, H, W, C] (inverse of
  images_to_tokens)."""
  tokens = np.asarray(tokens_NxT)
  if tokens.ndim == 1:
    tokens = tokens[None]
  size = height * width * channels
  if tokens.ndim != 2 or tokens.shape[1] != size:
    raise ValueError(f"tokens of shape {tokens.shape} do not hold {height}x{width}x{channels} images "
                     f"({size} values each); pass [N, {size}] tokens or the image shape they came from.")
  if tokens.size and (tokens.min() < 0 or tokens.max() > 255):
    raise ValueError(f"image tokens must lie in 0..255; got {tokens.min()}..{tokens.max()} (was the model's "
                     "vocab_size 256?).")
  return tokens.astype(np.uint8).reshape(-1, height, width, channels)


def image_grid(images_NxHxWxC: np.ndarray, columns: int | None = None, pad: int = 1) -> np.ndarray:
  """The images tiled row-major into one uint8 [rows*(H+pad)+pad, columns*(W+pad)+pad, C] array (pad is black)."""
  images = _check_uint8_images(images_NxHxWxC, "images")
  n, h, w, c = images.shape
  if n == 0:
    raise ValueError("no images to tile.")
  columns = columns or math.ceil(math.sqrt(n))
  rows = math.ceil(n / columns)
  grid = np.zeros((rows * (h + pad) + pad, columns * (w + pad) + pad, c), np.uint8)
  for i, image in enumerate(images):
    top, left = pad + (i // columns) * (h + pad), pad + (i % columns) * (w + pad)
    grid[top:top + h, left:left + w] = image
  return grid


def save_png_grid(images_NxHxWxC: np.ndarray, path, columns: int | None = None, scale: int = 1,
                  inside=None) -> epath.Path:
  """Writes the images as one PNG grid (about square unless `columns` is given), each pixel `scale` x `scale`
  (nearest neighbour, for tiny images), atomically and never through a link; returns the path. `inside`: the
  workdir of a path this package chose there (its folders must not be links:
  hourglass_jax.runtime.files.make_folder)."""
  from PIL import Image

  grid = image_grid(images_NxHxWxC, columns)
  if scale > 1:
    grid = grid.repeat(scale, axis=0).repeat(scale, axis=1)
  if grid.shape[-1] not in (1, 3, 4):
    raise ValueError(f"PNG needs 1, 3 or 4 channels; the images have {grid.shape[-1]}.")
  path = paths.as_path(path)
  files.make_folder(path.parent, inside=inside)
  with files.atomic_file(path) as file:  # a local path or gs://
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(file, format="PNG")
  return path
