"""Small shared model settings: one set of dimensions so eager-mode op compilations are reused across tests."""

import jax
import pytest

from hourglass_jax.model import ModelConfig

SMALL = dict(vocab_size=50, d_model=32, num_heads=4, d_ff=64)


def small_config(**overrides) -> ModelConfig:
  values = dict(SMALL, kind="hourglass", hierarchy="1@1 2@3 1@1")
  values.update(overrides)
  return ModelConfig(**values)


@pytest.fixture(autouse=True, scope="module")
def quick_compiles():
  """Import into a test module of tiny programs that run for milliseconds, where XLA's optimisations would cost most
  of the test time: the module's tests then compile without them."""
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", previous)
