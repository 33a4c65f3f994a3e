"""Images <-> sequences (raster order, channels interleaved), PNG grids, the offline digits dataset, TFDS image
datasets read through the same path (cifar10 mocked), and numpy images built without TensorFlow."""

import importlib.util
import io
import sys
import tarfile

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.data.batches.image_source import open_images
from hourglass_jax.data.batches.images import images_to_tokens, save_png_grid, tokens_to_images
from hourglass_jax.data.io import tfds_io
from hourglass_jax.data.batches.settings import DataSettings
from tests.helpers import tiny_config


def test_images_round_trip_bit_exactly_in_raster_order_with_channels_interleaved():
  images = np.random.default_rng(0).integers(0, 256, (5, 4, 3, 3), dtype=np.uint8)
  tokens = images_to_tokens(images)
  assert tokens.shape == (5, 36) and tokens.dtype == np.int32
  np.testing.assert_array_equal(tokens[2, :6], images[2, 0, :2].reshape(-1))  # R,G,B of pixel (0,0), then (0,1)
  np.testing.assert_array_equal(tokens_to_images(tokens, 4, 3, 3), images)
  with pytest.raises(ValueError, match=r"do not hold 4x4x3 images \(48 values each\)"):
    tokens_to_images(tokens, 4, 4, 3)
  with pytest.raises(ValueError, match=r"must lie in 0..255"):
    tokens_to_images(tokens + 256, 4, 3, 3)
  with pytest.raises(ValueError, match="must be uint8"):
    images_to_tokens(images.astype(np.float32))


def test_png_grid_holds_the_images(tmp_path):
  images = np.random.default_rng(1).integers(0, 256, (5, 4, 3, 3), dtype=np.uint8)
  path = save_png_grid(images, tmp_path / "grid.png", columns=3)
  grid = np.asarray(Image.open(path))
  assert grid.shape == (2 * 5 + 1, 3 * 4 + 1, 3)
  np.testing.assert_array_equal(grid[6:10, 1:4], images[3])  # row 1, column 0
  grey = save_png_grid(images[..., :1], tmp_path / "grey.png", scale=2)
  assert np.asarray(Image.open(grey)).shape == (2 * (2 * 5 + 1), 2 * (3 * 4 + 1))


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="the digits ship with scikit-learn")
def test_digits_are_an_offline_image_dataset_of_whole_sequences(tmp_path):
  from hourglass_jax.data.builders.digits import load_digits

  images, _ = load_digits()
  cfg = tiny_config(data=dict(name="digits", seq_len=64, data_dir=str(tmp_path)))
  sources.check_data_config(DataSettings.of(cfg.data), 256)
  splits = {s: sources.make_source(DataSettings.of(cfg.data), s, 256, 0) for s in ("train", "valid", "test")}
  assert [len(s) for s in splits.values()] == [1617, 90, 90]
  item = splits["valid"][3]
  assert item.shape == (65,) and item[0] == 0
  np.testing.assert_array_equal(tokens_to_images(item[1:][None], 8, 8, 1)[0], images[1617 + 3])
  tokens, weights = next(pipeline.eval_iterator(splits["test"], 8, (0, 8)))
  assert tokens.shape == (8, 65) and weights.shape == (8, 64) and weights.all()
  with pytest.raises(ValueError, match=r"digits images are 8x8x1 = 64 values; set data.seq_len=64"):
    sources.check_data_config(DataSettings.of(tiny_config(data=dict(name="digits", seq_len=63)).data), 256)
  # a split read without that check first (hourglass-sample's image prompts): the images' own shape is named
  with pytest.raises(ValueError, match=r"^digits valid images are 8x8x1 = 64 values but data\.seq_len=63; set "
                                       r"data\.seq_len=64\.$"):
    open_images(DataSettings.of(tiny_config(data=dict(name="digits", seq_len=63, data_dir=str(tmp_path))).data),
                "valid")


def test_tfds_image_datasets_read_through_the_same_path(tmp_path, monkeypatch):
  cfg = tiny_config(data=dict(name="cifar10", seq_len=3072, eval_split="test", data_dir=str(tmp_path)))
  sources.check_data_config(DataSettings.of(cfg.data), 256)
  with tfds.testing.mock_data(num_examples=4), monkeypatch.context() as patch:
    patch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    source = sources.make_source(DataSettings.of(cfg.data), "test", 256, 0, eval_windows=True)
    assert len(source) == 4 and source[0].shape == (3073,)
    np.testing.assert_array_equal(source[1][1:], images_to_tokens(source.image(1)[None])[0])
  with pytest.raises(FileNotFoundError, match=r"'cifar10' is not prepared under .*hourglass-data prepare cifar10"):
    sources.make_source(DataSettings.of(cfg.data), "train", 256, 0)


def _tar(path, members: dict, mode: str = "w"):
  with tarfile.open(path, mode) as tar:
    for name, raw in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(raw)
      tar.addfile(info, io.BytesIO(raw))


def _png(image) -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


@pytest.mark.parametrize("name", ["cifar10", "downsampled_imagenet/32x32"])
def test_tfds_image_builders_build_from_manual_files_without_tensorflow(tmp_path, name, monkeypatch):
  """TFDS's own cifar10 / downsampled_imagenet builders, from small archives of the real layout in --manual_dir.
  Real archives match the checksums TFDS registers for them; these small ones cannot, so validation is off here."""
  from tensorflow_datasets.core.download import download_manager

  monkeypatch.setattr(download_manager.DownloadManager, "_register_or_validate_checksums", lambda *a, **k: None)
  rng, manual = np.random.default_rng(0), tmp_path / "manual"
  manual.mkdir()
  images = rng.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
  if name == "cifar10":  # records: label byte, then the R, G, B planes
    records = np.concatenate([np.zeros((5, 1), np.uint8), images.transpose(0, 3, 1, 2).reshape(5, -1)], axis=1)
    members = {f"cifar-10-batches-bin/data_batch_{i}.bin": records[:1].tobytes() for i in range(1, 6)}
    members.update({"cifar-10-batches-bin/test_batch.bin": records[1:].tobytes(),
                    "cifar-10-batches-bin/batches.meta.txt": "\n".join(f"c{i}" for i in range(10)).encode()})
    _tar(manual / "cifar-10-binary.tar.gz", members, "w:gz")
    split = "test"
  else:
    _tar(manual / "train_32x32.tar", {"train_32x32/0.png": _png(images[0])})
    _tar(manual / "valid_32x32.tar", {f"valid_32x32/{i}.png": _png(images[i]) for i in range(1, 5)})
    split = "valid"
  tfds_io.prepare(name, str(tmp_path / "tfds"), str(manual), progress=False)
  data = DataSettings(name=name, seq_len=3072, data_dir=str(tmp_path / "tfds"))
  source = sources.make_source(data, split, 256, 0, eval_windows=True)
  assert len(source) == 4
  expected = {image.tobytes() for image in images[1:]}  # TFDS stores these two in shuffled order
  assert {source[i][1:].astype(np.uint8).tobytes() for i in range(4)} == expected
  if importlib.util.find_spec("tensorflow") is None:  # the design: TensorFlow is not a dependency
    assert "tensorflow" not in sys.modules
