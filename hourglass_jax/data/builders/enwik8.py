"""TFDS builder for enwik8: the first 10^8 bytes of an English Wikipedia XML dump, as raw bytes (vocab 256),
split 90M / 5M / 5M in order (the Hutter-prize / Transformer-XL / Hourglass split)."""

import hashlib
import pathlib
import zipfile
import zlib

import tensorflow_datasets as tfds

from hourglass_jax.data.builders.byte_chunks import ByteChunksBuilder, rechunk
from hourglass_jax.data.catalog import ENWIK8_ARCHIVE as ARCHIVE, ENWIK8_URL as URL, split_bounds

MEMBER = "enwik8"
ENWIK8_BYTES, ARCHIVE_BYTES = 100_000_000, 36_445_475
# The published file's SHA-256 (its md5 is a1fa5ffddb56f4953e226637dabbb36a): size and the zip's own CRC say only
# that the archive is intact, not that it holds enwik8.
ENWIK8_SHA256 = "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"
_READ_BLOCK = 1 << 20


def _missing(manual_dir, reason: str) -> FileNotFoundError:
  place = pathlib.Path(manual_dir or "MANUAL_DIR") / ARCHIVE
  return FileNotFoundError(
      f"enwik8: {reason}. Download {URL} ({ARCHIVE_BYTES:,} bytes), put it at {place}, and run "
      f"`hourglass-data prepare enwik8 --manual_dir={place.parent}`.")


def check_archive(path, total_bytes: int = ENWIK8_BYTES, sha256: str | None = None) -> None:
  """Raises, naming the file and the fix, unless `path` is a readable zip holding `enwik8` of `total_bytes` whose
  SHA-256 is `sha256` (default: the published enwik8's when total_bytes is its size; tests build smaller ones)."""
  path = pathlib.Path(path)
  redownload = f"download {URL} again and replace {path}"
  try:
    with zipfile.ZipFile(path) as archive:
      info = archive.getinfo(MEMBER)
  except zipfile.BadZipFile as error:
    raise ValueError(f"{path} ({path.stat().st_size:,} bytes) is not a readable zip archive ({error}): a truncated "
                     f"or wrong download (the real one has {ARCHIVE_BYTES:,} bytes); {redownload}.") from None
  except KeyError:
    raise ValueError(f"{path} has no member named {MEMBER!r}: it is not the enwik8 archive; {redownload}.") from None
  if info.file_size != total_bytes:
    raise ValueError(f"{path}: its {MEMBER!r} member holds {info.file_size:,} bytes, not {total_bytes:,}: a wrong or "
                     f"altered archive; {redownload}.")
  sha256 = sha256 or (ENWIK8_SHA256 if total_bytes == ENWIK8_BYTES else None)
  if sha256 is None:
    return
  digest = hashlib.sha256()
  for block in _read_range(path, 0, total_bytes):
    digest.update(block)
  if digest.hexdigest() != sha256:
    raise ValueError(f"{path}: its {MEMBER!r} member has the right size but not enwik8's content (SHA-256 "
                     f"{digest.hexdigest()[:16]}..., expected {sha256[:16]}...): a wrong or altered archive; "
                     f"{redownload}.")


class Enwik8(ByteChunksBuilder):
  """enwik8 from http://mattmahoney.net/dc/enwik8.zip: downloaded when online, or read from the manual dir."""

  DESCRIPTION = "enwik8: first 100M bytes of English Wikipedia XML; raw bytes, splits 90M / 5M / 5M."
  HOMEPAGE = "http://mattmahoney.net/dc/textdata.html"
  MANUAL_DOWNLOAD_INSTRUCTIONS = f"Download {URL} and place {ARCHIVE} in the manual directory."

  def __init__(self, *, total_bytes: int = ENWIK8_BYTES, allow_download: bool = True, **kwargs):
    # total_bytes != 10^8 only for tests, which build a small archive of the same structure.
    self.total_bytes, self.allow_download = total_bytes, allow_download
    super().__init__(**kwargs)

  def _archive(self, dl_manager) -> pathlib.Path:
    try:
      manual_dir = pathlib.Path(dl_manager.manual_dir)  # asserts that the directory exists and is not empty
    except AssertionError:
      manual_dir = None
    if manual_dir is not None and (manual_dir / ARCHIVE).is_file():
      return manual_dir / ARCHIVE
    where = dl_manager._manual_dir  # pylint: disable=protected-access  (the configured path, even if absent)
    if not self.allow_download:
      raise _missing(where, f"{ARCHIVE} is not in the manual directory {where}")
    try:
      return pathlib.Path(dl_manager.download(URL))
    except Exception as error:  # offline, proxy, HTTP error: all end in the same manual instructions
      raise _missing(where, f"{ARCHIVE} is not in {where} and downloading it failed ({error})") from error

  def _split_generators(self, dl_manager):
    archive = self._archive(dl_manager)
    check_archive(archive, self.total_bytes)
    return {name: self._generate_examples(archive, *bounds) for name, bounds in split_bounds(self.total_bytes).items()}

  def _generate_examples(self, archive, start: int, stop: int):
    return rechunk(_read_range(archive, start, stop), self.chunk_bytes)


def _read_range(archive, start: int, stop: int):
  """Blocks of the decompressed member's bytes [start, stop); a corrupt archive raises with the fix."""
  try:
    with zipfile.ZipFile(archive) as zf, zf.open(MEMBER) as member:
      size, position = zf.getinfo(MEMBER).file_size, 0
      while position < stop:
        block = member.read(min(_READ_BLOCK, (start if position < start else stop) - position))
        if not block:
          raise EOFError(f"the member ends after {position:,} bytes")
        if position >= start:
          yield block
        position += len(block)
      if stop == size:
        member.read()  # reading to the end verifies the CRC of the whole member
  except (zipfile.BadZipFile, zlib.error, EOFError) as error:
    raise ValueError(f"{archive} is corrupt ({error}); download {URL} again and replace it.") from None
