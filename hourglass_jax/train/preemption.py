"""SIGTERM as a request to checkpoint and stop, for single-process runs.

Multi-process runs leave SIGTERM to JAX's preemption service, which Orbax's preemption policy polls so every
process saves the same step.
"""

import signal
import threading

import jax


class SigtermFlag:
  """Context manager: while active, SIGTERM sets `requested` instead of killing the process."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def _handle(self, signum, frame):
    self.requested = True

  def __enter__(self):
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
