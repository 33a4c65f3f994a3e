"""What a checkpoint records about its run (model settings, sequence length) and the check that a config about to
resume, evaluate or sample it computes the same function."""

import json

from hourglass_jax.model.config import KINDS, function_fields

OVERRIDE = "--config.checkpoint.allow_settings_change=True"


def config_record(cfg) -> dict:
  """What a checkpoint records about its run (its model settings, named in mismatch messages)."""
  return json.loads(json.dumps({"model": cfg.model.to_dict(), "seq_len": cfg.data.seq_len}))


def function_changes(saved: dict, model: dict, saved_as: str = "checkpoint", model_as: str = "config") -> list[str]:
  """'model.F: checkpoint A, config B' for each field that changes the function of either side's kind without
  changing a parameter shape (model.config.function_fields; the shape check cannot see them) and differs.
  `saved_as` and `model_as` name the two sides."""
  kinds = [kind for kind in (saved.get("kind"), model.get("kind")) if kind in KINDS]
  fields = [field for kind in kinds for field in function_fields(kind)]
  return [f"model.{k}: {saved_as} {saved[k]!r}, {model_as} {model.get(k)!r}" for k in dict.fromkeys(fields)
          if k in saved and saved[k] != model.get(k, saved[k])]


def check_same_function(saved: dict, model: dict, where: str) -> None:
  """Raises ValueError when `model` (a config's model section) computes another function than the checkpoint at
  `where` was trained as (`saved`, its recorded model section)."""
  differ = function_changes(saved, model)
  if differ:
    raise ValueError(f"{where} was trained with other model settings than this config ({'; '.join(differ)}); its "
                     "parameters would compute a different function. Pass the config and --config.model overrides "
                     f"the run was trained with, or, to change them on purpose (e.g. fine-tune with another "
                     f"shortening), add {OVERRIDE}.")
