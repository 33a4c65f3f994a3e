"""Draft sources of speculative decoding, one module each (base.py has the interface): 'ngram' (prompt lookup)
and 'model' (a smaller model with the same vocabulary)."""

from hourglass_jax.model.decode.drafts.base import DRAFTS, Draft, register
from hourglass_jax.model.decode.drafts import ngram, model  # noqa: F401  registers
from hourglass_jax.model.decode.drafts.model import Model
from hourglass_jax.model.decode.drafts.ngram import NGram

__all__ = ["DRAFTS", "Draft", "Model", "NGram", "register"]
