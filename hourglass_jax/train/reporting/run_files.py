"""The plain files a run keeps in its workdir beside the checkpoints and TensorBoard's events, for grep, pandas,
`hourglass-plot` and the card `hourglass-export` writes:

- `metrics.jsonl`, the trainer's: one JSON object per line for every logged training step (split 'train') and
  every evaluation (the eval split's name), with the step, loss (nats), bits per byte (or dim), tokens seen, and for
  training the learning rate, gradient norm, tokens/s and what the model sows (a learned level's boundary_rate).
  A run that resumes from checkpoint step S first drops the lines of steps after S (written by a run that went on
  past that checkpoint and stopped), so the file holds one history: the steps that led to the state being trained.
- `evaluations/STEP_SPLIT.json`, hourglass-eval's: its score of one checkpoint step on one split.
"""

import json
import time

from hourglass_jax.runtime import files, paths

METRICS_FILE = "metrics.jsonl"
EVALUATIONS = "evaluations"
_REMOTE_FLUSH_SECONDS = 60.0  # a bucket object cannot be appended to: it is rewritten whole at most this often
_NUMBERS = ("loss", "bits_per_byte", "bits_per_dim", "tokens_seen")  # numbers where present (NaN/inf as strings)
_FIX = "restore or delete that line (or move the file aside: a run then starts a new one), then rerun"


def read_metrics(workdir) -> list[dict]:
  """The records of `workdir`/metrics.jsonl ([] without the file). A torn last line (a kill mid-write) is skipped;
  anything else that is not a record hourglass-train wrote (not UTF-8, not JSON, no integer 'step' or no 'split', a
  logged number that is not one) raises ValueError naming the file, the line and the fix: a damaged line is never
  dropped or taken for another step's."""
  return _parse(paths.as_path(workdir) / METRICS_FILE)[0]


def check_metrics(workdir) -> str | None:
  """Raises ValueError, as `read_metrics` does, for a metrics.jsonl a run could not append to (damaged, a folder,
  a symbolic link); returns a note about a torn last line, which the run drops, else None."""
  path = paths.as_path(workdir) / METRICS_FILE
  files.refuse_link(path, "the log hourglass-train appends to")
  torn = _parse(path)[1]
  return (f"{path}: its last line is torn (the run writing it was killed mid-line); dropped: {torn}" if torn else
          None)


def _parse(path) -> tuple[list[dict], str | None]:
  """(the records of metrics file `path`, a preview of its torn last line or None)."""
  if not path.exists():
    return [], None
  if path.is_dir():
    raise ValueError(f"{path} is a folder, not the metrics log of a run; move it aside, then rerun.")
  lines = path.read_bytes().split(b"\n")
  last = lines.pop()  # b"" after a final newline, else a line cut short
  records = []
  for number, line in enumerate(lines, 1):
    record, problem = _record(line)
    if problem:
      raise ValueError(f"{path} line {number} {problem}; {_FIX}.")
    if record is not None:
      records.append(record)
  record, problem = _record(last)
  if record is not None and not problem:
    records.append(record)
  return records, (_preview(last) if last.strip() and problem else None)


def _record(line: bytes) -> tuple[dict | None, str | None]:
  """(the record on `line`, or None for a blank line; what is wrong with it, or None)."""
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError as error:
    return None, f"is not UTF-8 text (byte {error.start + 1} of the line): the file is damaged"
  if not text.strip():
    return None, None
  try:
    record = json.loads(text)
  except ValueError as error:
    return None, f"is not JSON ({error}): {_preview(line)}"
  if not isinstance(record, dict):
    return None, f"is not a JSON object: {_preview(line)}"
  step, split = record.get("step"), record.get("split")
  if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(split, str):
    return None, ("is not a record hourglass-train wrote (it needs an integer 'step' >= 0 and a 'split'): "
                  f"{_preview(line)}")
  wrong = [key for key in _NUMBERS if key in record and not _number(record[key])]
  if wrong:
    return None, f"holds {wrong[0]}={record[wrong[0]]!r}, not a number: {_preview(line)}"
  return record, None


def _number(value) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value in ("nan", "inf", "-inf")


def _preview(line: bytes, width: int = 80) -> str:
  text = line.decode("utf-8", errors="replace").strip()
  return text if len(text) <= width else text[:width] + "..."


class MetricsLog:
  """Appends records to `workdir`/metrics.jsonl on process 0 (`enabled`); a no-op elsewhere. `start_step`: the step
  the run starts from (its checkpoint's, 0 for a new run): lines past it are dropped first, and said so in `log`.
  The file is rewritten atomically, then appended to without following a link (hourglass_jax.runtime.files)."""

  def __init__(self, workdir, start_step: int, enabled: bool, log=None):
    self._file, self._lines, self._flushed = None, None, time.monotonic()
    self.path, self.tokens = paths.as_path(workdir) / METRICS_FILE, {}
    if not enabled:
      return
    records = read_metrics(workdir)
    kept = [record for record in records if record["step"] <= start_step]
    if len(kept) < len(records) and log is not None:
      log(f"{self.path}: dropped the {len(records) - len(kept)} line(s) of steps after {start_step}, logged by a run "
          f"that went on past checkpoint step {start_step}, which this run resumes")
    self.tokens = {record["step"]: record["tokens_seen"] for record in kept if "tokens_seen" in record}
    text = "".join(json.dumps(record) + "\n" for record in kept)
    if paths.is_remote(self.path):
      self._lines = [text]
    else:
      files.write_text(self.path, text)
      self._file = files.open_append(self.path, "the metrics log hourglass-train appends to")

  def tokens_seen(self, step: int, tokens_per_step: int) -> int:
    """Tokens trained on up to `step`: the newest recorded count before it plus `tokens_per_step` per step since
    (a resumed run may have another batch size than the one it resumes)."""
    before = [s for s in self.tokens if s <= step]
    last = max(before, default=0)
    count = self.tokens.get(last, 0) + (step - last) * tokens_per_step
    self.tokens[step] = count
    return count

  def write(self, record: dict) -> None:
    line = json.dumps({key: _plain(value) for key, value in record.items()}) + "\n"
    try:
      if self._file is not None:
        self._file.write(line)
        self._file.flush()
      elif self._lines is not None:
        self._lines.append(line)
        if time.monotonic() - self._flushed > _REMOTE_FLUSH_SECONDS:
          self._rewrite()
    except OSError as error:
      from hourglass_jax.train.checks import DiskFullError  # pylint: disable=import-outside-toplevel

      cause = paths.disk_full(error)
      if not cause:
        raise
      fix = paths.free_space(cause, "copy the workdir to a larger disk and point --workdir there")
      raise DiskFullError(f"disk full: writing {self.path} failed ({cause}). {fix}, then rerun the same command to "
                          "resume from the newest checkpoint.") from error

  def _rewrite(self) -> None:
    files.write_text(self.path, "".join(self._lines))
    self._flushed = time.monotonic()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    elif self._lines is not None:
      self._rewrite()
      self._lines = None


def _plain(value):
  """A JSON value: floats as Python floats (NaN/inf as strings, which JSON lacks), the rest as given."""
  if isinstance(value, (int, str, bool)) or value is None:
    return value
  value = float(value)
  return value if value == value and abs(value) != float("inf") else str(value)


def record_evaluation(workdir, step: int, split: str, result: dict, log=print) -> None:
  """Writes hourglass-eval's `result` of checkpoint `step` on `split` to `workdir`/evaluations/STEP_SPLIT.json
  (atomically); a workdir this process cannot write (someone else's run) is said in one line, not an error."""
  workdir = paths.as_path(workdir)
  record = dict(step=step, split=split, **{key: _plain(value) for key, value in result.items() if key != "metrics"},
                metrics={name: _plain(value) for name, value in result.get("metrics", {}).items()})
  try:
    folder = files.make_folder(workdir / EVALUATIONS, inside=workdir)
    files.write_text(folder / f"{step}_{split}.json", json.dumps(record, indent=1) + "\n")
  except (OSError, ValueError) as error:
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).rstrip(".")
    log(f"note: the score was not recorded in {workdir / EVALUATIONS} ({reason}); hourglass-export's card will not "
        "show it.")


def recorded_evaluations(workdir) -> list[dict]:
  """hourglass-eval's recorded results in `workdir`, by step ([] when none was recorded)."""
  folder = paths.as_path(workdir) / EVALUATIONS
  found = []
  for path in folder.glob("*_*.json") if folder.is_dir() else []:
    try:
      record = json.loads(path.read_text())
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("split"), str):
      found.append(record)
  return sorted(found, key=lambda record: (record["step"], record["split"]))


def evaluations(workdir, step: int) -> dict[str, dict]:
  """{split: hourglass-eval's recorded result} of checkpoint `step` ({} when none was recorded)."""
  return {record["split"]: record for record in recorded_evaluations(workdir) if record["step"] == step}
