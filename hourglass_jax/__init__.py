"""hourglass_jax: hierarchical transformers (Hourglass, multi-scale) in JAX/Flax."""

__version__ = "0.2.0"
