"""The shared ConfigDict skeleton every `configs/*.py` starts from (sections model, data, train, mesh, checkpoint),
beside the checks that read it; config files import it as hourglass_jax.config.base.base_config."""

import ml_collections
from ml_collections import config_dict

from hourglass_jax.data.settings import DataSettings
from hourglass_jax.model.config import config_section_fields
from hourglass_jax.sharding import MeshSettings
from hourglass_jax.train.settings import CheckpointSettings, TrainSettings


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every section; config files override what their experiment changes."""
  cfg = ml_collections.ConfigDict()

  # The model section is ModelConfig's fields and defaults (hourglass_jax/model/config.py documents them), so every
  # field can be overridden from the command line; fields another section sets (remat_policy: train.remat) are
  # left out. attention_dropout unset (None) = model.dropout.
  model = config_section_fields()
  cfg.model = ml_collections.ConfigDict(dict(model, attention_dropout=config_dict.placeholder(float)))

  # The data, train and checkpoint sections are their typed dataclasses' fields and defaults (documented there).
  cfg.data = ml_collections.ConfigDict(DataSettings.defaults())
  cfg.train = ml_collections.ConfigDict(TrainSettings.defaults())

  # Mesh axis sizes, -1 = all remaining devices; `rules` maps logical axes to mesh axes.
  cfg.mesh = ml_collections.ConfigDict(MeshSettings.defaults())

  cfg.checkpoint = ml_collections.ConfigDict(CheckpointSettings.defaults())
  return cfg
