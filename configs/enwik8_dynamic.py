"""enwik8 with learned shortening: the enwik8 preset's data, schedule and width, with a 2@1 8@4 2@1 hierarchy
whose shortened level pools dynamic segments (Nawrot et al. 2023 train a 2-8-2 layer model of this width).

    hourglass-train --config=configs/enwik8_dynamic.py --workdir=...   ('whitespace'; or :routing, :entropy, :gumbel)

Two predictors (:whitespace,gumbel) nest two dynamic levels, 2@1 2@4 8@16 2@4 2@1 (one name per level).

Our preset, not a reproduction of their runs; configs/dynamic.py explains the predictors."""

import importlib.util
import pathlib

from hourglass_jax.config.dynamic import with_dynamic_shortening


def _enwik8_config():
  """configs/enwik8.py's settings (config files are loaded by path, not imported as a package)."""
  spec = importlib.util.spec_from_file_location("enwik8", pathlib.Path(__file__).with_name("enwik8.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config(predictor: str = "whitespace"):  # the lowest bits per byte in the study (docs/choosing.md)
  cfg = _enwik8_config()
  # Capacity 1.0: the shortened level has a fixed level's slots and FLOPs, what a fixed budget is best spent on.
  cfg.model.update(hierarchy="2@1 8@4 2@1", dropout=0.1, segment_capacity=1.0)
  return with_dynamic_shortening(cfg, predictor, "enwik8_dynamic", inner_layers=(2, 8))
