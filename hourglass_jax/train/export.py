"""`hourglass-export`: a checkpoint's parameters (only those: no optimizer state) restored read-only from a run's
workdir, verified against the fingerprints recorded when it was saved, and written as safetensors with a model card
(hourglass_jax.weights)."""

import jax
import numpy as np
import orbax.checkpoint as ocp

from hourglass_jax import paths, weights
from hourglass_jax.train import integrity
from hourglass_jax.train.checkpoint import unwrap_data
from hourglass_jax.train.checks import TrainError


def _reader(directory) -> ocp.CheckpointManager:
  """A read-only manager whose state handler can restore part of a tree (the standard one refuses to)."""
  return ocp.CheckpointManager(directory, item_handlers=dict(state=ocp.PyTreeCheckpointHandler(),
                                                           data=ocp.JsonCheckpointHandler()),
                               options=ocp.CheckpointManagerOptions(read_only=True, create=False))


def restore_params(reader: ocp.CheckpointManager, step: int, where: str) -> dict:
  """Checkpoint `step`'s params as nested NumPy arrays, whatever mesh saved them; the optimizer state is not read."""
  try:
    tree = reader.item_metadata(step)["state"].tree
  except Exception as error:
    raise TrainError(f"{where} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:200]}); export "
                     "an earlier step with --step.") from error
  item = {"params": jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree["params"])}
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  try:
    restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, restore_args=as_numpy, partial_restore=True)))
  except Exception as error:
    raise TrainError(f"{where} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:200]}); export "
                     "an earlier step with --step.") from error
  return restored.state["params"]


def saved_record(reader: ocp.CheckpointManager, step: int, where: str) -> tuple[dict, bool]:
  """(the run record of checkpoint `step`, whether it is of the current format): the one saved beside its data,
  else (an older checkpoint) the one in its metadata."""
  try:
    data = reader.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore())).data
  except Exception as error:
    raise TrainError(f"{where} is unreadable ({type(error).__name__}: {str(error).splitlines()[0][:200]}); export "
                     "an earlier step with --step.") from error
  _, record = unwrap_data(data)
  if record is not None:
    return record, True
  try:
    return reader.metadata(step).custom_metadata or {}, False
  except Exception:
    return {}, False


def verify_params(params, record: dict, where: str, log=print, current: bool = False) -> None:
  """Raises TrainError when `params` differ from the fingerprints recorded at saving (its files were altered), or
  (`current`: a format-2 checkpoint) when none are recorded."""
  saved = {k: v for k, v in record.get("fingerprints", {}).items() if k.startswith("params/")}
  if not saved and current:
    raise TrainError(f"{where} records no fingerprints beside its data, so it cannot be verified; export an earlier "
                     "step with --step.")
  if not saved:
    log(f"{where} records no fingerprints (saved by an older hourglass_jax); exported without verifying it.")
    return
  altered = integrity.mismatches(saved, integrity.array_fingerprints({"params": params}))
  if altered:
    raise TrainError(f"{where} fails its integrity check: {len(altered)} parameter array(s) differ from what was "
                     f"saved (e.g. {', '.join(altered[:3])}); export an earlier step with --step.")


def export_params(workdir, output_dir, step: int | None = None, dtype: str | None = None, log=print,
                  overwrite: bool = False) -> dict:
  """Writes checkpoint `step` (default: the newest) of `workdir` to `output_dir`/model.safetensors + config.json,
  atomically; a folder holding another export is replaced only with `overwrite` (weights.save_params).

  Read-only like hourglass-eval: it takes no workdir lock, so it can export from a run in progress. `dtype`
  'bfloat16' halves the file; None keeps the float32 the run saved. Returns the model card.
  """
  if not paths.as_path(workdir).is_dir():
    raise TrainError(f"--workdir={workdir} is not a folder; pass the --workdir of a hourglass-train run.")
  directory = paths.as_path(workdir) / "checkpoints"
  if not directory.is_dir():
    raise TrainError(f"no checkpoints under {directory}; --workdir must be a folder hourglass-train wrote.")
  with _reader(directory) as reader:
    steps = sorted(reader.all_steps())
    if not steps:
      raise TrainError(f"no checkpoint under {directory}; train first with hourglass-train --workdir={workdir}.")
    step = steps[-1] if step is None else step
    if step not in steps:
      raise TrainError(f"no checkpoint of step {step} under {directory}; it holds steps "
                       f"{', '.join(map(str, steps))}.")
    where = f"checkpoint step {step} under {directory}"
    record, current = saved_record(reader, step, where)
    if "model" not in record:
      raise TrainError(f"{where} records no model config (its metadata file is missing), so the exported weights "
                       "could not say which model they belong to.")
    params = restore_params(reader, step, where)
  verify_params(params, record, where, log, current)
  card = weights.save_params(params, record["model"], output_dir, step=step, seq_len=record.get("seq_len"),
                             dtype=dtype, overwrite=overwrite)
  log(f"exported step {step}: {card['num_params']:,} parameters ({card['weights_dtype']}) to "
      f"{paths.as_path(output_dir) / weights.WEIGHTS_FILE} and {weights.CARD_FILE}")
  return card
