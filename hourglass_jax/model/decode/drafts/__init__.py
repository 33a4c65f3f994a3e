"""Draft sources of speculative decoding, one module each (base.py has the interface): 'ngram' (prompt lookup),
'self' (the model's own draft heads) and 'model' (a smaller model with the same vocabulary)."""

from hourglass_jax.model.decode.drafts.base import DRAFTS, Draft, register
from hourglass_jax.model.decode.drafts import ngram, heads, model  # noqa: F401  registers
from hourglass_jax.model.decode.drafts.heads import SelfDraft
from hourglass_jax.model.decode.drafts.model import Model
from hourglass_jax.model.decode.drafts.ngram import NGram

__all__ = ["DRAFTS", "Draft", "Model", "NGram", "SelfDraft", "register"]
