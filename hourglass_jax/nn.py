"""Reusable Flax Linen building blocks of hierarchical transformers, each built from plain keyword arguments.

Every module maps [B, L, D] streams for any width D (`d_model=None` takes the input's), is exactly causal, keeps
logical axis names on its parameters (so a mesh's rules shard it) and works inside NNX code through
`flax.nnx.bridge.ToNNX`. `build_model` assembles the same modules from a `ModelConfig`.

  shift_right(x, n)      zeros in front: the causal shift that precedes shortening
  Shorten / Upsample     x [B, L, D] <-> [B, L/k, D]: avg | linear | attention_avg | attention_linear, and
                         repeat | linear | attention_repeat | attention_linear | none
  DynamicShorten / DynamicUpsample  learned shortening: x [B, L, D] -> segment means [B, M, D] (boundaries
                         'gumbel' / 'routing' / 'entropy' learned, or given: whitespace_boundaries(tokens), or
                         byte_mask(tokens, ...) with runs_BxL for run bytes) and each position's last
                         completed segment back (+ x)
  DecoderStack           pre-LN causal transformer blocks (scanned), ending with LayerNorm
  Hourglass              the whole hierarchy ('2@1 4@3 2@1') as one body; shorten='dynamic' for learned segments
  TopDown, BottomUp, Retina  the multi-scale bodies
  LayerOptions           the block settings every module above takes (num_heads, d_ff, dropout, dtype, ...)

Example (an Hourglass body over your own embeddings):

  body = Hourglass(hierarchy="2@1 4@3 2@1", num_heads=4)
  variables = body.init(jax.random.key(0), x_BxLxD)
  y_BxLxD = body.apply(variables, x_BxLxD)                     # y[:, t] depends on x[:, :t+1] only
"""

from hourglass_jax.model.hourglass import (BOUNDARY_PREDICTORS, SHORTEN_METHODS, UPSAMPLE_METHODS, DynamicShorten,
                                          DynamicUpsample, Hourglass, Shorten, Upsample, byte_mask, shift_right,
                                          whitespace_boundaries)
from hourglass_jax.model.layer_config import LayerConfig, LayerOptions
from hourglass_jax.model.layers import DecoderStack
from hourglass_jax.model.multiscale import BottomUp, Retina, TopDown
from hourglass_jax.runtime.sharding import LAYERS_AXIS

__all__ = ["BOUNDARY_PREDICTORS", "LAYERS_AXIS", "SHORTEN_METHODS", "UPSAMPLE_METHODS", "BottomUp", "DecoderStack",
           "DynamicShorten", "DynamicUpsample", "Hourglass", "LayerConfig", "LayerOptions", "Retina", "Shorten",
           "TopDown", "Upsample", "byte_mask", "shift_right", "whitespace_boundaries"]
