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

from hourglass_jax import paths

METRICS_FILE = "metrics.jsonl"
EVALUATIONS = "evaluations"
_REMOTE_FLUSH_SECONDS = 60.0  # a bucket object cannot be appended to: it is rewritten whole at most this often


def read_metrics(workdir) -> list[dict]:
  """The lines of `workdir`/metrics.jsonl as dicts ([] without the file); a torn last line (a kill mid-write) is
  skipped."""
  path = paths.as_path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int):
      records.append(record)
  return records


def write_atomically(path, text: str) -> None:
  temporary = path.parent / f".{path.name}.tmp"
  temporary.write_text(text)
  temporary.replace(path)


class MetricsLog:
  """Appends records to `workdir`/metrics.jsonl on process 0 (`enabled`); a no-op elsewhere. `start_step`: the step
  the run starts from (its checkpoint's, 0 for a new run): lines past it are dropped first."""

  def __init__(self, workdir, start_step: int, enabled: bool):
    self._file, self._lines, self._flushed = None, None, time.monotonic()
    self.path, self.tokens = paths.as_path(workdir) / METRICS_FILE, {}
    if not enabled:
      return
    kept = [record for record in read_metrics(workdir) if record["step"] <= start_step]
    self.tokens = {record["step"]: record["tokens_seen"] for record in kept if "tokens_seen" in record}
    text = "".join(json.dumps(record) + "\n" for record in kept)
    if paths.is_remote(self.path):
      self._lines = [text]
    else:
      write_atomically(self.path, text)
      self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

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
      from hourglass_jax.paths import is_disk_full  # pylint: disable=import-outside-toplevel
      from hourglass_jax.train.checks import DiskFullError  # pylint: disable=import-outside-toplevel

      if not is_disk_full(error):
        raise
      raise DiskFullError(f"disk full: writing {self.path} failed (no space left on device). Free disk space (or "
                          "copy the workdir to a larger disk and point --workdir there), then rerun the same command "
                          "to resume from the newest checkpoint.") from error

  def _rewrite(self) -> None:
    write_atomically(self.path, "".join(self._lines))
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
  folder = paths.as_path(workdir) / EVALUATIONS
  record = dict(step=step, split=split, **{key: _plain(value) for key, value in result.items() if key != "metrics"},
                metrics={name: _plain(value) for name, value in result.get("metrics", {}).items()})
  try:
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / f"{step}_{split}.json", json.dumps(record, indent=1) + "\n")
  except OSError as error:
    log(f"note: the score was not recorded in {folder} ({error.strerror or error}); hourglass-export's card will "
        "not show it.")


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
