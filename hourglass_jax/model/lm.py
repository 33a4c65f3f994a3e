"""Language-model wrapper: token embedding -> body -> untied output head; pads any length internally."""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model.checks import check_tokens, nan_rows_with_bad_ids
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.hourglass.body import Hourglass
from hourglass_jax.model.layer_config import check_dtype_runs_here
from hourglass_jax.model.layers import dense
from hourglass_jax.model.multiscale.topdown_bottomup import BottomUp, TopDown
from hourglass_jax.model.multiscale.retina import Retina, check_windows_fit
from hourglass_jax.ops.dropout import Dropout


BODIES = {"hourglass": Hourglass, "vanilla": Hourglass, "topdown": TopDown, "bottomup": BottomUp, "retina": Retina}


def build_body(cfg: ModelConfig, name: str = "body"):
  """The reusable body module of `cfg.kind`, each setting it declares from the config; retina's depth its level's."""
  body, known = BODIES[cfg.kind], ModelConfig.__dataclass_fields__
  settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(body) if f.name in known}
  if body is Retina:
    settings["num_layers"] = cfg.parsed_hierarchy.levels[0][0]
  return body(**settings, name=name)


class HourglassLM(nn.Module):
  """tokens [B, L] -> logits [B, L, vocab]; logits[:, t] depend only on tokens[:, :t+1] and predict token t+1.

  Serves every kind: the body is picked by `cfg.kind` (a single-level hierarchy is the vanilla decoder stack).
  Ids outside [0, vocab) raise ValueError when concrete; under jit their row's logits are all NaN (checks.py).
  With a `cache` (model/decode) it feeds the tokens at entries position.. (0.. when None) and returns (logits
  [B, vocab] of the last token, or [B, L, vocab] of every token with `every_logit`, cache) instead.
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL, deterministic: bool = True, cache=None, position=None, every_logit: bool = False):
    cfg = self.cfg
    tokens_BxL = check_tokens(tokens_BxL, cfg.vocab_size, "tokens")
    check_dtype_runs_here(cfg.dtype, "model.")
    if not tokens_BxL.shape[1]:
      raise ValueError(f"tokens has shape {tuple(tokens_BxL.shape)}: no positions; pass at least one token per row.")
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, name="embed",
                     embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")))
    head = dense(cfg.layer_config, cfg.vocab_size, ("embed", "vocab"), "head")
    if cache is not None:
      x_BxTxD = nan_rows_with_bad_ids(embed(tokens_BxL), tokens_BxL, cfg.vocab_size)
      x_BxTxD, cache = build_body(cfg)(x_BxTxD, True, cache, position, **self._from_tokens(tokens_BxL))
      return head(x_BxTxD if every_logit else x_BxTxD[:, -1]).astype(jnp.float32), cache
    length = tokens_BxL.shape[1]
    if cfg.kind == "retina":
      check_windows_fit(cfg.parsed_scales, cfg.retina_windows, length)
    multiple = cfg.pad_multiple
    padded = -(-length // multiple) * multiple
    # Padding at the end is causal-safe: no real position can see it.
    tokens_BxP = jnp.pad(tokens_BxL, ((0, 0), (0, padded - length)))
    x_BxPxD = nan_rows_with_bad_ids(embed(tokens_BxP), tokens_BxP, cfg.vocab_size)
    x_BxPxD = Dropout(cfg.dropout)(x_BxPxD, deterministic=deterministic)
    x_BxPxD = build_body(cfg)(x_BxPxD, deterministic, **self._from_tokens(tokens_BxP, targets=True))
    logits_BxPxV = head(x_BxPxD)
    return logits_BxPxV[:, :length].astype(jnp.float32)

  def _from_tokens(self, tokens_BxL, targets: bool = False) -> dict:
    """What the outermost dynamic level's predictor reads from the tokens rather than from its stream, as the body's
    keywords (`targets`: a whole sequence, not decoding)."""
    if not self.cfg.dynamic:
      return {}
    return self.cfg.level_predictors[0].from_tokens(self.cfg, tokens_BxL, targets)
