"""train/loop/prefetch.py: batches placed ahead, and a checkpointed state that resumes after the last batch handed
out."""

import numpy as np

from hourglass_jax.data.batches import pipeline
from hourglass_jax.train.loop.prefetch import DevicePrefetch


def _iterator():
  source = np.arange(40 * 3).reshape(40, 3)
  return pipeline.train_iterator(source, seed=0, global_batch=4, rows=(0, 4))


def test_prefetch_places_ahead_and_resumes_at_the_next_batch():
  placed = []
  put = lambda batch: placed.append(batch) or batch
  batches = DevicePrefetch(_iterator(), put, size=2)
  plain = _iterator()
  for _ in range(3):
    np.testing.assert_array_equal(next(batches), next(plain))
  assert len(placed) == 4  # one batch beyond the last handed out is already on the devices
  state = batches.get_state()
  resumed = DevicePrefetch(_iterator(), put, size=2)
  resumed.set_state(state)
  for _ in range(3):
    np.testing.assert_array_equal(next(resumed), next(plain))
