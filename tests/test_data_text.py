"""text_files and stdlib_text builders: the deterministic split by document (or by bytes for < 3 documents), exact
contents, the offline corpus, and clear messages for empty, unreadable or missing input."""

import numpy as np
import pytest

from hourglass_jax.data.batches import sources
from hourglass_jax.data.builders import embedded
from hourglass_jax.data.builders.text_files import find_documents, split_documents, split_warning
from hourglass_jax.data.io import tfds_io
from hourglass_jax.data.batches.settings import DataSettings


def write_docs(folder, count: int = 12):
  folder.mkdir(parents=True)
  docs = {f"doc{i:02d}.txt": (f"document {i} " * (i + 3)).encode() for i in range(count)}
  for name, text in docs.items():
    (folder / name).write_bytes(text)
  (folder / ".hidden").write_bytes(b"skipped")
  (folder / "empty.txt").write_bytes(b"")  # empty files inside a folder are skipped
  return docs


def test_folder_splits_by_document_deterministically_with_exact_bytes(tmp_path):
  docs = write_docs(tmp_path / "corpus")
  data_dir = str(tmp_path / "tfds")
  tfds_io.prepare("text_files", data_dir, str(tmp_path / "corpus"), builder_kwargs=dict(chunk_bytes=50),
                  progress=False)
  names = [f"corpus/{n}" for n in sorted(docs)]
  ranges = split_documents(names, [len(docs[n]) for n in sorted(docs)])
  seen = []
  for split in ("train", "validation", "test"):
    indices = [i for i, _, _ in ranges[split]]
    assert indices == sorted(indices) and indices
    expected = b"".join(docs[sorted(docs)[i]] for i in indices)
    assert sources.split_tokens(DataSettings(name="text_files", data_dir=data_dir), split).tobytes() == expected
    seen += indices
  assert sorted(seen) == list(range(len(docs)))  # every document in exactly one split
  total = sum(map(len, docs.values()))
  assert sum(len(docs[sorted(docs)[i]]) for i, _, _ in ranges["test"]) >= 0.05 * total


def test_fewer_than_three_documents_split_by_bytes(tmp_path):
  text = bytes(range(256)) * 4  # 1024 bytes: 921 / 51 / 52
  (tmp_path / "one.txt").write_bytes(text)
  data_dir = str(tmp_path / "tfds")
  tfds_io.prepare("text_files", data_dir, str(tmp_path / "one.txt"), progress=False)
  data = DataSettings(name="text_files", data_dir=data_dir)
  parts = [sources.split_tokens(data, s).tobytes() for s in ("train", "valid", "test")]
  assert parts == [text[:921], text[921:972], text[972:]]


def test_embedded_corpus_is_the_stdlib_sources_split_by_file(tmp_path):
  files = embedded.stdlib_source_files()
  data_dir = str(tmp_path / "tfds")
  splits = {s: sources.split_tokens(DataSettings(data_dir=data_dir), s) for s in ("train", "valid", "test")}
  ranges = split_documents([f.name for f in files], [f.stat().st_size for f in files])
  for split, name in (("train", "train"), ("valid", "validation"), ("test", "test")):
    expected = b"".join(files[i].read_bytes() for i, _, _ in ranges[name])
    assert splits[split].tobytes() == expected
  assert sum(map(len, splits.values())) == sum(f.stat().st_size for f in files)
  assert 0.03 < len(splits["valid"]) / sum(map(len, splits.values())) < 0.15


@pytest.mark.parametrize("setup, error, message", [
    ("empty_file", ValueError, r"empty.txt is empty"),
    ("empty_folder", ValueError, r"holds no non-empty, non-hidden files"),
    ("broken_link", ValueError, r"cannot read .*link.txt"),
    ("missing", FileNotFoundError, r"does not exist"),
    ("none", ValueError, r"no input given.*--manual_dir=FILE_OR_FOLDER"),
])
def test_bad_text_input_is_named(tmp_path, setup, error, message):
  target = tmp_path / "input"
  if setup == "empty_file":
    target.mkdir()
    target = target / "empty.txt"
    target.write_bytes(b"")
  elif setup == "empty_folder":
    target.mkdir()
    (target / "empty.txt").write_bytes(b"")
  elif setup == "broken_link":
    target.mkdir()
    (target / "a.txt").write_bytes(b"text")
    (target / "link.txt").symlink_to(tmp_path / "nowhere")
  with pytest.raises(error, match=message):
    tfds_io.prepare("text_files", str(tmp_path / "tfds"), None if setup == "none" else str(target), progress=False)
  assert not (tmp_path / "tfds" / "text_files").exists() or not tfds_io.get_builder(
      "text_files", str(tmp_path / "tfds")).is_prepared()


def test_find_documents_sorts_and_skips_hidden(tmp_path):
  write_docs(tmp_path / "c", count=3)
  assert [name for name, _ in find_documents([str(tmp_path / "c")])] == [f"c/doc0{i}.txt" for i in range(3)]


def test_a_split_far_from_the_asked_fractions_is_named_with_the_fix():
  message = split_warning(dict(train=58, validation=21, test=21), "text_files", "/data/x/text_files/1.0.0")
  assert message.startswith("text_files split by document holds 58% / 21% / 21% of its bytes in train / validation "
                            "/ test, far from the 90% / 5% / 5% asked")
  assert "delete /data/x/text_files/1.0.0 and prepare again" in message
  assert split_warning(dict(train=874, validation=78, test=48), "t", "p") is None  # within 3 points of each
  assert split_warning(dict(train=860, validation=91, test=49), "t", "p") is not None  # validation 9.1%
  assert split_warning(dict(train=4_104_193, validation=232_703, test=243_802), "stdlib_text", "p") is None


def test_ten_byte_corpus_is_too_small(tmp_path):
  with pytest.raises(ValueError, match="too few to give the"):
    split_documents(["a"], [10])
  assert np.sum([len(p) for p in split_documents(["a"], [20]).values()]) == 3
