"""Hostile workdirs and faults (issue 45): a dangling link as the lock, a full disk while taking the lock or while
training, Ctrl-C during evaluation, and a --data_dir that names a file end in one line naming the path and the
fix. Issue 55: the heartbeat never writes through a planted link; Ctrl-C and a full disk in hourglass-data
prepare, a build finished by another run meanwhile, and a second Ctrl-C during a save end in one line."""

import ast
import contextlib
import errno
import os
import pathlib
import re
import shutil
import subprocess

import jax
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import files, paths
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.checkpointing.workdir_lock import WorkdirLock
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.loop import preemption
from hourglass_jax.train.reporting import run_files
from tests.helpers import quiet, run, train_command, trained_run


@pytest.mark.parametrize("target", ["missing", "elsewhere"])
def test_a_link_as_the_lock_is_refused_in_one_line(tmp_path, target):
  (tmp_path / "elsewhere").write_text("{}")
  (tmp_path / "lock").symlink_to(tmp_path / target)
  with pytest.raises(TrainError, match=r"lock is a symbolic link .*delete the link and rerun"):
    with WorkdirLock(tmp_path, quiet):
      pass
  assert (tmp_path / "elsewhere").read_text() == "{}"  # the link's target is left alone


def test_the_heartbeat_never_writes_through_a_planted_link(tmp_path, monkeypatch):
  """A link planted where a heartbeat could write its temporary file (issue 55): the file outside the workdir is
  left alone and the lock stays a regular file holding this run's record."""
  from hourglass_jax.train.checkpointing import workdir_lock

  monkeypatch.setattr(workdir_lock, "HEARTBEAT_SECONDS", 3600.0)  # heartbeats driven by hand below
  outside = tmp_path / "outside.txt"
  outside.write_text("precious")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / f"lock.{os.getpid()}.tmp").symlink_to(outside)
  with WorkdirLock(workdir, quiet) as lock:
    assert lock.refresh()
    assert not os.path.islink(workdir / "lock") and lock._is_ours(lock._holder())
  assert outside.read_text() == "precious"
  assert sorted(p.name for p in workdir.iterdir()) == [f"lock.{os.getpid()}.tmp"]  # the link, and no temporary


def test_a_full_disk_while_locking_names_the_lock_and_leaves_none(tmp_path, monkeypatch):
  from hourglass_jax.runtime import files

  def full_disk(fd, data):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(files, "_write_all", full_disk)
  with pytest.raises(TrainError, match=rf"cannot write the lock file {tmp_path / 'lock'} \(No space left on device\)"
                                       ".*free disk space"):
    with WorkdirLock(tmp_path, quiet):
      pass
  monkeypatch.undo()
  assert not os.path.lexists(tmp_path / "lock")


@pytest.mark.parametrize("under", [False, True])
def test_a_data_dir_that_is_a_file_names_the_flag(tmp_path, under):
  (tmp_path / "file").write_text("x")
  given = tmp_path / "file" / "sub" if under else tmp_path / "file"
  with pytest.raises(ValueError, match=rf"--data_dir={given} (is a file|lies under the file .*file); pass a folder"):
    paths.check_local_data_dir(str(given), "--data_dir")
  paths.check_local_data_dir(str(tmp_path / "new" / "data"), "--data_dir")
  paths.check_local_data_dir("", "--config.data.data_dir")  # unset: the default folder


def test_ctrl_c_in_a_reading_command_is_one_line_and_exit_130(capsys):
  from hourglass_jax.cli import main

  def interrupted():
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as exit_:
    main._run_reader(interrupted, "hourglass-eval")
  assert exit_.value.code == 130
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: hourglass-eval interrupted (Ctrl-C)") and "\n" not in err


@pytest.mark.parametrize("fault, expected", [
    (KeyboardInterrupt(), r"error: hourglass-data prepare interrupted \(Ctrl-C\); nothing was lost: rerun"),
    (RuntimeError('Failed to finalize writing of split "train": write() failed: No space left on device; writing '
                  'x.array_record'), r"error: disk full: building text_files under .*data failed \(no space left on "
                                     r"device\); the partial build is not kept\. Free disk space .*then rerun\."),
], ids=["ctrl-c", "full disk"])
def test_prepare_ends_ctrl_c_and_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys, fault, expected):
  """Issue 55: hourglass-data prepare interrupted, or out of space (array_record's RuntimeError), in one line."""
  import types

  import tensorflow_datasets as tfds

  from hourglass_jax.cli import main

  def fail(builder, **kwargs):
    raise fault

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
  (tmp_path / "corpus.txt").write_text("some text\n" * 20)
  monkeypatch.setattr(main, "_MANUAL_DIR", types.SimpleNamespace(value=str(tmp_path / "corpus.txt")))
  monkeypatch.setattr(main, "_DATA_DIR", types.SimpleNamespace(value=str(tmp_path / "data")))
  with pytest.raises(SystemExit) as exit_:
    main._data(["hourglass-data", "prepare", "text_files"])  # what `hourglass-data prepare text_files` runs
  code = exit_.value.code
  err = code if isinstance(code, str) else capsys.readouterr().err.strip()
  assert re.fullmatch(expected + ".*", err) and "\n" not in err, err
  assert code == 130 if isinstance(fault, KeyboardInterrupt) else isinstance(code, str)


def test_a_dataset_prepared_by_another_run_meanwhile_is_not_reported_as_built(tmp_path, monkeypatch):
  """Issue 55: two hourglass-data prepare of text_files on one --data_dir: the second waits for the first's build
  lock, then finds the first one's corpus there and says so instead of "built"."""
  from hourglass_jax.data.io import prepare, tfds_io

  for name in ("first", "second"):
    (tmp_path / name).mkdir()
    for i in range(3):
      (tmp_path / name / f"{i}.txt").write_text(f"{name} corpus, file {i}\n" * 10)
  real_lock = tfds_io._build_lock

  def the_other_run_builds_first(root, name):
    monkeypatch.setattr(tfds_io, "_build_lock", real_lock)
    tfds_io.prepare("text_files", str(root), str(tmp_path / "first"), progress=False, log=quiet)
    return real_lock(root, name)

  monkeypatch.setattr(tfds_io, "_build_lock", the_other_run_builds_first)
  with pytest.raises(ValueError, match=r"text_files was prepared at .*text_files.1.0.0 by another hourglass-data run "
                                       r"while this one waited for it: .*not necessarily --manual_dir=.*second, and "
                                       r"nothing was built here\. Use another --data_dir, or delete"):
    prepare.prepare_command("text_files", str(tmp_path / "data"), str(tmp_path / "second"), log=quiet)


def test_an_archive_with_the_wrong_checksum_is_one_line(tmp_path, monkeypatch):
  """cifar10 / downsampled ImageNet archives whose checksum does not match: TFDS's error, as one line with the fix."""
  import tensorflow_datasets as tfds
  from tensorflow_datasets.core.download.download_manager import NonMatchingChecksumError

  from hourglass_jax.data.io import tfds_io

  def wrong_checksum(builder, **kwargs):
    raise NonMatchingChecksumError(f"Artifact https://x/cifar-10.tar.gz, downloaded to {tmp_path}/c.tar.gz, has "
                                   "wrong checksum:\n* Expected: ...\n* Got: ...")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", wrong_checksum)
  with pytest.raises(ValueError, match=r"digits: Artifact .* has wrong checksum: a truncated, damaged or wrong file\. "
                                       "Delete it, download it again") as error:
    tfds_io.prepare("digits", str(tmp_path / "data"), progress=False, log=quiet)
  assert "\n" not in str(error.value)


def test_orbax_disk_full_tracebacks_are_left_to_the_one_line_report(tmp_path):
  """A full disk during an async save: Orbax's threads log a traceback each, and asyncio one per abandoned write
  task ("Task exception was never retrieved"); while checkpoints are open those records are dropped (Checkpoints
  raises one TrainError naming the folder), other records pass."""
  import logging

  from absl import logging as absl_logging

  from hourglass_jax.train.checkpointing.checkpoint import Checkpoints

  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logging.getLogger().addHandler(handler)  # the root's: where absl's and asyncio's records reach a handler
  full = ValueError("RESOURCE_EXHAUSTED: Error writing \"opt_state\" in OCDBT database: Failed to write 23746 bytes "
                    "to file 10: No space left on device [os_error_code='28']")
  try:
    with Checkpoints(tmp_path / "checkpoints", log=quiet):
      try:
        raise OSError(errno.ENOSPC, "No space left on device")
      except OSError:
        absl_logging.exception("_SignalingThread.run() raised an exception")
      logging.getLogger("asyncio").error("Task exception was never retrieved", exc_info=(ValueError, full, None))
      absl_logging.error("some other failure")
      logging.getLogger("asyncio").error("another task failed", exc_info=(ValueError, ValueError("other"), None))
  finally:
    logging.getLogger().removeHandler(handler)
  assert [r.getMessage() for r in records] == ["some other failure", "another task failed"]


def test_writes_abandoned_by_a_failed_save_print_nothing(tmp_path):
  """TensorStore writes that complete after Orbax closed the event loop of a failed save report "Event loop is
  closed" as unraisable errors, dozens per save: dropped while checkpoints are open (and after a save ran out of
  space); other unraisable errors reach the previous hook."""
  import sys
  import types

  seen = []
  previous, sys.unraisablehook = sys.unraisablehook, seen.append
  try:
    with Checkpoints(tmp_path / "checkpoints", log=quiet):
      for error in (RuntimeError("Event loop is closed"), ValueError("other")):
        sys.unraisablehook(types.SimpleNamespace(exc_value=error, object=None))
    assert sys.unraisablehook == seen.append  # removed on closing, as no save failed
  finally:
    sys.unraisablehook = previous
  assert [str(u.exc_value) for u in seen] == ["other"]


def test_a_second_ctrl_c_during_a_save_ends_in_one_line(tmp_path, monkeypatch, capsys):
  """Issue 55: a Ctrl-C that interrupts a save leaves Orbax's record of it (a traceback) and abandoned writes that
  each report "Event loop is closed", hundreds of lines: both are dropped after checkpoints close on the interrupt,
  and hourglass-train prints its one line and exits 130 at once (os._exit: no shutdown runs the abandoned writes)."""
  import logging
  import sys
  import types

  from absl import logging as absl_logging

  from hourglass_jax.cli import main

  records, seen = [], []
  handler = logging.Handler()
  handler.emit = records.append
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  previous, sys.unraisablehook = sys.unraisablehook, seen.append
  try:
    with pytest.raises(KeyboardInterrupt), Checkpoints(tmp_path / "checkpoints", log=quiet):
      try:
        raise KeyboardInterrupt
      except KeyboardInterrupt:
        absl_logging.exception("[wait_until_finished] Save Finalize thread (save_finalize) failed.")
      raise KeyboardInterrupt
    for error in (RuntimeError("Event loop is closed"), ValueError("other")):
      sys.unraisablehook(types.SimpleNamespace(exc_value=error, object=None))
  finally:
    sys.unraisablehook = previous
    logger.removeHandler(handler)
  assert not records and [str(u.exc_value) for u in seen] == ["other"]

  def interrupted(fn):
    raise KeyboardInterrupt

  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(main, "_run", interrupted)
  monkeypatch.setattr(os, "_exit", exit_now)
  with pytest.raises(SystemExit) as exit_:
    main._train()
  err = capsys.readouterr().err.strip()
  assert exit_.value.code == preemption.EXIT_INTERRUPTED and "\n" not in err
  assert err.startswith("error: aborted by a second Ctrl-C; the steps since the last checkpoint are lost.")


# Run as `python -c FULL_CHECKPOINTS ROOT ARGS...`: every Python-level write under ROOT fails with ENOSPC (Orbax
# writes its metadata and the data position this way; TensorStore's array writes are native and unaffected),
# then hourglass-train runs with ARGS. Stands in for a full disk where tmpfs cannot be mounted.
FULL_CHECKPOINTS = """
import builtins, errno, io, os, sys
root = os.path.realpath(sys.argv.pop(1))
real_open = io.open

def open_(file, mode="r", *args, **kwargs):
  if (set(mode) & set("wax+") and isinstance(file, (str, os.PathLike))
      and os.path.realpath(file).startswith(root + os.sep)):
    raise OSError(errno.ENOSPC, "No space left on device", os.fspath(file))
  return real_open(file, mode, *args, **kwargs)

builtins.open = io.open = open_
from hourglass_jax.cli.main import train_entry
train_entry()
"""


@contextlib.contextmanager
def full_disk(workdir):
  """Yields a function that fills the disk under `workdir` (which holds a finished run) and returns how to start
  hourglass-train there: a small tmpfs mounted on `workdir`, or, where mounting is not permitted, the patched
  writer of FULL_CHECKPOINTS."""
  mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
      ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(workdir)], capture_output=True).returncode == 0

  def fill(*flags):
    command = train_command(workdir, *flags)
    if mounted:  # leave room for the lock and the summaries, not for another checkpoint
      (workdir / "filler").write_bytes(b"\0" * (shutil.disk_usage(workdir).free - 256 * 1024))
      return command
    return [command[0], "-c", FULL_CHECKPOINTS, str(workdir / "checkpoints"), *command[3:]]

  try:
    yield fill
  finally:
    if mounted:
      subprocess.run(["umount", "--lazy", str(workdir)], check=True)


# Run as `python -c _LIMITED BYTES CODE ARGS...`: CODE under a file-size limit of BYTES (RLIMIT_FSIZE, as `ulimit -f`
# sets it; Python ignores SIGXFSZ, so a write past it fails with EFBIG), with ARGS as its command line.
_LIMITED = """
import resource, sys
limit = int(sys.argv.pop(1))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
exec(sys.argv.pop(1))
"""


@contextlib.contextmanager
def file_size_limit(workdir):
  """`full_disk`'s form for the file-size limit (issue 64): hourglass-train under RLIMIT_FSIZE (`ulimit -f`) of half
  the largest file of the checkpoint already in `workdir`, so a later checkpoint cannot be written (EFBIG) while
  the lock, metrics and summaries can."""
  def fill(*flags):
    largest = max(path.stat().st_size for path in (workdir / "checkpoints").rglob("*") if path.is_file())
    python, _, code, *rest = train_command(workdir, *flags)
    return [python, "-c", _LIMITED, str(largest // 2), code, *rest]

  yield fill


@pytest.mark.parametrize("limit, cause, fix", [
    (full_disk, r"no space left on device", r"Free disk space .*point --workdir there\)"),
    (file_size_limit, r"file too large: this process's file-size limit, ulimit -f, was reached",
     r"Raise the file-size limit \(ulimit -f unlimited, or ask your administrator\)"),
], ids=["full disk", "ulimit -f"])
def test_a_full_disk_during_training_ends_in_one_line_and_keeps_the_last_checkpoint(tmp_path, limit, cause, fix):
  """A run that resumes from step 2 and finds no room for step 4's checkpoint: one line naming the folder, the
  step that failed, the one intact and the fix; exit 74; no traceback; the lock gone; step 2 restores unchanged.
  Issue 64: the file-size limit (EFBIG) is met the same way (it printed 400 lines of Orbax's threads' tracebacks),
  and the run stops at the failed save rather than training on to its last step."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  with limit(workdir) as fill:
    cfg, trainer, saved, _ = trained_run(workdir, steps=2, every_steps=2)
    result = run(fill("--config.train.steps=8", "--config.checkpoint.every_steps=2"))
    assert result.returncode == preemption.EXIT_DISK_FULL, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Event loop is closed" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr[-3000:]
    assert re.fullmatch(rf"error: disk full: saving checkpoint step 4 under {re.escape(str(workdir))}/checkpoints "
                        rf"failed \({cause}\); checkpoint step 2 is intact\. {fix}, then rerun the same command to "
                        r"resume from step 2\.", errors[0]), errors[0]
    assert not os.path.lexists(workdir / "lock")
    assert max(r["step"] for r in run_files.read_metrics(workdir)) < 8  # stopped at the failed save
    with jax.set_mesh(trainer.mesh), Checkpoints(workdir / "checkpoints", read_only=True, log=quiet) as checkpoints:
      state, _, step = checkpoints.restore_latest(trainer.abstract, config_record(run_config(cfg)))
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), saved)


# Writes the package makes through hourglass_jax.runtime.files only (issue 64). Calls that open, create, copy, rename or
# save a file, matched by name; a stream writer (PIL's save, matplotlib's savefig) passes when it writes into a file
# object from files.atomic_file or into memory (io.BytesIO).
_WRITE_CALLS = {"write_text", "write_bytes", "touch", "mkdir", "makedirs", "rename", "symlink", "symlink_to",
                "hardlink_to", "link", "truncate", "ftruncate", "mkfifo", "fdopen", "savez", "savez_compressed",
                "tofile", "save_file", "copyfile", "copy2", "copytree", "copymode", "mkstemp", "mkdtemp",
                "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile", "TemporaryDirectory"}
_STREAM_CALLS = {"save", "savefig", "dump"}  # write into their first argument
_ALLOWED = {"self.manager.save": "Orbax's checkpoint writer (its own temporary folders and commit protocol)",
            "checkpoints.save": "train/checkpointing/checkpoint.Checkpoints.save, which is Orbax's",
            "safetensors.numpy.save": "serialises to bytes in memory"}


def _dotted(node) -> str:
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    return f"{_dotted(node.value)}.{node.attr}"
  if isinstance(node, ast.Call):
    return f"{_dotted(node.func)}()"
  return "?"


def _write_mode(node) -> bool:
  """A mode argument that may write: a constant with w, a, x or +, or anything not a constant."""
  return not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or bool(set(node.value) & set("wax+"))


def bypassing_writes(source: str) -> list[str]:
  """The calls in `source` that write a file other than through hourglass_jax.runtime.files, as 'line: call'."""
  tree = ast.parse(source)
  streams = set()  # names bound to a file object of files.atomic_file or an in-memory buffer
  for node in ast.walk(tree):
    if isinstance(node, ast.withitem) and node.optional_vars is not None and isinstance(node.context_expr, ast.Call):
      if _dotted(node.context_expr.func).endswith("files.atomic_file"):
        streams.add(_dotted(node.optional_vars))
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
        _dotted(node.value.func).split(".")[-1] in ("BytesIO", "StringIO"):
      streams.update(_dotted(target) for target in node.targets)
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    name, args = _dotted(node.func), node.args
    last = name.split(".")[-1]
    if name.startswith("files.") or ".files." in name:
      continue  # the primitive itself
    mode = next((k.value for k in node.keywords if k.arg == "mode"), None)
    if name in ("open", "io.open", "builtins.open"):
      bad = _write_mode(mode if mode is not None else args[1]) if (mode is not None or len(args) > 1) else False
    elif last == "open" and name.startswith("os."):
      bad = True
    elif last == "open":  # Path.open(mode), ZipFile.open(member): a constant write mode only
      first = mode if mode is not None else (args[0] if args else None)
      bad = isinstance(first, ast.Constant) and isinstance(first.value, str) and _write_mode(first)
    elif name.startswith(("tempfile.", "shutil.copy", "shutil.move")) or name in ("os.replace", "os.rename",
                                                                                    "os.write", "os.mkdir"):
      bad = True
    elif last == "replace":  # Path.replace(target); str.replace takes two arguments, dataclasses.replace keywords
      bad = len(args) == 1 and not node.keywords and not name.startswith("dataclasses.")
    elif last in _STREAM_CALLS:
      bad = name not in _ALLOWED and not (args and _dotted(args[0]) in streams)
    else:
      bad = last in _WRITE_CALLS
    if bad:
      found.append(f"{node.lineno}: {name}()")
  return found


def test_every_write_in_the_package_goes_through_the_one_primitive():
  """DESIGN: "A file write: the one atomic-write / lock primitive ... Nothing else opens a file for writing." Every
  module of hourglass_jax but files.py is scanned for calls that write a file (open for writing, write_text /
  write_bytes, os.open, np.save, mkdir, rename, tempfile, shutil copies, a stream writer not given one of files'
  streams)."""
  root = pathlib.Path(files.__file__).parents[1]  # the package, runtime/files.py included
  bypasses = {str(path.relative_to(root.parent)): found for path in sorted(root.rglob("*.py"))
              if path != pathlib.Path(files.__file__) and (found := bypassing_writes(path.read_text()))}
  assert not bypasses, f"writes that bypass hourglass_jax.runtime.files: {bypasses}"


@pytest.mark.parametrize("source, found", [
    ("open(p, 'w')", ["1: open()"]), ("open(p, mode)", ["1: open()"]), ("open(p)", []), ("open(p, 'rb')", []),
    ("path.open('ab')", ["1: path.open()"]), ("zf.open(member)", []), ("os.open(p, os.O_RDONLY)", ["1: os.open()"]),
    ("p.write_text('x')", ["1: p.write_text()"]), ("np.save(p, x)", ["1: np.save()"]),
    ("figure.savefig(p)", ["1: figure.savefig()"]), ("p.mkdir(parents=True)", ["1: p.mkdir()"]),
    ("with files.atomic_file(p) as f:\n  figure.savefig(f)", []), ("b = io.BytesIO()\nimage.save(b)", []),
    ("tempfile.mkstemp(dir=d)", ["1: tempfile.mkstemp()"]), ("a.replace(b)", ["1: a.replace()"]),
    ("s.replace('/', '_')", []), ("dataclasses.replace(cfg, x=1)", []), ("json.dump(x, f)", ["1: json.dump()"]),
    ("self.manager.save(step, args=a)", []), ("shutil.copyfile(a, b)", ["1: shutil.copyfile()"]),
])
def test_the_scan_finds_writes(source, found):
  assert bypassing_writes(source) == found


@pytest.fixture
def predictable(monkeypatch):
  """Makes files' next temporary names predictable ('0123abcd' the first `n` times), so a test can plant a link at
  one: returns a function taking n. Later names are random again."""
  real = files.secrets.token_hex

  def plant(n: int = 1) -> str:
    left = [n]

    def token(nbytes):
      left[0] -= 1
      return "0123abcd" if left[0] >= 0 else real(nbytes)

    monkeypatch.setattr(files.secrets, "token_hex", token)
    return "0123abcd"

  return plant


def _victim(tmp_path) -> pathlib.Path:
  victim = tmp_path / "elsewhere" / "victim"
  victim.parent.mkdir(exist_ok=True)
  victim.write_text("precious")
  return victim


def _links(folder, names, target) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for name in names:
    (folder / name).symlink_to(target)


def _untouched(tmp_path, victim) -> None:
  assert victim.read_text() == "precious"
  assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"]


def test_metrics_never_follow_a_planted_link(tmp_path, predictable):
  """Issue 64: links at metrics.jsonl's old fixed temporary name and at its next unique one (made predictable): the
  victim outside the workdir is untouched and metrics.jsonl is a file holding the record; a link as metrics.jsonl
  itself is refused in one line before the run compiles."""
  from hourglass_jax.train.reporting import run_files

  victim, workdir = _victim(tmp_path), tmp_path / "run"
  _links(workdir, [".metrics.jsonl.tmp", f".metrics.jsonl.{predictable(3)}.tmp"], victim)
  log = run_files.MetricsLog(workdir, 0, enabled=True)
  log.write(dict(step=1, split="train", loss=1.0))
  log.close()
  _untouched(tmp_path, victim)
  assert not os.path.islink(workdir / "metrics.jsonl") and run_files.read_metrics(workdir)[0]["step"] == 1
  (workdir / "metrics.jsonl").unlink()
  (workdir / "metrics.jsonl").symlink_to(victim)
  with pytest.raises(files.RefusedPath, match=rf"^{workdir}/metrics.jsonl is a symbolic link \(to {victim}\), not "
                                              r"the log hourglass-train appends to.*Delete the link and rerun\.$"):
    run_files.check_metrics(workdir)
  with pytest.raises(files.RefusedPath, match="is a symbolic link"):
    files.open_append(workdir / "metrics.jsonl")
  _untouched(tmp_path, victim)


def test_evaluation_records_never_follow_a_planted_link(tmp_path, predictable):
  """Issue 64: links at evaluations/.20_test.json.tmp (the old fixed name) and at the next unique name leave the
  victim untouched; evaluations/ as a link to another folder, or a file, is said in one line, nothing written."""
  from hourglass_jax.train.reporting import run_files

  victim, workdir = _victim(tmp_path), tmp_path / "run"
  _links(workdir / "evaluations", [".20_test.json.tmp", f".20_test.json.{predictable(3)}.tmp"], victim)
  run_files.record_evaluation(workdir, 20, "test", dict(bits=1.5, whole_split=True), log=quiet)
  _untouched(tmp_path, victim)
  assert run_files.evaluations(workdir, 20)["test"]["bits"] == 1.5
  for planted in ("link", "file"):
    other = tmp_path / planted
    other.mkdir()
    shutil.rmtree(other / "evaluations", ignore_errors=True)
    (other / "evaluations").symlink_to(victim.parent) if planted == "link" else (other / "evaluations").write_text("")
    lines = []
    run_files.record_evaluation(other, 20, "test", dict(bits=1.5, whole_split=True), log=lines.append)
    what = (rf"is a symbolic link \(to {victim.parent}\), not a folder" if planted == "link" else
            "is a file, not a folder")
    assert len(lines) == 1 and re.fullmatch(rf"note: the score was not recorded in {other}/evaluations \({other}/"
                                            rf"evaluations {what}.*\); hourglass-export's card will not show it\.",
                                            lines[0]), lines
    _untouched(tmp_path, victim)


def test_the_build_lock_never_follows_a_planted_link(tmp_path, monkeypatch, capsys):
  """Issue 64: a link at DATA_DIR/.text_files.lock made `hourglass-data prepare` truncate its target; it is refused
  in one line, the victim intact."""
  import types

  from hourglass_jax.cli import main

  victim, data_dir = _victim(tmp_path), tmp_path / "data"
  _links(data_dir, [".text_files.lock"], victim)
  (tmp_path / "corpus.txt").write_text("some text\n" * 20)
  monkeypatch.setattr(main, "_MANUAL_DIR", types.SimpleNamespace(value=str(tmp_path / "corpus.txt")))
  monkeypatch.setattr(main, "_DATA_DIR", types.SimpleNamespace(value=str(data_dir)))
  with pytest.raises(SystemExit) as exit_:
    main._data(["hourglass-data", "prepare", "text_files"])
  assert exit_.value.code == (f"error: {data_dir}/.text_files.lock is a symbolic link (to {victim}), not a lock file "
                              "this program made; writing there would write wherever it points. Delete the link and "
                              "rerun.")
  _untouched(tmp_path, victim)


def test_moving_a_checkpoint_aside_never_follows_a_planted_link(tmp_path):
  """Issue 64: a dangling link at checkpoints_unreadable/README.txt made a run create the link's target outside the
  workdir; the README is now written beside it (the link replaced). checkpoints_unreadable/ as a link to another
  folder is refused, the checkpoint left where it is."""
  victim = _victim(tmp_path)
  for case in ("readme", "folder"):
    workdir = tmp_path / case
    (workdir / "checkpoints" / "5").mkdir(parents=True)
    if case == "readme":
      _links(workdir / "checkpoints_unreadable", ["README.txt"], tmp_path / "elsewhere" / "created")
    else:
      (workdir / "checkpoints_unreadable").symlink_to(victim.parent)
    with Checkpoints(workdir / "checkpoints", log=quiet) as checkpoints:
      if case == "readme":
        checkpoints._move_aside(5)
      else:
        with pytest.raises(files.RefusedPath, match=rf"{workdir}/checkpoints_unreadable is a symbolic link"):
          checkpoints._move_aside(5)
    _untouched(tmp_path, victim)
    aside = workdir / "checkpoints_unreadable"
    if case == "readme":
      assert not os.path.islink(aside / "README.txt") and (aside / "README.txt").read_text().startswith("Checkpoints")
      assert [p.name.split("-")[0] for p in aside.iterdir() if p.name != "README.txt"] == ["5"]
    else:
      assert (workdir / "checkpoints" / "5").is_dir()


def test_pictures_never_follow_a_planted_link(tmp_path, predictable):
  """Issue 64: the image sampler's PNG and hourglass-plot's picture replace a link planted at their name (or at the
  next temporary name) rather than write through it; a link as the workdir's samples/ folder is refused."""
  from hourglass_jax.data.batches.images import save_png_grid
  from hourglass_jax.train.reporting import curves, run_files

  victim, workdir = _victim(tmp_path), tmp_path / "run"
  _links(workdir / "samples", ["images_step4.png", f".images_step4.png.{predictable(1)}.tmp"], victim)
  images = np.zeros((2, 4, 4, 1), np.uint8)
  save_png_grid(images, workdir / "samples" / "images_step4.png", inside=workdir)
  log = run_files.MetricsLog(workdir, 0, enabled=True)
  log.write(dict(step=1, split="train", loss=1.0, bits_per_byte=1.4, tokens_seen=64))
  log.close()
  _links(workdir, ["curves.png", f".curves.png.{predictable(1)}.tmp"], victim)
  curves.plot_runs([workdir], workdir / "curves.png")
  _untouched(tmp_path, victim)
  for name in ("samples/images_step4.png", "curves.png"):
    assert not os.path.islink(workdir / name) and (workdir / name).read_bytes()[:4] == b"\x89PNG"
  shutil.rmtree(workdir / "samples")
  (workdir / "samples").symlink_to(victim.parent)
  with pytest.raises(files.RefusedPath, match=rf"{workdir}/samples is a symbolic link"):
    save_png_grid(images, workdir / "samples" / "images_step4.png", inside=workdir)
  _untouched(tmp_path, victim)


def test_the_primitive_refuses_links_fifos_and_folders_and_leaves_no_temporary(tmp_path, monkeypatch):
  """hourglass_jax.runtime.files: a lock created exclusively never through a dangling link; appends and locks refuse a
  link or a FIFO (which would block) at once; a folder at a file's name is named; a failed write leaves the old
  file and no temporary."""
  victim = _victim(tmp_path)
  (tmp_path / "dangling").symlink_to(tmp_path / "elsewhere" / "created")
  with pytest.raises(FileExistsError):
    files.create_exclusive(tmp_path / "dangling", "{}")
  os.mkfifo(tmp_path / "fifo")
  for opener in (files.open_append, lambda path: files.held_lock(path).__enter__()):
    with pytest.raises(files.RefusedPath, match=r"fifo is not a regular file \(a device, FIFO or socket\)"):
      opener(tmp_path / "fifo")
    with pytest.raises(files.RefusedPath, match="dangling is a symbolic link"):
      opener(tmp_path / "dangling")
  (tmp_path / "folder").mkdir()
  with pytest.raises(files.RefusedPath, match=r"folder is a folder, not a file; move it aside"):
    files.write_text(tmp_path / "folder", "x")
  with pytest.raises(files.RefusedPath, match=r"^.*/file is a file, not a folder \(in the way of .*/file/sub\)"):
    (tmp_path / "file").write_text("x")
    files.make_folder(tmp_path / "file" / "sub")
  files.write_text(tmp_path / "kept", "old")

  def full_disk(fd, data):
    raise OSError(errno.EFBIG, "File too large")

  monkeypatch.setattr(files, "_write_all", full_disk)
  with pytest.raises(OSError, match="File too large"):
    files.write_text(tmp_path / "kept", "new")
  assert (tmp_path / "kept").read_text() == "old"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "elsewhere", "fifo", "file", "folder", "kept"]
  _untouched(tmp_path, victim)


_GOOD = b'{"step": 2, "split": "train", "loss": 4.0, "bits_per_byte": 5.7, "tokens_seen": 64}\n'


@pytest.mark.parametrize("content, message", [
    (_GOOD + b'{"stXp": 4, "split": "train", "loss": 3.9}\n' + _GOOD,
     r"line 2 is not a record hourglass-train wrote \(it needs an integer 'step' >= 0 and a 'split'\): "
     r"\{\"stXp\": 4"),
    (_GOOD + _GOOD + bytes(range(128, 256)) + b"\n", r"line 3 is not UTF-8 text \(byte 1 of the line\)"),
    (b"step 2 loss 4.0\n", r"line 1 is not JSON \(Expecting value"),
    (b'{"step": "2", "split": "train"}\n', r"line 1 is not a record hourglass-train wrote"),
    (b'{"step": 2, "split": "train", "loss": [4.0]}\n', r"line 1 holds loss=\[4.0\], not a number"),
    (None, r"is a folder, not the metrics log of a run; move it aside, then rerun\."),
], ids=["damaged key", "random bytes", "not json", "step a string", "loss a list", "a folder"])
def test_a_metrics_log_the_run_could_not_append_to_is_named_with_its_line(tmp_path, content, message):
  """Issue 64: a metrics.jsonl line with a damaged key (still JSON) was deleted on resume without a word, random
  bytes ended in a codec error naming no file after the compile, a folder there was refused after the compile:
  each is refused naming the file, its line and the fix (hourglass-train checks it before compiling)."""
  from hourglass_jax.train.reporting import run_files

  if content is None:
    (tmp_path / "metrics.jsonl").mkdir()
  else:
    (tmp_path / "metrics.jsonl").write_bytes(content)
  pattern = rf"^{tmp_path}/metrics.jsonl {message}" + ("" if content is None else
                                                      r".*; restore or delete that line .*, then rerun\.$")
  for read in (run_files.check_metrics, run_files.read_metrics):
    with pytest.raises(ValueError, match=pattern) as error:
      read(tmp_path)
    assert "\n" not in str(error.value)


def test_a_damaged_metrics_log_stops_training_before_the_compile_and_a_torn_line_is_said(tmp_path, monkeypatch):
  """Issue 64: train_and_evaluate refuses a damaged metrics.jsonl before compiling anything; a torn last line (a
  kill mid-write) is dropped with a note, the lines before it kept."""
  from hourglass_jax.train.compiled.trainer import Trainer
  from hourglass_jax.train.loop import loop
  from tests.helpers import tiny_config

  def no_compile(self):
    raise AssertionError("compiled")

  monkeypatch.setattr(Trainer, "compile_train_step", no_compile)
  (tmp_path / "metrics.jsonl").write_bytes(_GOOD + b'{"stXp": 4, "split": "train"}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not a record hourglass-train wrote"):
    loop.train_and_evaluate(tiny_config(), tmp_path, log=quiet)
  assert not os.path.lexists(tmp_path / "lock")
  (tmp_path / "metrics.jsonl").write_bytes(_GOOD + b'{"step": 4, "spl')
  lines = []
  loop._check_run_files(tmp_path, lines.append)
  assert lines == [f'note: {tmp_path}/metrics.jsonl: its last line is torn (the run writing it was killed '
                   'mid-line); dropped: {"step": 4, "spl']
  assert [r["step"] for r in run_files.read_metrics(tmp_path)] == [2]


def test_the_summaries_file_has_an_unpredictable_name(tmp_path):
  """Issue 64: tensorboardX opens its events file itself ('wb', following links), named by the time and host; a
  random suffix keeps a link from being planted at the name beforehand."""
  from hourglass_jax.train.reporting.metrics import SummaryWriter

  for _ in range(2):
    with SummaryWriter(str(tmp_path), enabled=True) as writer:
      writer.scalars(1, {"loss": 1.0})
  names = sorted(p.name for p in tmp_path.iterdir())
  assert len(names) == 2 and all(re.fullmatch(r"events\.out\.tfevents\.\d+\..+\.[0-9a-f]{8}", n) for n in names)


@pytest.mark.parametrize("name", ["6", "6.orbax-checkpoint-tmp"])
def test_a_link_where_orbax_writes_a_checkpoint_is_refused_in_one_line(tmp_path, name):
  """Issue 64: a link at a step's folder or its temporary one (Orbax's names) made Orbax fail in hundreds of lines
  of tracebacks naming no cause; it is refused naming the link, when checkpoints open for writing and before each
  save (a link planted while the run trains)."""
  victim = _victim(tmp_path)
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "checkpoints" / name).symlink_to(victim.parent)
  message = rf"^{tmp_path}/checkpoints/{name} is a symbolic link \(to {victim.parent}\), not a checkpoint folder"
  with pytest.raises(files.RefusedPath, match=message):
    Checkpoints(tmp_path / "checkpoints", log=quiet)
  (tmp_path / "checkpoints" / name).unlink()
  with Checkpoints(tmp_path / "checkpoints", log=quiet) as checkpoints:
    (tmp_path / "checkpoints" / name).symlink_to(victim.parent)
    with pytest.raises(files.RefusedPath, match=message):
      checkpoints.save(6, None, {}, {})
  _untouched(tmp_path, victim)
