"""Orbax checkpoints of the train state and data position (plus the model config and a fingerprint of every array
as metadata): async saves every N steps and on preemption, the latest N kept, restored onto whatever mesh the
current run has and verified; unreadable or altered ones are moved aside and the previous one is used.

Format 2: the 'data' item holds {'checkpoint_format': 2, 'iterator': the data position, 'record': the run record
and fingerprints}, so the fingerprints and settings live where the data is and deleting Orbax's metadata file
does not switch their checks off; Orbax's metadata keeps a copy, and a checkpoint whose two records disagree was
altered. A checkpoint of the older format (a bare data position) is verified against the fingerprints in Orbax's
metadata. One that records no fingerprints (a format-2 record without them or the settings, or an older
checkpoint whose metadata holds none) cannot be verified: it is treated as unreadable unless `allow_unverified`.

`Checkpoints.restore_latest` is the one reader of these checkpoints: the whole train state (training resumes) or
the params alone (evaluation, sampling, export: an Orbax partial restore, so no optimizer state is read), with
the same checks either way; `read_params` opens a run's workdir read-only for the params alone. `config_record` is
what a checkpoint records about its run (model settings, sequence length, the card's recipe), and
`check_same_function` the check that a config about to resume, evaluate or sample it computes the same function."""

import dataclasses
import json
import logging
import os
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from hourglass_jax.config.train_settings import CheckpointSettings
from hourglass_jax.model.config import function_changes
from hourglass_jax.runtime import files, paths
from hourglass_jax.runtime.paths import disk_full, free_space, is_disk_full
from hourglass_jax.train.checkpointing import integrity
from hourglass_jax.train.checks import DiskFullError, TrainError
from hourglass_jax.train.compiled.state import TrainState

FORMAT_KEY, FORMAT_VERSION = "checkpoint_format", 2
_TMP = ".orbax-checkpoint-tmp"  # Orbax's suffix of a step's folder while it is written
# Orbax's threads log through absl; its write tasks, abandoned when a save fails, through asyncio's default handler.
_REPORTING_LOGGERS = ("absl", "asyncio")
UNVERIFIED_OVERRIDE = "--config.checkpoint.allow_unverified=True"
SETTINGS_CHANGE_OVERRIDE = "--config.checkpoint.allow_settings_change=True"
RECIPE = ("learning_rate", "schedule", "warmup_steps", "min_lr_ratio", "b1", "b2", "eps", "weight_decay",
          "grad_clip_norm", "grad_accum_steps")  # the train settings the card's recipe shows


def unwrap_data(data) -> tuple[object, dict | None]:
  """(the data position, the record saved beside it, or None for the older format)."""
  if isinstance(data, dict) and FORMAT_KEY in data:
    record = data.get("record")
    return data.get("iterator"), record if isinstance(record, dict) else {}
  return data, None


def array_shapes(tree) -> dict[str, tuple[int, ...]]:
  """{'params/body/.../kernel': shape} for arrays or their metadata, whatever the container types."""
  return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def config_record(run) -> dict:
  """What a checkpoint records about its run (a RunConfig, hourglass_jax/config/run.py): its model settings (named in
  mismatch messages), and for the card hourglass-export writes, the sequence length, global batch, data set (its
  name, and the file or folder name of a local one: never the machine's path) and optimizer recipe."""
  source = run.data.path or run.data.data_dir
  data = dict(name=run.data.name, source=os.path.basename(os.path.normpath(source)) if source else None)
  return json.loads(json.dumps({"model": dataclasses.asdict(run.model), "seq_len": run.data.seq_len,
                                "batch_size": run.data.batch_size, "data": data,
                                "train": {name: getattr(run.train, name) for name in RECIPE}}))


def check_same_function(saved: dict, model: dict, where: str) -> None:
  """Raises ValueError when `model` (a config's model section) computes another function than the checkpoint at
  `where` was trained as (`saved`, its recorded model section)."""
  differ = function_changes(saved, model)
  if differ:
    raise ValueError(f"{where} was trained with other model settings than this config ({'; '.join(differ)}); its "
                     "parameters would compute a different function. Pass the config and --config.model overrides "
                     f"the run was trained with, or, to change them on purpose (e.g. fine-tune with another "
                     f"shortening), add {SETTINGS_CHANGE_OVERRIDE}.")


# What Orbax warns when it opens a manager read-only, as asked: that it is read-only, and that it therefore saves
# at no interval. Every reader (eval, sample, export, boundaries, read_params) opens one so.
_READ_ONLY_NOTES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only")


def _quiet_read_only(record: logging.LogRecord) -> bool:
  return not record.getMessage().startswith(_READ_ONLY_NOTES)


class Checkpoints:
  """A CheckpointManager under `directory`; use as a context manager. `read_only` (evaluation) never writes,
  deletes or moves anything, so it can watch the workdir of a run in progress."""

  def __init__(self, directory, every_steps: int = 0, keep: int = 3, async_save: bool = True, log=print,
               read_only: bool = False):
    self.directory, self.log, self.read_only = paths.as_path(directory), log, read_only
    if not read_only:
      self._refuse_planted_links()
    save_policies = [policies.PreemptionCheckpointingPolicy()]
    if every_steps:
      save_policies.append(policies.FixedIntervalPolicy(every_steps))
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(_quiet_read_only)
    try:
      options = ocp.CheckpointManagerOptions(
          save_decision_policy=policies.AnySavePolicy(save_policies), preservation_policy=policies.LatestN(keep),
          enable_async_checkpointing=async_save, cleanup_tmp_directories=not read_only, read_only=read_only,
          create=not read_only)
      # The PyTree handler writes what the standard one does and can also restore the params alone.
      handlers = dict(state=ocp.PyTreeCheckpointHandler(), data=ocp.JsonCheckpointHandler())
      self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
    finally:
      absl_logger.removeFilter(_quiet_read_only)
    self._records, self._previous_hook = {}, None
    self._pending, self.failed = None, False  # the step of the last save started; whether a save ran out of space
    self._settled = None  # the step of the last save known to be finished

  def __enter__(self):
    for name in _REPORTING_LOGGERS:
      logging.getLogger(name).addFilter(self._quiet_reported)
    self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._quiet_abandoned_writes
    self.manager.__enter__()
    return self

  def __exit__(self, error_type, *rest):
    try:
      try:
        self.wait()
      finally:
        self._guard(None, lambda: self.manager.__exit__(error_type, *rest))
    except Exception:
      if error_type is None:
        raise  # else the error leaving the block (a failed save's, say) is the one to report, not its echo here
    finally:
      # After a failed or interrupted save, abandoned writes keep completing: the filters and the hook stay.
      interrupted = error_type is not None and issubclass(error_type, KeyboardInterrupt)
      if not (self.failed or interrupted):
        for name in _REPORTING_LOGGERS:
          logging.getLogger(name).removeFilter(self._quiet_reported)
        if sys.unraisablehook == self._quiet_abandoned_writes:
          sys.unraisablehook = self._previous_hook

  def _quiet_reported(self, record: logging.LogRecord) -> bool:
    """absl's and asyncio's log filter while open: drops the records of Orbax's threads (a traceback each, dozens
    per failed save) and asyncio's "Task exception was never retrieved" for its abandoned write tasks, when about a
    full disk, which `save` and `wait` report in one line naming the folder and the fix, or about a Ctrl-C that
    interrupted a save, which the command reports in one line."""
    error = record.exc_info[1] if record.exc_info else None
    return not (is_disk_full(error) or isinstance(error, KeyboardInterrupt)
                or is_disk_full(RuntimeError(record.getMessage())))

  def _quiet_abandoned_writes(self, unraisable) -> None:
    """`sys.unraisablehook` while open: drops the "Event loop is closed" RuntimeErrors of a failed or interrupted
    async save (the first write that fails, or a Ctrl-C, ends Orbax's event loop while its sibling TensorStore writes
    are in flight, and each of those, when it completes, fails to reach the closed loop and is printed as a
    traceback: dozens per save). The failure itself is reported by `save` and `wait`, a Ctrl-C by the command;
    anything else goes to the previous hook."""
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
      self._previous_hook(unraisable)

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: TrainState, data_state: dict, config: dict, force: bool = False) -> bool:
    """Starts an (async) save of `step`, recording `config` and the fingerprints restore verifies; a full disk
    (here, or in the previous save, still being written) raises DiskFullError, earlier checkpoints stay intact."""
    self._refuse_planted_links(step)
    record = dict(config, fingerprints=integrity.array_fingerprints(state),
                  data_fingerprint=integrity.json_fingerprint(data_state))
    args = ocp.args.Composite(state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(
        {FORMAT_KEY: FORMAT_VERSION, "iterator": data_state, "record": record}))
    started = self._guard(step, lambda: self.manager.save(step, args=args, force=force, custom_metadata=record))
    self._pending = step if started else self._pending
    return started

  def _refuse_planted_links(self, step: int | None = None) -> None:
    """Raises RefusedPath for a symbolic link where Orbax writes or deletes: a step's folder or its temporary one
    (`step`'s, or any in the folder; Orbax would write through it, or fail in tracebacks naming no cause)."""
    if paths.is_remote(self.directory) or not os.path.isdir(self.directory):
      return
    for name in os.listdir(self.directory):
      if (name == str(step) or name.startswith(f"{step}{_TMP}") if step is not None else
          name.isdigit() or _TMP in name):
        files.refuse_link(self.directory / name, "a checkpoint folder this program writes")

  def wait(self) -> None:
    """Blocks until pending saves are on disk."""
    self._guard(None, self.manager.wait_until_finished)
    self._settled = self._pending

  def check_save(self) -> None:
    """Raises as `wait` does once the async save in flight has ended in a failure (a full disk, the file-size
    limit), so training stops at the failed save rather than at the next one. Single-process runs: processes might
    see the end at different steps, so a multi-process run learns of it at its next save, on every process."""
    if (self._pending is None or self._pending == self._settled or jax.process_count() > 1
        or self.manager.is_saving_in_progress()):
      return
    self.wait()

  def _guard(self, step, fn):
    try:
      return fn()
    except Exception as error:
      cause = disk_full(error)
      if not cause:
        raise
      self.failed = True
      try:
        self.manager.reload()  # what is on disk now: a failed save leaves no step folder, only a *-tmp one
        complete = self.all_steps()
      except Exception:
        complete = []
      # An async save fails in the background and surfaces at the next save or wait: name the step that failed.
      failed = self._pending if self._pending is not None and self._pending not in complete else step
      where = f" step {failed}" if failed is not None else ""
      kept = (f"checkpoint step {complete[-1]} is intact. " if complete else "no checkpoint was completed. ")
      resume = f"resume from step {complete[-1]}" if complete else "start again"
      fix = free_space(cause, "copy the workdir to a larger disk and point --workdir there")
      raise DiskFullError(f"disk full: saving checkpoint{where} under {self.directory} failed ({cause}); {kept}{fix}, "
                          f"then rerun the same command to {resume}.") from error

  def restore_latest(self, abstract, config: dict | None, allow_settings_change: bool = False,
                     allow_unverified: bool = False, step: int | None = None):
    """(state, data_state, step) of the newest sound checkpoint onto `abstract`'s shardings, or None.

    `abstract` is a TrainState (training resumes), or its params alone: then only the params are read (an Orbax
    partial restore: no optimizer state) and returned in place of the state; None reads them as host NumPy arrays of
    the saved shapes, whatever mesh saved them. A checkpoint of a different model or optimizer raises TrainError (of
    other function-changing model settings, ValueError, unless `allow_settings_change`; `config` None compares no
    settings). One that cannot be read, or whose arrays or data position differ from the fingerprints recorded when
    it was saved, is reported, moved aside to checkpoints_unreadable/ (unless read-only) and the previous one is
    tried; so is one of the current format that records no fingerprints or settings, unless `allow_unverified`.
    `step`: that checkpoint only, whose problem raises TrainError.
    """
    only, pruned = step, 0
    steps = [only] if only is not None else list(reversed(self.all_steps()))
    while steps:
      step = steps.pop(0)
      restored, problem = None, self._records_disagree(step)
      if problem is None:
        self.check_compatible(step, abstract, config, allow_settings_change)
        try:
          restored = self.manager.restore(step, args=ocp.args.Composite(
              state=self._state_args(step, abstract), data=ocp.args.JsonRestore()))
          data_state, record = unwrap_data(restored.data)
        except Exception as error:  # after the structure check, a failure means damaged or missing files
          problem = f"is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        else:
          if record is not None:  # the record beside the data is the one to trust: its settings are checked too
            self._records[step] = record
            if "model" in record and config is not None and not allow_settings_change:
              check_same_function(record["model"], config["model"], f"{self.directory} step {step}")
          try:
            problem = self._verify(step, restored.state, data_state, current=record is not None,
                                   allow_unverified=allow_unverified, hint=config is not None)
          except Exception as error:
            problem = f"is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
      if problem and only is not None:
        raise TrainError(f"checkpoint step {step} under {self.directory} {problem}; pass another step (it holds "
                         f"steps {', '.join(map(str, self.all_steps()))}).")
      if problem and self.read_only and pruned < 10 and not (self.directory / str(step)).exists():
        pruned += 1  # a training run deleted it meanwhile (keeping its latest N): its newer ones are the ones to read
        self._records.pop(step, None)
        self.manager.reload()
        steps = list(reversed(self.all_steps()))
        self.log(f"checkpoint step {step} under {self.directory} was removed while being read (the training run "
                 f"keeps its latest checkpoints only); reading step {steps[0] if steps else '(none left)'} instead.")
        continue
      if problem:
        older = [s for s in self.all_steps() if s < step]
        self.log(f"checkpoint step {step} under {self.directory} {problem}; "
                 f"{'skipping' if self.read_only else 'moving it aside'} and falling back to "
                 f"{f'step {older[-1]}' if older else 'a fresh start'}.")
        self._move_aside(step)
        continue
      return (restored.state if isinstance(abstract, TrainState) else restored.state["params"]), data_state, step
    return None

  def _state_args(self, step: int, abstract) -> ocp.args.PyTreeRestore:
    """What to read of checkpoint `step`'s state: all of it onto a TrainState, or the params alone."""
    if isinstance(abstract, TrainState):
      return ocp.args.PyTreeRestore(abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))
    if abstract is None:
      saved = self.manager.item_metadata(step)["state"].tree["params"]
      item = {"params": jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)}
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    else:
      item = {"params": abstract}
      restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    return ocp.args.PyTreeRestore(item, restore_args=restore_args, partial_restore=True)

  def record(self, step: int) -> dict:
    """The run record saved with `step` (read once: Orbax takes a few hundred ms per read)."""
    if step not in self._records:
      self._records[step] = self.manager.metadata(step).custom_metadata or {}
    return self._records[step]

  def _records_disagree(self, step: int) -> str | None:
    """Reads checkpoint `step`'s record: the one beside its data position (format 2; Orbax's metadata holds a copy),
    else Orbax's. Returns what is wrong when both exist and differ (one was altered after saving), else None and
    the record to trust is `record(step)`."""
    self._records.pop(step, None)
    try:
      _, beside = unwrap_data(self.manager.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data)
      copy = self.record(step)
    except Exception:
      return None  # unreadable: the whole restore reports it
    self._records[step] = copy if beside is None else beside
    if not (beside and copy) or beside == copy:
      return None
    models = [record.get("model") if isinstance(record.get("model"), dict) else {} for record in (beside, copy)]
    differ = sorted(f"model.{k}" for k in models[0].keys() | models[1].keys() if models[0].get(k) != models[1].get(k))
    differ += sorted(k for k in beside.keys() | copy.keys() if k != "model" and beside.get(k) != copy.get(k))
    return (f"holds two records that disagree (data/metadata and _CHECKPOINT_METADATA differ in "
            f"{', '.join(differ[:4]) or 'their layout'}), so one was altered after saving and neither can be trusted")

  def _verify(self, step: int, state, data_state, current: bool = False, allow_unverified: bool = False,
              hint: bool = True) -> str | None:
    """None if the restored state (or {'params': params}) and data position are what was saved; else what is wrong
    with them. `current`: a format-2 checkpoint, whose record must hold fingerprints and settings (unless
    `allow_unverified`; `hint`: name the override)."""
    if not isinstance(data_state, dict) or not data_state:
      return f"holds no data-iterator position ({data_state!r}), so the data would silently restart"
    record = self.record(step)
    if "fingerprints" not in record or (current and "model" not in record):
      what = ("records no fingerprints or settings beside its data" if current else
              "records no fingerprints: its data position has the layout of checkpoint format 1 and Orbax's "
              "_CHECKPOINT_METADATA holds none (saved by an hourglass_jax before fingerprints, or its record was "
              "rewritten or deleted)")
      if not allow_unverified:
        return (f"{what}, so it cannot be verified"
                + (f" (to load it anyway, unverified, add {UNVERIFIED_OVERRIDE})" if hint else ""))
      self.log(f"checkpoint step {step} under {self.directory} {what}; restored without verifying it "
               f"({UNVERIFIED_OVERRIDE}).")
      return None
    saved = record["fingerprints"]
    if not isinstance(state, TrainState):  # the params alone
      saved = {k: v for k, v in saved.items() if k.startswith("params/")}
    altered = integrity.mismatches(saved, integrity.array_fingerprints(state))
    if record.get("data_fingerprint") != integrity.json_fingerprint(data_state):
      altered.append("the data-iterator position")
    if altered:
      return (f"fails its integrity check: {len(altered)} of its arrays differ from what was saved (e.g. "
              f"{', '.join(altered[:3])}), so its files were altered after saving")
    return None

  def check_compatible(self, step: int, abstract, config: dict | None, allow_settings_change: bool = False) -> None:
    """Raises TrainError when checkpoint `step` holds arrays of other names or shapes than `abstract` (a TrainState,
    or its params alone: then only they are compared), and ValueError when it records function-changing model
    settings other than `config`'s (unless allowed)."""
    if abstract is None:
      return
    try:
      saved_model = self.record(step).get("model", {})
      saved = array_shapes(self.manager.item_metadata(step)["state"].tree)
    except Exception:
      return  # unreadable: restore_latest reports it and falls back
    now = array_shapes(abstract if isinstance(abstract, TrainState) else {"params": abstract})
    saved = {k: v for k, v in saved.items() if isinstance(abstract, TrainState) or k.startswith("params/")}
    if saved == now:
      if config is not None and not allow_settings_change:
        check_same_function(saved_model, config["model"], f"{self.directory} step {step}")
      return
    fields = ", ".join(f"model.{k}: checkpoint {saved_model.get(k)!r}, config {v!r}"
                       for k, v in config["model"].items() if k in saved_model and saved_model[k] != v)
    examples = sorted(set(saved.items()) ^ set(now.items()))[:4]
    if {k: v for k, v in saved.items() if k.startswith("params/")} != {
        k: v for k, v in now.items() if k.startswith("params/")}:
      what = f"a different model shape ({fields or 'parameter shapes differ'})"
    else:
      what = "the same model but a different optimizer state (did train.grad_clip_norm or the optimizer change?)"
    raise TrainError(f"{self.directory} holds checkpoints (latest step {step}) of {what}; differing arrays, e.g. "
                     f"{examples}. Use a new --workdir for this configuration, or rerun with the settings the "
                     "checkpoint was trained with. The existing checkpoints were left untouched.")

  def _move_aside(self, step: int) -> None:
    self._records.pop(step, None)  # a later save may reuse the step number
    if self.read_only:
      return
    if jax.process_index() == 0:
      aside = files.make_folder(self.directory.parent / "checkpoints_unreadable", inside=self.directory.parent)
      readme = aside / "README.txt"
      if not _regular_file(readme):  # a bucket "folder" exists only once it holds an object, and rename needs it to
        files.write_text(readme, "Checkpoints that could not be restored, moved here from checkpoints/ by "
                         "hourglass-train.\n")
      files.move(self.directory / str(step), aside / f"{step}-{int(time.time())}")
    multihost_utils.sync_global_devices(f"checkpoint_moved_aside_{step}")
    self.manager.reload()


def _regular_file(path) -> bool:
  """Whether `path` is a file, not a link (a planted one is replaced, never written through)."""
  return path.exists() if paths.is_remote(path) else os.path.isfile(path) and not os.path.islink(path)


class NoCheckpointError(TrainError, FileNotFoundError):
  """A workdir holds no (readable) checkpoint, or not the step asked for."""


def read_params(workdir, abstract_params, run=None, step: int | None = None, fall_back: bool = True,
                log=print) -> tuple[object, int, dict]:
  """(params, step, the run record saved with them) of the newest sound checkpoint of `workdir`, read-only (a run
  in progress may be writing there) through `Checkpoints.restore_latest`: onto `abstract_params`' shardings, or as
  host NumPy arrays when None. `run`: the RunConfig they must match (its checkpoint.allow_settings_change and
  allow_unverified apply); None compares no settings. `step` (or, without `fall_back`, the newest): that checkpoint
  or a TrainError saying what is wrong with it."""
  directory = paths.as_path(workdir) / "checkpoints"
  if not directory.is_dir() or not any(p.name.isdigit() for p in directory.iterdir()):
    raise NoCheckpointError(f"no checkpoint under {directory}; train first with hourglass-train --config=... "
                            f"--workdir={workdir}, or point --workdir at a trained run.")
  settings = CheckpointSettings() if run is None else run.checkpoint
  with Checkpoints(directory, log=log, read_only=True) as checkpoints:
    steps = checkpoints.all_steps()
    step = step if step is not None or fall_back else (steps or [None])[-1]
    if step is not None and step not in steps:
      raise NoCheckpointError(f"no checkpoint of step {step} under {directory}; it holds steps "
                              f"{', '.join(map(str, steps))}.")
    restored = checkpoints.restore_latest(abstract_params, None if run is None else config_record(run),
                                          settings.allow_settings_change, settings.allow_unverified, step)
    if restored is None:
      raise NoCheckpointError(f"no readable checkpoint under {directory}; train first with hourglass-train "
                              f"--workdir={workdir}.")
    return restored[0], restored[2], checkpoints.record(restored[2])
