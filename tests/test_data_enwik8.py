"""The enwik8 builder on a small archive of the real structure (size override used by tests only): exact splits and
bytes, clear messages for a missing, truncated, wrong or corrupt archive, and no half-written dataset on failure."""

import zipfile

import numpy as np
import pytest

from hourglass_jax.data import catalog
from hourglass_jax.data.builders.byte_chunks import ByteStream
from hourglass_jax.data.io import tfds_io

TOTAL = 2000  # splits 1800 / 100 / 100
SMALL = dict(total_bytes=TOTAL, chunk_bytes=64)


def fake_enwik8(folder, data: bytes, member: str = "enwik8", method=zipfile.ZIP_DEFLATED):
  folder.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(folder / "enwik8.zip", "w", compression=method) as archive:
    archive.writestr(member, data)
  return folder / "enwik8.zip"


def corpus(size: int = TOTAL) -> bytes:
  return np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_splits_hold_exactly_the_90_5_5_bytes_in_order(tmp_path):
  data = corpus()
  fake_enwik8(tmp_path / "manual", data)
  tfds_io.prepare("enwik8", str(tmp_path / "tfds"), str(tmp_path / "manual"), builder_kwargs=SMALL, progress=False)
  for split, (lo, hi) in dict(train=(0, 1800), valid=(1800, 1900), test=(1900, 2000)).items():
    records = tfds_io.open_split(catalog.get("enwik8"), split, str(tmp_path / "tfds"))
    stream = ByteStream(records)
    assert len(records) == -(-(hi - lo) // 64) and stream.chunk_bytes == 64
    assert stream[:].tobytes() == data[lo:hi]
    assert stream[60:130].tobytes() == data[lo:hi][60:130]  # across chunk boundaries


def test_missing_archive_says_which_file_from_where_and_where_to_put_it(tmp_path):
  manual = tmp_path / "manual"
  with pytest.raises(FileNotFoundError) as error:
    tfds_io.prepare("enwik8", str(tmp_path / "tfds"), str(manual), progress=False)
  message = str(error.value)
  assert "http://mattmahoney.net/dc/enwik8.zip" in message and f"{manual}/enwik8.zip" in message
  assert "hourglass-data prepare enwik8 --manual_dir=" in message
  builder = tfds_io.get_builder("enwik8", str(tmp_path / "tfds"), allow_download=False)  # the builder's own check
  with pytest.raises(FileNotFoundError, match=r"enwik8.zip is not in the manual directory .*Download http://"):
    builder.download_and_prepare(download_config=tfds_io.tfds.download.DownloadConfig(manual_dir=str(manual)))


@pytest.mark.parametrize("problem, message", [
    ("truncated", r"not a readable zip archive.*truncated or wrong download.*36,445,475 bytes"),
    ("wrong_member", r"no member named 'enwik8'"),
    ("wrong_size", r"holds 1,999 bytes, not 2,000: a wrong or altered archive"),
    ("corrupt", r"is corrupt .*download http://mattmahoney.net/dc/enwik8.zip again"),
])
def test_bad_archives_fail_clearly_and_leave_no_dataset(tmp_path, problem, message):
  manual, data_dir = tmp_path / "manual", tmp_path / "tfds"
  if problem == "truncated":
    path = fake_enwik8(manual, corpus())
    path.write_bytes(path.read_bytes()[:-100])
  elif problem == "wrong_member":
    fake_enwik8(manual, corpus(), member="enwik9")
  elif problem == "wrong_size":
    fake_enwik8(manual, corpus(TOTAL - 1))
  else:  # one flipped byte of a stored member: caught by the CRC once the last split has been read
    path = fake_enwik8(manual, corpus(), method=zipfile.ZIP_STORED)
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=message):
    tfds_io.prepare("enwik8", str(data_dir), str(manual), builder_kwargs=SMALL, progress=False)
  builder = tfds_io.get_builder("enwik8", str(data_dir))
  assert not builder.is_prepared()
  assert not list((data_dir / "enwik8").glob("*")), "a failed build left files behind"
  with pytest.raises(FileNotFoundError, match=r"not prepared under .*hourglass-data prepare enwik8"):
    tfds_io.open_split(catalog.get("enwik8"), "train", str(data_dir))
