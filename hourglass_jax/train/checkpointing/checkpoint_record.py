"""What a checkpoint records about its run (model settings, sequence length) and the check that a config about to
resume, evaluate or sample it computes the same function."""

import dataclasses
import json
import os

from hourglass_jax.model.config import function_changes

OVERRIDE = "--config.checkpoint.allow_settings_change=True"


RECIPE = ("learning_rate", "schedule", "warmup_steps", "min_lr_ratio", "b1", "b2", "eps", "weight_decay",
          "grad_clip_norm", "grad_accum_steps")  # the train settings the card's recipe shows


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
                     f"shortening), add {OVERRIDE}.")
