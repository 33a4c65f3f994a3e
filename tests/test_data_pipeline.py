"""grain pipelines over TFDS-backed sources: deterministic for a seed, disjoint per-process shards that cover the
data, exact resume from a saved iterator state, and the default text stride L/4."""

import numpy as np
import pytest

from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.data.io import tfds_io
from hourglass_jax.data.batches.settings import DataSettings
from tests.helpers import tiny_config


@pytest.fixture(scope="module")
def text_source(tmp_path_factory):
  """Training windows (L=16, stride 4) over a text_files dataset built from 3 small documents."""
  root = tmp_path_factory.mktemp("pipeline")
  folder = root / "docs"
  folder.mkdir()
  rng = np.random.default_rng(0)
  for i in range(3):
    (folder / f"{i}.txt").write_bytes(rng.integers(0, 256, 400 + 100 * i, dtype=np.uint8).tobytes())
  tfds_io.prepare("text_files", str(root / "tfds"), str(folder), builder_kwargs=dict(chunk_bytes=64), progress=False)
  cfg = tiny_config(data=dict(name="text_files", data_dir=str(root / "tfds"), seq_len=16, train_stride=0))
  return sources.make_source(DataSettings.of(cfg.data), "train", 256, 0)


def _rows(batches):
  return [tuple(row) for batch in batches for row in batch]


def test_default_stride_is_a_quarter_window_and_windows_match_the_bytes(text_source):
  assert text_source.stride == 4
  tokens = np.asarray(text_source.tokens)
  np.testing.assert_array_equal(text_source[7], tokens[28:45])


def test_batches_are_deterministic_for_a_seed(text_source):
  first = [next(it) for it in [pipeline.train_iterator(text_source, 5, 8, (0, 8))] for _ in range(4)]
  again = pipeline.train_iterator(text_source, 5, 8, (0, 8))
  for batch in first:
    np.testing.assert_array_equal(next(again), batch)
  other = next(pipeline.train_iterator(text_source, 6, 8, (0, 8)))
  assert not np.array_equal(other, first[0])


def test_process_shards_are_disjoint_and_cover_an_epoch(text_source):
  batches_per_epoch = len(text_source) // 8
  shards = []
  for rows in ((0, 2), (2, 4), (4, 6), (6, 8)):
    it = pipeline.train_iterator(text_source, 1, 8, rows)
    shards.append(_rows(next(it) for _ in range(batches_per_epoch)))
  everything = [row for shard in shards for row in shard]
  assert len(everything) == batches_per_epoch * 8
  windows = {tuple(text_source[i]) for i in range(len(text_source))}
  assert len(set(everything)) == len(everything) and set(everything) <= windows  # disjoint, real windows
  assert len(windows - set(everything)) == len(text_source) % 8  # only the dropped remainder is missing


def test_a_saved_iterator_resumes_at_the_same_batch(text_source):
  it = pipeline.train_iterator(text_source, 2, 8, (0, 8))
  for _ in range(len(text_source) // 8 - 1):  # stop just before an epoch boundary
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed = pipeline.train_iterator(text_source, 2, 8, (0, 8))
  resumed.set_state(state)
  for batch in expected:
    np.testing.assert_array_equal(next(resumed), batch)
