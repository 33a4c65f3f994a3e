"""Cached generation: prefill, decode steps and K-token extensions through the model's own modules (steps.py),
sampling with `generate` (sampling.py) through one decode loop (loop.py), plain or speculative (speculative.py's
acceptance rule, drafts/, fallback.py)."""

from hourglass_jax.model.decode.steps import (cache_bytes, cache_length, decode_step, extend, init_cache, max_len_for,
                                              memory_limit, padded_length, prefill, unbox_params)

__all__ = ["cache_bytes", "cache_length", "decode_step", "extend", "init_cache", "max_len_for", "memory_limit",
           "padded_length", "prefill", "unbox_params"]
