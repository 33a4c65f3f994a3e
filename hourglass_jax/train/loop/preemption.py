"""SIGTERM and Ctrl-C (SIGINT) as requests to checkpoint and stop, for single-process runs, and the exit codes that
tell a scheduler why a run stopped.

Multi-process runs leave SIGTERM to JAX's preemption service, which Orbax's preemption policy polls so every
process saves the same step; a Ctrl-C there interrupts as usual.
"""

import signal
import threading

import jax

# Exit codes of hourglass-train: 0 = finished; EXIT_PREEMPTED = stopped by SIGTERM / a preemption notice after
# saving a checkpoint (relaunch or requeue the same command to resume; 75 is sysexits' EX_TEMPFAIL, "try again");
# EXIT_INTERRUPTED = stopped by Ctrl-C after saving (the shell's code for SIGINT: do not requeue); EXIT_DISK_FULL =
# a write under the workdir found no space (sysexits' EX_IOERR: requeueing cannot help until space is freed).
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130
EXIT_DISK_FULL = 74


class StopSignals:
  """Context manager: while active, SIGTERM and the first Ctrl-C set `requested` ('SIGTERM' or 'SIGINT') instead
  of stopping the process; a second Ctrl-C raises KeyboardInterrupt at once."""

  def __init__(self, log=print):
    self.requested, self.log = None, log
    self._previous = {}

  def _handle(self, signum, frame):
    if signum == signal.SIGINT:
      if self.requested == "SIGINT":
        raise KeyboardInterrupt
      self.log("\nCtrl-C: saving a checkpoint after this step, then stopping (press Ctrl-C again to abort now, "
               "losing the steps since the last checkpoint).")
    self.requested = self.requested or signal.Signals(signum).name

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      wanted = (signal.SIGTERM, signal.SIGINT) if jax.process_count() == 1 else ()
      self._previous = {s: signal.signal(s, self._handle) for s in wanted}
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
