"""`hourglass-export`: a checkpoint's parameters (only those: no optimizer state) restored read-only from a run's
workdir by the one checkpoint reader (checkpoint.read_params: verified against the fingerprints recorded when it
was saved) and written as safetensors with a model card (hourglass_jax.weights)."""

from hourglass_jax import paths, weights
from hourglass_jax.train.checkpoint import read_params
from hourglass_jax.train.checks import TrainError


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
  params, step, record = read_params(workdir, None, step=step, fall_back=False, log=log)
  if "model" not in record:
    raise TrainError(f"checkpoint step {step} under {directory} records no model config (its metadata file is "
                     "missing), so the exported weights could not say which model they belong to.")
  card = weights.save_params(params, record["model"], output_dir, step=step, seq_len=record.get("seq_len"),
                             dtype=dtype, overwrite=overwrite)
  log(f"exported step {step}: {card['num_params']:,} parameters ({card['weights_dtype']}) to "
      f"{paths.as_path(output_dir) / weights.WEIGHTS_FILE} and {weights.CARD_FILE}")
  return card
