"""Eval protocols score every predicted byte of a split exactly once (non-overlapping windows, sliding W/2, the
paper's long-context 6784 + 128), through the eval iterator's per-process rows and through evaluate()."""

import dataclasses

import jax
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.data.batches.eval_windows import ScoredWindows, protocol_context
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.evaluate import describe, evaluate
from tests.helpers import tiny_config


def _scored_targets(source) -> np.ndarray:
  """How often each token position is scored as a prediction target."""
  counts = np.zeros(source.size, np.int64)
  for k in range(len(source)):
    start = k * source.stride
    weights = source.weights(k)
    targets = start + 1 + np.nonzero(weights)[0]
    np.add.at(counts, targets, 1)
  return counts


@pytest.mark.parametrize("size, protocol, window, context", [
    (1000, "windows", 64, 0), (1001, "sliding", 64, 0), (999, "sliding", 63, 0), (20_000, "long_context", 6912, 6784),
])
def test_every_byte_but_the_first_is_scored_exactly_once(size, protocol, window, context):
  tokens = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
  source = ScoredWindows(tokens, window, protocol_context(protocol, window, context))
  counts = _scored_targets(source)
  assert counts[0] == 0 and np.all(counts[1:] == 1)
  k = len(source) - 1
  np.testing.assert_array_equal(source[k][:size - k * source.stride], tokens[k * source.stride:])
  if protocol != "windows":  # after the first window, each scored byte has at least `context` bytes before it
    assert all(source.weights(k)[:source.context].sum() == 0 for k in range(1, len(source)))


def test_long_context_geometry_is_the_papers():
  source = ScoredWindows(np.zeros(20_000, np.uint8), 6912, protocol_context("long_context", 6912, 6784))
  assert source.stride == 128 and source[0].shape == (6913,)
  assert source.weights(0).sum() == 6912 and source.weights(5).sum() == 128


def test_eval_rows_over_processes_cover_each_byte_once():
  source = ScoredWindows(np.arange(500) % 256, 32, protocol_context("sliding", 32, 0))
  total = 0.0
  for rows in ((0, 4), (4, 8)):
    for tokens, weights in pipeline.eval_iterator(source, 8, rows):
      assert tokens.shape == (4, 33) and weights.shape == (4, 32)
      total += weights.sum()
  assert total == 499


@pytest.mark.parametrize("data, message", [
    (dict(eval_protocol="overlap"), r"data.eval_protocol='overlap'; choose one of windows, sliding, long_context"),
    (dict(eval_protocol="long_context"), r"needs 0 < data.eval_context < the eval window.*6912.*6784"),
    (dict(eval_protocol="long_context", eval_seq_len=64, eval_context=64), r"data.eval_context=64"),
    (dict(name="enwik9"), r"data.name='enwik9' is unknown"),
    (dict(train_stride=-1), r"data.train_stride=-1 must be an integer >= 0"),
])
def test_bad_eval_settings_are_named(data, message):
  with pytest.raises(ValueError, match=message):
    sources.check_data_config(DataSettings.of(tiny_config(data=data).data), 256)


def test_an_eval_window_longer_than_the_split_is_reported(tmp_path):
  path = tmp_path / "small.txt"
  path.write_bytes(bytes(range(200)) * 5)  # valid split: 50 bytes
  cfg = tiny_config(data=dict(name="text_file", path=str(path), seq_len=16, eval_seq_len=64))
  with pytest.raises(ValueError, match=r"valid split .*\(50 bytes\) is shorter than one eval window \+ 1 = 65"):
    sources.make_source(DataSettings.of(cfg.data), "valid", 256, 0, eval_windows=True)


def test_evaluate_scores_the_whole_split_once_under_each_protocol(tmp_path):
  path = tmp_path / "corpus.txt"
  path.write_bytes(np.random.default_rng(0).integers(32, 127, 4000, dtype=np.uint8).tobytes())  # valid: 200 bytes
  cfg = tiny_config(data=dict(name="text_file", path=str(path), seq_len=16), mesh=dict(data=1))
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  run = run_config(cfg)
  trainer = Trainer(run, mesh)
  results = {}
  with jax.set_mesh(mesh):
    params = trainer.init_state().params
    for protocol, extra in (("windows", {}), ("sliding", {}), ("long_context", dict(eval_seq_len=24, eval_context=20))):
      data = dataclasses.replace(run.data, **dict(dict(eval_seq_len=0, eval_context=0), eval_protocol=protocol, **extra))
      trainer.run = dataclasses.replace(run, data=data)  # the same compiled trainer, scoring under another protocol
      results[protocol] = evaluate(trainer, params, "valid")
  for protocol, result in results.items():
    assert result["tokens"] == 199 and result["whole_split"] and result["protocol"] == protocol
    assert 6 < result["bits"] < 10  # an untrained model: about log2(256) bits per byte
  assert "valid bits/byte" in describe(results["sliding"], "valid") and "sliding windows" in describe(
      results["sliding"], "valid")
  assert describe(results["sliding"], "valid").endswith("whole split)")
  with jax.set_mesh(mesh):  # the first batch alone: a partial score, and said so
    partial = evaluate(trainer, params, "valid", max_batches=1)
  whole = results["long_context"]  # the protocol cfg.data holds last
  assert not partial["whole_split"] and (partial["batches"], partial["total_batches"]) == (1, whole["batches"])
  assert whole["total_batches"] == whole["batches"] > 1 and 0 < partial["tokens"] < whole["tokens"]
  assert describe(partial, "valid").endswith(
      f"partial: first 1 of {whole['batches']} batches ({1 / whole['batches']:.0%}))")
