"""The run config, typed: `run_config(cfg)` turns a config file's ConfigDict (with its command-line overrides) into
one frozen `RunConfig` of typed sections (model: ModelConfig, data: DataSettings with its dataset resolved, train,
checkpoint, mesh), checked once, with one line naming the setting at fault, before anything is read or compiled.
The entry points make it once; past them every part takes the RunConfig or its own section, never the ConfigDict."""

import dataclasses

import ml_collections

from hourglass_jax.config.base import check_known_keys
from hourglass_jax.config.train_settings import CheckpointSettings, TrainSettings
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.data.batches.sources import check_data_config
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hourglass.dynamic.level import check_segments_in_window
from hourglass_jax.runtime.sharding import MeshSettings


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """A run's settings, one typed section each; made (and checked) by `run_config`."""
  model: ModelConfig
  data: DataSettings
  train: TrainSettings
  checkpoint: CheckpointSettings
  mesh: MeshSettings

  def __post_init__(self):
    """What spans sections (each section checked itself when it was made)."""
    check_data_config(self.data, self.model.vocab_size)
    if self.data.batch_size % self.train.grad_accum_steps:
      raise ValueError(f"data.batch_size={self.data.batch_size} is not divisible by train.grad_accum_steps="
                       f"{self.train.grad_accum_steps}; each micro-batch must have the same size.")
    if self.model.dynamic:  # segments longer than the window would never close in it
      check_segments_in_window(self.model, self.data.seq_len)


def run_config(cfg: "ml_collections.ConfigDict | RunConfig") -> RunConfig:
  """The typed, checked RunConfig of a config (a RunConfig is returned as it is): the model section first, then
  the keys of the others (a typo is named), then each section's types, ranges and choices, then what spans them."""
  if isinstance(cfg, RunConfig):
    return cfg
  if not isinstance(cfg, ml_collections.ConfigDict):
    raise TypeError(f"a run config is made from a ConfigDict (a config file's get_config()), not a "
                    f"{type(cfg).__name__}.")
  model = ModelConfig.from_dict(cfg.get("model", {}))
  check_known_keys(cfg)
  return RunConfig(model=model, data=DataSettings.of(cfg.get("data")), train=TrainSettings.of(cfg.get("train")),
                   checkpoint=CheckpointSettings.of(cfg.get("checkpoint")), mesh=MeshSettings.of(cfg.get("mesh")))
