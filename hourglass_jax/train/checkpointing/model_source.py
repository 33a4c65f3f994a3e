"""Where a command reads a trained model from: a training workdir (its newest checkpoint, through
checkpoint.read_params) or an export folder (hourglass-export's model.safetensors and config.json, through
weights.load_params), and the run config an export is used with: its card's model section, with the data and the
rest from --config (or, where no data is read, the defaults and the card's training length)."""

import dataclasses
import os

import jax
import ml_collections

from hourglass_jax import weights
from hourglass_jax.model.config import ModelConfig, config_section_fields
from hourglass_jax.runtime import paths
from hourglass_jax.train.checkpointing.checkpoint import read_params


def is_export(path) -> bool:
  """True for a local folder hourglass-export wrote (a model card or weights file and no checkpoints/ folder)."""
  if path is None or paths.is_remote(os.fspath(path)):
    return False
  folder = os.path.expanduser(os.fspath(path))
  return (not os.path.isdir(os.path.join(folder, "checkpoints"))
          and any(os.path.isfile(os.path.join(folder, name)) for name in (weights.CARD_FILE, weights.WEIGHTS_FILE)))


def export_config(path, cfg: ml_collections.ConfigDict | None = None,
                  model_overrides: dict | None = None) -> ml_collections.ConfigDict:
  """The run config for exported weights at `path`: `cfg` (None: the defaults, with the card's data set and training
  length) with its model section replaced by the card's, then `model_overrides` (the command line's
  --config.model.* values, which `read` hands to load_params: settings that keep the function, such as
  attention_impl or dtype)."""
  from hourglass_jax.config.base import base_config  # pylint: disable=import-outside-toplevel

  card = weights.read_card(path)
  out = base_config() if cfg is None else ml_collections.ConfigDict(cfg.to_dict())
  if cfg is None:
    dataset = (card.get("training") or {}).get("dataset")
    out.data.update(**({"name": dataset} if dataset else {}), **({"seq_len": card["seq_len"]} if card.get("seq_len")
                                                                    else {}))
  section = config_section_fields()
  model = ModelConfig.from_dict({k: v for k, v in card["model"].items() if k in ModelConfig.__dataclass_fields__})
  out.model = ml_collections.ConfigDict({name: getattr(model, name) for name in section})
  out.model.update(**(model_overrides or {}))
  return out


def read(source, abstract_params, run, log=print) -> tuple[object, object]:
  """(params onto `abstract_params`' shardings, step) of a workdir's newest sound checkpoint (checked against the
  RunConfig `run`) or of an export folder (its card's step; `run.model` made from export_config's model section)."""
  if not is_export(source):
    params, step, _ = read_params(source, abstract_params, run, log=log)
    return params, step
  card = weights.read_card(source)
  overrides = {k: v for k, v in dataclasses.asdict(run.model).items() if k in card["model"] and card["model"][k] != v}
  loaded = weights.load_params(source, **overrides)
  params = jax.tree.map(lambda a, x: jax.make_array_from_callback(a.shape, a.sharding, lambda index: x[index]),
                        abstract_params, loaded.params)
  return params, card.get("step")
