"""Where config files start: `base_config()`, the ConfigDict skeleton of every section (model, data, train, mesh,
checkpoint), each section made from its typed settings class's fields and defaults; and `check_known_keys`, which
refuses a section or key the skeleton does not have."""

import difflib

import ml_collections
from ml_collections import config_dict

from hourglass_jax.config.train_settings import CheckpointSettings, TrainSettings
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model.config import config_section_fields
from hourglass_jax.runtime.sharding import MeshSettings


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section; config files override what their experiment changes."""
  cfg = ml_collections.ConfigDict()
  # The model section is ModelConfig's fields and defaults (hourglass_jax/model/config.py documents them), so every
  # field can be overridden from the command line. attention_dropout unset (None) = model.dropout.
  cfg.model = ml_collections.ConfigDict(dict(config_section_fields(),
                                             attention_dropout=config_dict.placeholder(float)))
  # The other sections are their typed dataclasses' fields and defaults (documented there).
  cfg.data = ml_collections.ConfigDict(DataSettings.defaults())
  cfg.train = ml_collections.ConfigDict(TrainSettings.defaults())
  cfg.mesh = ml_collections.ConfigDict(MeshSettings.defaults())  # axis sizes (-1 = the rest) and the rule table
  cfg.checkpoint = ml_collections.ConfigDict(CheckpointSettings.defaults())
  return cfg


def check_known_keys(cfg: ml_collections.ConfigDict) -> None:
  """Every key of the data/train/mesh/checkpoint sections must exist in the base config (typos are caught)."""
  base = base_config()
  for section in base.keys():
    if section not in cfg:
      raise ValueError(f"config has no {section!r} section; start config files from "
                       "hourglass_jax.config.base.base_config().")
  for section in cfg.keys():
    if section not in base:
      raise ValueError(f"config section {section!r} is unknown{_suggest(section, base.keys())}; sections are "
                       f"{', '.join(base.keys())}.")
    if section == "model":
      continue  # validated by the model's own config class, which knows each model kind's fields
    for key in cfg[section].keys():
      if key not in base[section]:
        raise ValueError(f"{section}.{key} is not a known setting{_suggest(key, base[section].keys())}; "
                         f"{section} has {', '.join(sorted(base[section].keys()))}.")


def _suggest(name: str, choices) -> str:
  close = difflib.get_close_matches(name, list(choices), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""
