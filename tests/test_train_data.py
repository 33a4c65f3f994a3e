"""Data sources and grain pipelines: windows, splits, shuffled resumable batches, per-process rows, eval padding."""

import numpy as np
import pytest

from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.data.batches.settings import DataSettings
from tests.helpers import tiny_config


def test_windows_cover_the_split_at_the_stride():
  source = sources.WindowSource(np.arange(100, dtype=np.uint8), seq_len=9, stride=5)
  assert len(source) == 19 and source[0].dtype == np.int32
  np.testing.assert_array_equal(source[3], np.arange(15, 25))
  np.testing.assert_array_equal(source[len(source) - 1], np.arange(90, 100))


def test_text_splits_are_disjoint_and_ordered(tmp_path):
  path = tmp_path / "corpus.txt"
  path.write_bytes(bytes(range(256)) * 40)
  data = DataSettings(name="text_file", path=str(path))
  train, valid, test = (sources.split_tokens(data, s) for s in ("train", "valid", "test"))
  assert np.concatenate([train, valid, test]).tobytes() == path.read_bytes()
  assert (len(train), len(valid), len(test)) == (9216, 512, 512)


def test_text_file_source(tmp_path):
  path = tmp_path / "corpus.txt"
  path.write_bytes(bytes(range(256)) * 40)
  cfg = tiny_config(data=dict(name="text_file", path=str(path), seq_len=16))
  data = DataSettings.of(cfg.data)
  sources.check_data_config(data, 256)
  source = sources.make_source(data, "valid", 256, 0, eval_windows=True)  # bytes [9216, 9728) of 10240
  assert len(source) == 32  # non-overlapping windows, the last one padded: all 511 predicted bytes are scored
  assert sum(source.weights(i).sum() for i in range(len(source))) == 511
  np.testing.assert_array_equal(source[1], np.arange(16, 33))


def test_training_batches_resume_and_split_over_processes_identically():
  source = sources.SyntheticSource(vocab_size=50, seq_len=7, seed=3, length=40)
  whole = pipeline.train_iterator(source, seed=1, global_batch=8, rows=(0, 8))
  first = [next(whole) for _ in range(12)]  # 12 batches of 8 = 2.4 epochs, reshuffled each epoch
  assert {tuple(r) for b in first[:5] for r in b} == {tuple(source[i]) for i in range(40)}
  halves = [pipeline.train_iterator(source, 1, 8, rows) for rows in ((0, 4), (4, 8))]
  for batch in first[:3]:
    np.testing.assert_array_equal(np.concatenate([next(h) for h in halves]), batch)
  state = whole.get_state()
  resumed = pipeline.train_iterator(source, 1, 8, (0, 8))
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed), next(whole))


def test_eval_batches_pad_the_last_batch_with_the_last_window_at_zero_weight():
  source = sources.WindowSource(np.arange(60, dtype=np.uint8), seq_len=9, stride=9)  # 6 windows
  batches = list(pipeline.eval_iterator(source, global_batch=4, rows=(0, 4)))
  assert len(batches) == 2 and batches[1][1].shape == (4, 9)  # per-position weights
  np.testing.assert_array_equal(batches[1][1].sum(axis=1), [9, 9, 0, 0])
  np.testing.assert_array_equal(batches[1][0], np.stack([source[4], source[5], source[5], source[5]]))
  assert len(list(pipeline.eval_iterator(source, 4, (0, 4), max_batches=1))) == 1


def test_a_split_shorter_than_a_window_is_reported():
  cfg = tiny_config(data=dict(seq_len=10_000_000))
  with pytest.raises(ValueError, match="shorter than data.seq_len"):
    sources.make_source(DataSettings.of(cfg.data), "valid", 256, 0)
