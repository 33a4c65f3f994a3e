"""Cached generation: prefill and decode steps through the model's own modules (steps.py), and sampling with
`generate`, one jit-compiled decode loop (sampling.py)."""

from hourglass_jax.model.decode.steps import (cache_length, decode_step, init_cache, padded_length, prefill,
                                              unbox_params)

__all__ = ["cache_length", "decode_step", "init_cache", "padded_length", "prefill", "unbox_params"]
