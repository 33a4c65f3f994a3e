"""A draft model for speculative decoding, sized for a target config: a vanilla 2@1 of the target's vocabulary,
dtype and positions, as wide as stays under a tenth of the target's parameters (decoding reads every weight, so each
proposal costs about that share of a target step; a larger draft is warned about), trained on the target's data with
its training settings.

    hourglass-train --config=configs/draft.py:configs/default.py --workdir=workdirs/default_draft
    hourglass-sample --config=configs/default.py --workdir=workdirs/default --draft=workdirs/default_draft ...

The argument is the target's config file (with its own :preset, if any; a bare name such as `default` is looked up
beside this file); without it, configs/default.py.
"""

import importlib.util
import pathlib

from hourglass_jax.config.base import base_config
from hourglass_jax.model import ModelConfig
from hourglass_jax.model.counting import total_params
from hourglass_jax.model.decode.drafts.model import MAX_FRACTION

HEAD_DIM = 32  # the draft's heads are this wide; its feed-forward 4 x d_model
WIDTHS = (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)
# What the draft keeps of the target's model section (the rest: a vanilla 2@1 of the width chosen, no dropout).
KEPT = ("vocab_size", "dtype", "attention_impl", "position", "rope_base", "layer_norm_eps")


def _target_config(target: str):
  """The target's ConfigDict: `target` is a config file path (or a name beside this file), with an optional
  :preset."""
  file, _, preset = target.partition(":")
  path = pathlib.Path(file)
  if not path.is_file() and (pathlib.Path(__file__).parent / path.with_suffix(".py").name).is_file():
    path = pathlib.Path(__file__).parent / path.with_suffix(".py").name
  if not path.is_file():
    raise ValueError(f"configs/draft.py: no target config {file!r}; name the target's config file, e.g. "
                     "--config=configs/draft.py:configs/default.py.")
  spec = importlib.util.spec_from_file_location(f"draft_target_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset) if preset else module.get_config()


def draft_model(target_model: dict) -> dict:
  """The draft's model section for a target's: the widest vanilla 2@1 under MAX_FRACTION of its parameters."""
  kept = {name: target_model[name] for name in KEPT if name in target_model}
  budget = MAX_FRACTION * total_params(ModelConfig.from_dict(target_model))
  chosen = None
  for width in WIDTHS:
    model = dict(kind="vanilla", hierarchy="2@1", d_model=width, num_heads=max(1, width // HEAD_DIM),
                 d_ff=4 * width, dropout=0.0, **kept)
    if chosen is None or total_params(ModelConfig(**model)) <= budget:
      chosen = model  # the smallest width always, wider ones while they fit
  return chosen


def get_config(target: str = "configs/default.py"):
  goal = _target_config(target)
  cfg = base_config()
  cfg.model.update(**draft_model(dict(goal.model)))
  cfg.data.update(**dict(goal.data))
  cfg.train.update(**dict(goal.train))
  cfg.mesh.update(**dict(goal.mesh))
  cfg.checkpoint.update(**dict(goal.checkpoint))
  return cfg
