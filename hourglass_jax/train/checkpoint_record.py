"""What a checkpoint records about its run (model settings, sequence length) and the check that a config about to
resume, evaluate or sample it computes the same function."""

import json

# Per kind, the model fields that can change the function while leaving every parameter shape alone (a factor
# in `hierarchy`, 'avg' vs 'repeat', a retina window...): the shape check cannot see them, so they are compared.
FUNCTION_FIELDS = {
    "vanilla": ("kind", "hierarchy", "position"),
    "hourglass": ("kind", "hierarchy", "position", "shorten", "upsample"),
    "topdown": ("kind", "position", "scales", "layers_per_scale", "downsampler", "upsampler"),
    "bottomup": ("kind", "position", "scales", "layers_per_scale", "heads_per_scale", "downsampler"),
    "retina": ("kind", "hierarchy", "position", "scales", "heads_per_scale", "downsampler", "retina_windows"),
}

OVERRIDE = "--config.checkpoint.allow_settings_change=True"


def config_record(cfg) -> dict:
  """What a checkpoint records about its run (its model settings, named in mismatch messages)."""
  return json.loads(json.dumps({"model": cfg.model.to_dict(), "seq_len": cfg.data.seq_len}))


def function_changes(saved: dict, model: dict, saved_as: str = "checkpoint", model_as: str = "config") -> list[str]:
  """'model.F: checkpoint A, config B' for each function-changing field of either kind that differs (`saved_as`
  and `model_as` name the two sides)."""
  fields = FUNCTION_FIELDS.get(saved.get("kind"), ()) + FUNCTION_FIELDS.get(model.get("kind"), ())
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
