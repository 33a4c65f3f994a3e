"""`hourglass-export`: a checkpoint's parameters (only those: no optimizer state) restored read-only from a run's
workdir by the one checkpoint reader (checkpoint.read_params: verified against the fingerprints recorded when it
was saved) and written as safetensors with a model card (hourglass_jax.weights) that says what they are: the
training data, steps and tokens seen, the recipe, the whole-split scores recorded for that step, license and
intended use (the Hugging Face model-card metadata names where they fit: license, library_name, datasets (Hub ids
only), pipeline_tag, model-index), as config.json and as the Hub's README.md (hourglass_jax.hub_card)."""

from hourglass_jax import hub_card, weights
from hourglass_jax.data import catalog
from hourglass_jax.runtime import paths
from hourglass_jax.train.checkpointing.checkpoint import read_params
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.reporting import run_files

INTENDED_USE = ("Research and experiments with hierarchical byte-level models: scoring and sampling text like its "
                "training data. Not evaluated for safety, bias or factual accuracy, and not for use in products or "
                "decisions about people.")


def export_params(workdir, output_dir, step: int | None = None, dtype: str | None = None, log=print,
                  overwrite: bool = False, license_id: str | None = None) -> dict:
  """Writes checkpoint `step` (default: the newest) of `workdir` to `output_dir`/model.safetensors + config.json,
  atomically; a folder holding another export is replaced only with `overwrite` (weights.save_params).

  Read-only like hourglass-eval: it takes no workdir lock, so it can export from a run in progress. `dtype`
  'bfloat16' halves the file; None keeps the float32 the run saved. `license_id`: the card's license (a Hugging Face
  license id such as 'apache-2.0'; None: not stated). Returns the model card.
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
                             dtype=dtype, overwrite=overwrite, about=about_run(workdir, step, record, license_id))
  log(f"exported step {step}: {card['num_params']:,} parameters ({card['weights_dtype']}) to "
      f"{str(output_dir).rstrip('/')}/{weights.WEIGHTS_FILE}, with {weights.CARD_FILE} and {hub_card.README_FILE} "
      "(the model card, for hourglass_jax and for the Hugging Face Hub)")
  if license_id is None:
    log("warning: no --license given, so the card states none and the Hub shows none; pass --license=ID (a Hugging "
        "Face license id such as apache-2.0) for the terms of these weights, which the training data's may restrict.")
  return card


def about_run(workdir, step: int, record: dict, license_id: str | None = None) -> dict:
  """The card's fields about the run that trained checkpoint `step`: its data set, steps and tokens seen, and the
  whole-split scores recorded for that step (hourglass-eval's, and the trainer's own when it scored a whole split),
  from the checkpoint's record and the workdir's run files (run_files.py)."""
  data = record.get("data") or {}
  dataset = data.get("name")
  spec = _dataset_spec(dataset)
  unit = spec.unit if spec else "byte"
  seen = [r.get("tokens_seen") for r in run_files.read_metrics(workdir) if r["step"] == step and "tokens_seen" in r]
  tokens = seen[-1] if seen else (step * record["batch_size"] * record["seq_len"] if "batch_size" in record else None)
  scores = {r["split"]: r for r in run_files.read_metrics(workdir)
            if r["step"] == step and r.get("whole_split") and f"bits_per_{unit}" in r}
  scores.update({split: dict(r, **{f"bits_per_{unit}": r["bits"]})
                 for split, r in run_files.evaluations(workdir, step).items() if "bits" in r})
  task = "text-generation" if unit == "byte" else "unconditional-image-generation"
  hub_id = spec.hub_id if spec else None  # the same data on the Hugging Face Hub, where it is
  results = [dict(task=dict(type=task),
                  dataset=dict(name=dataset, type=hub_id or dataset, split=split),
                  metrics=[dict(type=f"bits_per_{unit}", value=round(score[f"bits_per_{unit}"], 6),
                                name=f"{split} bits/{unit}, whole split")])
             for split, score in sorted(scores.items())]
  return {"license": license_id, "library_name": "hourglass_jax",
          "pipeline_tag": task,
          "datasets": [hub_id] if hub_id else [], "intended_use": INTENDED_USE,
          "training": dict(dataset=dataset, source=data.get("source"), steps=step, tokens_seen=tokens,
                           batch_size=record.get("batch_size"), seq_len=record.get("seq_len"),
                           recipe=dict(record["train"], dropout=record["model"].get("dropout"))
                           if isinstance(record.get("train"), dict) else None),
          "model-index": [dict(name=f"hourglass_jax {record['model'].get('kind', '')} step {step}".strip(),
                               results=results)]}


def _dataset_spec(dataset: str | None) -> catalog.DatasetSpec | None:
  """What the recorded data set is; None where none is recorded or this install does not know the name."""
  try:
    return catalog.spec(dataset) if dataset else None
  except ValueError:
    return None
