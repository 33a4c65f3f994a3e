"""Command-line entry points (absl flags + ml_collections config files)."""

import logging
import os

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for this run's outputs.")


def _train(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" noise on CPU/GPU hosts
  from hourglass_jax.train.smoke import train_smoke

  os.makedirs(_WORKDIR.value, exist_ok=True)
  train_smoke(_CONFIG.value)


def train_entry():
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(_train)


if __name__ == "__main__":
  train_entry()
