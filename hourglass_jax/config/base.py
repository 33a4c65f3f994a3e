"""Where config files start: `base_config()`, the skeleton of every section (declared in train/run_config.py)."""

from hourglass_jax.train.run_config import base_config  # noqa: F401  (the config files' import path)
