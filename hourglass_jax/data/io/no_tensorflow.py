"""Lets TFDS's own image builders (cifar10, downsampled_imagenet) build without TensorFlow.

TFDS encodes numpy images with tf.image.encode_png, and its archive extractor and the cifar10 reader open files
with tf.io.gfile; the Python builder API otherwise works without TensorFlow. While building, those few calls get
PIL and the standard library instead. With TensorFlow installed nothing is changed.
"""

import contextlib
import io
import sys
import types
from unittest import mock

def _gfile(path, mode: str = "r"):
  """tf.io.gfile.GFile: reads through open(), writes (the archive extractor's) through hourglass_jax.runtime.files."""
  if set(mode) & set("wax+"):
    from hourglass_jax.runtime import files  # pylint: disable=import-outside-toplevel

    return files.atomic_file(path, "wb" if "b" in mode else "w")
  # pylint: disable-next=consider-using-with,unspecified-encoding
  return open(path, "rb") if "b" in mode else open(path, "r")


_TF = types.SimpleNamespace(  # the only TensorFlow calls those code paths make
    compat=types.SimpleNamespace(as_text=lambda s, encoding="utf-8": s.decode(encoding) if isinstance(s, bytes)
                                 else s),
    io=types.SimpleNamespace(gfile=types.SimpleNamespace(GFile=_gfile)))


def _has_tensorflow() -> bool:
  try:
    import tensorflow  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    return False
  return True


def _encode_with_pil(self, np_image):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.core.features import image_feature  # pylint: disable=import-outside-toplevel

  image_feature._validate_np_array(np_image, shape=self.shape, dtype=self.np_dtype)  # pylint: disable=protected-access
  buffer = io.BytesIO()
  Image.fromarray(np_image[..., 0] if np_image.shape[-1] == 1 else np_image).save(
      buffer, format="JPEG" if self.encoding_format == "jpeg" else "PNG")
  return buffer.getvalue()


@contextlib.contextmanager
def without_tensorflow(builder=None):
  """Within the block, TFDS's image encoding and archive reading (and `builder`'s module, if it reads files with
  tf.io.gfile) use PIL and the standard library when TensorFlow is not installed."""
  if _has_tensorflow():
    yield
    return
  from tensorflow_datasets.core.download import extractor  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.core.features import image_feature  # pylint: disable=import-outside-toplevel

  with contextlib.ExitStack() as stack:
    encoder = image_feature._ImageEncoder  # pylint: disable=protected-access
    stack.enter_context(mock.patch.object(encoder, "_encode_image", _encode_with_pil))
    stack.enter_context(mock.patch.object(extractor, "tf", _TF))
    module = sys.modules.get(type(builder).__module__) if builder is not None else None
    if module is not None and hasattr(module, "tf"):
      stack.enter_context(mock.patch.object(module, "tf", _TF))
    yield
