"""Everything checkable about a run before anything compiles: config keys and values, mesh, batch split."""

import difflib

import ml_collections

from hourglass_jax.data.sources import check_data_config
from hourglass_jax.model.hourglass.dynamic.level import check_segments_in_window
from hourglass_jax.train.run_config import base_config
from hourglass_jax.train.settings import CheckpointSettings, TrainSettings


class TrainError(RuntimeError):
  """A fault during training (NaN loss, unreadable or mismatched checkpoint, full disk, too little memory)."""


class DiskFullError(TrainError):
  """A write under the workdir failed for lack of space (hourglass-train exits with EXIT_DISK_FULL)."""


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


def check_config(cfg: ml_collections.ConfigDict, vocab_size: int) -> None:
  """Keys, then each typed section's own checks (types, ranges, choices: train/settings.py, data/settings.py), then
  what spans sections."""
  check_known_keys(cfg)
  check_data_config(cfg.data, vocab_size)
  TrainSettings.of(cfg.train)
  CheckpointSettings.of(cfg.checkpoint)
  if cfg.data.batch_size % cfg.train.grad_accum_steps:
    raise ValueError(f"data.batch_size={cfg.data.batch_size} is not divisible by train.grad_accum_steps="
                     f"{cfg.train.grad_accum_steps}; each micro-batch must have the same size.")


def warmup_warning(train: ml_collections.ConfigDict) -> str | None:
  """A schedule whose warmup does not end before the last step never reaches train.learning_rate: the last step
  (index steps - 1) takes learning_rate x (steps - 1) / warmup_steps."""
  if train.warmup_steps < train.steps:
    return None
  lr, last = train.learning_rate, train.learning_rate * (train.steps - 1) / train.warmup_steps
  digits = next((n for n in range(3, 17) if f"{last:.{n}g}" != f"{lr:.{n}g}"), 17)  # enough to tell them apart
  return (f"train.warmup_steps={train.warmup_steps} >= train.steps={train.steps}: the learning rate never reaches "
          f"train.learning_rate={lr:g} (the last step's is {last:.{digits}g}, {last / lr:.{max(digits - 2, 1)}%} of "
          f"it); set --config.train.warmup_steps={train.steps // 10} or raise --config.train.steps.")


def check_batch_split(cfg: ml_collections.ConfigDict, parallelism: int, process_count: int) -> None:
  """The (micro-)batch must split evenly over the data-parallel devices and the processes."""
  micro = cfg.data.batch_size // cfg.train.grad_accum_steps
  if micro % parallelism:
    raise ValueError(f"data.batch_size={cfg.data.batch_size} (micro-batch {micro}) is not divisible by the "
                     f"{parallelism} data-parallel devices (mesh data x fsdp); use a multiple of "
                     f"{parallelism * cfg.train.grad_accum_steps} or change the mesh.")
  if cfg.data.batch_size % process_count:
    raise ValueError(f"data.batch_size={cfg.data.batch_size} is not divisible by the {process_count} processes.")


def check_train_windows(data_cfg: ml_collections.ConfigDict, windows: int) -> None:
  """One batch needs batch_size training windows; fewer would repeat windows within every batch."""
  if windows < data_cfg.batch_size:
    raise ValueError(f"the train split of data.name={data_cfg.name!r} yields {windows} training windows (seq_len + 1 "
                     f"= {data_cfg.seq_len + 1} tokens each), fewer than one batch of data.batch_size="
                     f"{data_cfg.batch_size}; lower data.batch_size, data.train_stride or data.seq_len, or use a "
                     "larger corpus.")


def check_window(model_cfg, seq_len: int) -> None:
  """A dynamic model whose segments are longer than the window (they would never close in it)."""
  if model_cfg.dynamic:
    check_segments_in_window(model_cfg, seq_len)
