"""Progress bars (tqdm) that also read well in a log file: on a terminal a bar redraws in place; written to a file or
a pipe (`> train.log`, SLURM, a pod's logs), each refresh is a line of its own, at most one every LOG_SECONDS, and
the last one when the bar ends, instead of one line of carriage-return-joined updates."""

import sys

from tqdm import tqdm

LOG_SECONDS = 10.0  # the longest a redirected log waits for a progress line (tqdm's mininterval there)


class LineWriter:
  """A file for tqdm that writes each bar refresh as one line: tqdm starts a refresh with '\\r' and pads it with
  spaces to overwrite the previous one; here the padding goes, and a repeated line (a bar closed as it last showed)
  is written once."""

  def __init__(self, stream):
    self.stream, self._last = stream, None
    self.encoding = getattr(stream, "encoding", None) or "utf-8"  # tqdm draws the bar in Unicode where it may

  def write(self, text: str) -> None:
    for part in text.replace("\n", "\r").split("\r"):
      line = part.rstrip()
      if line and line != self._last:
        self.stream.write(line + "\n")
        self._last = line
    self.flush()

  def flush(self) -> None:
    self.stream.flush()


def progress_bar(stream=None, **kwargs) -> tqdm:
  """tqdm(**kwargs) on `stream` (default stderr), one line per refresh when `stream` is not a terminal, the last
  one included: a log erases nothing, so a bar that a terminal clears when it ends (leave=False) still ends on its
  final frame there, not on the first (a bar shorter than LOG_SECONDS shows no other)."""
  stream = stream or sys.stderr
  if not (hasattr(stream, "isatty") and stream.isatty()):
    kwargs = dict(kwargs, file=LineWriter(stream), mininterval=max(kwargs.get("mininterval", 0.1), LOG_SECONDS),
                  dynamic_ncols=False, leave=True)
  else:
    kwargs = dict(kwargs, file=stream)
  return tqdm(**kwargs)
