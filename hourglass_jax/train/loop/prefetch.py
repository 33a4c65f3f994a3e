"""Batches placed on the devices ahead of the step that reads them, so the host's copy of batch n + 1 overlaps
step n instead of following it. The data iterator's state travels with each batch: `get_state()` is the state
after the last batch handed out, not after the ones waiting, so a checkpoint resumes at the right batch."""

import collections

PREFETCH = 2  # batches in flight: one to copy while one waits for the step


class DevicePrefetch:
  """Wraps a resumable iterator (`get_state` / `set_state`, e.g. data.batches.pipeline's) of host batches; `put` places a
  host batch on the devices (Trainer.global_array: asynchronous)."""

  def __init__(self, batches, put, size: int = PREFETCH):
    self.batches, self.put, self.size = batches, put, size
    self.queue = collections.deque()
    self.state = batches.get_state()

  def __iter__(self):
    return self

  def __next__(self):
    while len(self.queue) < max(1, self.size):
      host = next(self.batches)
      self.queue.append((self.put(host), self.batches.get_state()))
    batch, self.state = self.queue.popleft()
    return batch

  def get_state(self):
    return self.state

  def set_state(self, state):
    """Resumes the wrapped iterator at `state`; batches already placed are dropped."""
    self.queue.clear()
    self.batches.set_state(state)
    self.state = state
