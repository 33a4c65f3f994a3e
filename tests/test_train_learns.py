"""A small Hourglass learns real text: held-out bits per byte fall well below the unigram entropy."""

import jax
import numpy as np

from hourglass_jax.data.batches.sources import split_tokens
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.train.loop.loop import train_and_evaluate
from tests.helpers import HOURGLASS, quiet, tiny_config


def _unigram_bits(data: np.ndarray) -> float:
  p = np.bincount(data, minlength=256) / len(data)
  p = p[p > 0]
  return float(-(p * np.log2(p)).sum())


def test_small_hourglass_beats_the_unigram_entropy_by_20_percent(tmp_path):
  cfg = tiny_config(steps=100, **HOURGLASS, mesh=dict(data=1))  # the same programs as test_train_sharding's
  cfg.data.eval_batches = 32
  result = train_and_evaluate(cfg, tmp_path, devices=jax.devices()[:1], log=quiet)
  # The bytes the evaluation scored: non-overlapping windows from the start of the split.
  scored = split_tokens(DataSettings(), "valid")[:cfg.data.eval_batches * cfg.data.batch_size * cfg.data.seq_len + 1]
  entropy = _unigram_bits(scored)
  assert 4.0 < entropy < 5.0
  assert result["losses"][1] / np.log(2) > entropy  # starts worse than counting bytes
  assert result["eval"]["bits"] < 0.8 * entropy, (result["eval"], entropy)
