"""configs/gpu.py: every preset loads, validates and builds its model (abstract init only: no parameters)."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.common import load_config
from hourglass_jax.model import ModelConfig, build_model, counting


@pytest.mark.parametrize("preset", ["", "large", "dynamic", "fixed"])
def test_gpu_preset_loads_and_builds(preset):
  cfg = load_config("gpu", preset)
  assert cfg.model.dtype == "bfloat16"
  model_cfg = ModelConfig.from_dict(cfg.model)
  shapes = jax.eval_shape(build_model(model_cfg).init, jax.random.key(0),
                          jnp.zeros((1, 48), jnp.int32))  # parameters do not depend on the length
  params = sum(x.size for x in jax.tree.leaves(shapes["params"]))
  assert params == counting.total_params(model_cfg)
  if preset == "large":
    assert cfg.model.d_model >= 1024 and 2e8 < params < 8e8
  if preset in ("dynamic", "fixed"):
    twin = load_config("gpu", "fixed" if preset == "dynamic" else "dynamic")
    assert twin.model.hierarchy == cfg.model.hierarchy and twin.data.batch_size == cfg.data.batch_size


def test_gpu_config_names_its_presets_on_a_typo():
  with pytest.raises(ValueError, match="'large'"):
    load_config("gpu", "larg")
