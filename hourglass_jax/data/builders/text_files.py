"""TFDS builders for local text: `text_files` (any files or folder) and `stdlib_text` (the Python standard library's
own sources, the offline corpus every machine has). Bytes, vocab 256, split train / validation / test by document.

Split rule (deterministic, independent of listing order and machine): documents are ordered by the SHA-256 of their
name (path relative to the folder given); test takes documents from the front of that order until it holds >= 5% of
the bytes, validation likewise, train the rest; each split keeps its documents in name order. With fewer than 3
documents the concatenated bytes are split 90% / 5% / 5% in order instead, as enwik8 is.
"""

import hashlib
import pathlib
import sys
from typing import Sequence

import tensorflow_datasets as tfds

from hourglass_jax.data.builders.byte_chunks import ByteChunksBuilder, rechunk
from hourglass_jax.data.builders.embedded import stdlib_source_files
from hourglass_jax.data.catalog import SPLIT_NAMES, split_bounds

HELD_OUT_FRACTION = 0.05
SPLIT_TOLERANCE = 3.0  # percentage points a split may end from its asked fraction before prepare warns
_READ_BLOCK = 1 << 20


def find_documents(paths: Sequence[str]) -> list[tuple[str, pathlib.Path]]:
  """(name, path) of the documents: each file given, and every non-hidden, non-empty file under each folder given
  (recursively), sorted by name; a file reached twice (a link to it, a hard link, or named beside its folder) is
  one document, under its first name that is not a link. Missing paths, empty files given by name, empty folders
  and links in a folder that lead out of it raise."""
  if not paths:
    raise ValueError("text_files: no input given; name the files or folder with "
                     "`hourglass-data prepare text_files --manual_dir=FILE_OR_FOLDER`.")
  documents = []
  for given in paths:
    root = pathlib.Path(given).expanduser()
    if root.is_file():
      if root.stat().st_size == 0:
        raise ValueError(f"text_files: {root} is empty; pass a file with text in it (or leave it out).")
      documents.append((root.name, root))
    elif root.is_dir():
      found = [(f"{root.name}/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*"))
               if not any(part.startswith(".") for part in p.relative_to(root).parts)
               and (p.is_file() or p.is_symlink())]
      inside = root.resolve()
      for _, path in found:
        if not path.is_file():
          raise ValueError(f"text_files: cannot read {path} (a broken link or not a regular file); fix or remove it.")
        if not path.resolve().is_relative_to(inside):
          raise ValueError(f"text_files: {path} links to {path.resolve()}, outside the folder {root}; remove the "
                           "link, copy the file into the folder, or name that file too with --manual_dir.")
      found = [(name, path) for name, path in found if path.stat().st_size > 0]
      if not found:
        raise ValueError(f"text_files: the folder {root} holds no non-empty, non-hidden files; point "
                         "--manual_dir at a folder of text files.")
      documents.extend(found)
    else:
      raise FileNotFoundError(f"text_files: {root} does not exist (or is not a file or folder); pass "
                              "--manual_dir=FILE_OR_FOLDER.")
  seen, unique = set(), []
  for name, path in sorted(documents, key=lambda item: item[1].is_symlink()):  # stable: files before links
    identity = (path.stat().st_dev, path.stat().st_ino)
    if identity not in seen:
      seen.add(identity)
      unique.append((name, path))
  return sorted(unique, key=lambda item: item[0])


def split_documents(names: Sequence[str], sizes: Sequence[int]) -> dict[str, list[tuple[int, int, int]]]:
  """Each split as (document index, start byte, stop byte) ranges, by the rule in this module's docstring."""
  total = sum(sizes)
  if len(names) < 3:
    bounds, ranges, offset = split_bounds(total), {name: [] for name in SPLIT_NAMES}, 0
    for doc, size in enumerate(sizes):
      for split, (lo, hi) in bounds.items():
        lo, hi = max(lo, offset), min(hi, offset + size)
        if lo < hi:
          ranges[split].append((doc, lo - offset, hi - offset))
      offset += size
  else:
    rest = sorted(range(len(names)), key=lambda i: hashlib.sha256(names[i].encode()).digest())
    chosen = {}
    for split, keep in (("test", 2), ("validation", 1)):  # leave at least one document for each later split
      chosen[split] = []
      held = 0
      while len(rest) > keep and (not chosen[split] or held < HELD_OUT_FRACTION * total):
        chosen[split].append(rest.pop(0))
        held += sizes[chosen[split][-1]]
    chosen["train"] = rest
    ranges = {split: [(i, 0, sizes[i]) for i in sorted(chosen[split])] for split in SPLIT_NAMES}
  for split, parts in ranges.items():
    if not parts:
      raise ValueError(f"text_files: {total} bytes of text are too few to give the {split} split any; use at least "
                       "20 bytes (or 3 documents).")
  return ranges


def split_warning(sizes: dict[str, int], name: str, path, points: float = SPLIT_TOLERANCE) -> str | None:
  """The warning for text splits (`sizes`: bytes per split) more than `points` percentage points from the 90% /
  5% / 5% asked, which splitting by document gives when a few documents hold most of the text; None otherwise."""
  total = sum(sizes.get(split, 0) for split in SPLIT_NAMES)
  asked = dict(zip(SPLIT_NAMES, (1 - 2 * HELD_OUT_FRACTION, HELD_OUT_FRACTION, HELD_OUT_FRACTION)))
  if not total or all(abs(sizes.get(split, 0) / total - asked[split]) * 100 <= points for split in SPLIT_NAMES):
    return None
  actual = " / ".join(f"{sizes.get(split, 0) / total:.0%}" for split in SPLIT_NAMES)
  return (f"{name} split by document holds {actual} of its bytes in {' / '.join(SPLIT_NAMES)}, far from the "
          f"{' / '.join(f'{f:.0%}' for f in asked.values())} asked: a few documents hold most of the text. Split the "
          "large files into smaller ones (e.g. `split -C 1M FILE FILE.part-`), delete "
          f"{path} and prepare again, or train on one file with --config.data.name=text_file "
          "--config.data.path=FILE (split 90/5/5 in order).")


def _read_ranges(paths: Sequence[pathlib.Path], parts):
  for doc, start, stop in parts:
    try:
      with open(paths[doc], "rb") as f:
        f.seek(start)
        remaining = stop - start
        while remaining:
          block = f.read(min(_READ_BLOCK, remaining))
          if not block:
            raise ValueError(f"text_files: {paths[doc]} shrank while it was being read; build again.")
          remaining -= len(block)
          yield block
    except OSError as error:
      raise ValueError(f"text_files: cannot read {paths[doc]} ({error}); fix its permissions or remove it.") from None


class _DocumentsBuilder(ByteChunksBuilder, skip_registration=True):
  """Splits the documents `_documents()` returns by the module's rule and writes each split's bytes in order."""

  def _documents(self) -> list[tuple[str, pathlib.Path]]:
    raise NotImplementedError

  def _split_generators(self, dl_manager):
    names, paths = zip(*self._documents())
    ranges = split_documents(names, [p.stat().st_size for p in paths])
    return {split: self._generate_examples(paths, ranges[split]) for split in SPLIT_NAMES}

  def _generate_examples(self, paths, parts):
    return rechunk(_read_ranges(paths, parts), self.chunk_bytes)


class TextFiles(_DocumentsBuilder):
  """Any local text: `paths` names files and/or folders (build with `hourglass-data prepare text_files
  --manual_dir=FILE_OR_FOLDER`; use one --data_dir per corpus)."""

  DESCRIPTION = "Local text files as bytes, split by document (see hourglass_jax/data/builders/text_files.py)."

  def __init__(self, *, paths: Sequence[str] = (), **kwargs):
    self.paths = [str(p) for p in paths]
    super().__init__(**kwargs)

  def _documents(self):
    return find_documents(self.paths)


class StdlibText(_DocumentsBuilder):
  """The running interpreter's standard-library `.py` sources (one config per Python minor version)."""

  DESCRIPTION = "Python standard-library sources as bytes, split by file; built offline on any machine."
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=f"python{sys.version_info.major}_{sys.version_info.minor}")]

  def _documents(self):
    return [(path.name, path) for path in stdlib_source_files()]
