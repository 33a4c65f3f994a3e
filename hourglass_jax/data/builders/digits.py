"""TFDS builder for the offline image dataset: scikit-learn's 1,797 handwritten digits (8x8, one channel, 17 grey
levels scaled to 0..255), shipped inside the scikit-learn wheel, so image generation can be tried on any machine
without a download. Splits in order: first 90% train, next 5% validation, last 5% test."""

import importlib.util
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from hourglass_jax.data.catalog import split_bounds

SHAPE = (8, 8, 1)
INSTALL = "pip install 'hourglass-jax[images]' (or pip install scikit-learn), which ships the digits"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [1797, 8, 8, 1], labels int64 [1797]) from the copy inside scikit-learn."""
  spec = importlib.util.find_spec("sklearn")
  if spec is None or spec.origin is None:
    raise ValueError(f"the digits dataset needs scikit-learn: {INSTALL}.")
  path = pathlib.Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
  if path.is_file():  # read the file directly: importing scikit-learn takes seconds
    table = np.loadtxt(path, delimiter=",")
  else:
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    table = np.concatenate([bunch.data, bunch.target[:, None]], axis=1)
  pixels = np.rint(table[:, :64] * (255 / 16)).astype(np.uint8)
  return pixels.reshape(-1, *SHAPE), table[:, 64].astype(np.int64)


class Digits(tfds.core.GeneratorBasedBuilder):
  """scikit-learn's 8x8 digits as uint8 [8, 8, 1] images (stored raw: no image codec, no TensorFlow)."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(self, **kwargs):
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="scikit-learn's 8x8 handwritten digits, grey levels 0..16 scaled to 0..255.",
        homepage="https://archive.ics.uci.edu/dataset/80", disable_shuffling=True,
        features=tfds.features.FeaturesDict({"image": tfds.features.Tensor(
            shape=SHAPE, dtype=np.uint8, encoding=tfds.features.Encoding.BYTES),  # raw: no upcast to int64
                                             "label": tfds.features.ClassLabel(num_classes=10)}))

  def _split_generators(self, dl_manager):
    images, labels = load_digits()
    return {split: self._generate_examples(images[lo:hi], labels[lo:hi], lo)
            for split, (lo, hi) in split_bounds(len(images)).items()}

  def _generate_examples(self, images, labels, offset):
    for i, (image, label) in enumerate(zip(images, labels)):
      yield offset + i, {"image": image, "label": int(label)}
