"""Small shared model settings: one set of dimensions so eager-mode op compilations are reused across tests."""

from hourglass_jax.model import ModelConfig

SMALL = dict(vocab_size=50, d_model=32, num_heads=4, d_ff=64)


def small_config(**overrides) -> ModelConfig:
  values = dict(SMALL, kind="hourglass", hierarchy="1@1 2@3 1@1")
  values.update(overrides)
  return ModelConfig(**values)
