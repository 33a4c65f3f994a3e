"""Language-model wrapper: token embedding -> body -> untied output head; pads any length internally."""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model.checks import check_tokens, nan_rows_with_bad_ids
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.draft_heads import DraftHeads, sow_draft_losses
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
  [B, vocab] of the last token, or [B, L, vocab] of every token with `every_logit`, cache) instead; with `tap`
  also what the draft heads read at each position [B, L, D], as (logits, tap, cache).

  With `draft_heads` (draft_heads.py) training also sows the heads' loss. `draft_step=(z_BxD, i)` runs draft head
  i alone on the chain's state z (a tap's row for head 0) and the byte tokens_BxL [B, 1] before the one it
  predicts, and returns (its logits [B, vocab], the chain's next state).
  """
  cfg: ModelConfig

  @nn.compact
  def __call__(self, tokens_BxL, deterministic: bool = True, cache=None, position=None, every_logit: bool = False,
               tap: bool = False, draft_step=None):
    cfg = self.cfg
    tokens_BxL = check_tokens(tokens_BxL, cfg.vocab_size, "tokens")
    check_dtype_runs_here(cfg.dtype, "model.")
    if not tokens_BxL.shape[1]:
      raise ValueError(f"tokens has shape {tuple(tokens_BxL.shape)}: no positions; pass at least one token per row.")
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, name="embed",
                     embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")))
    head = dense(cfg.layer_config, cfg.vocab_size, ("embed", "vocab"), "head")
    heads = DraftHeads(cfg.layer_config, cfg.draft_heads, name="draft_heads") if cfg.draft_heads else None
    if draft_step is not None:
      if heads is None:
        raise ValueError("this model has no draft heads (model.draft_heads=0); train one with them, e.g. "
                         "configs/default.py:self_draft.")
      z_BxD, i = draft_step
      state_Bx1xD, z_BxD = heads(z_BxD, embed(tokens_BxL), first=i)
      return head(state_Bx1xD[:, 0]).astype(jnp.float32), z_BxD
    short = cfg.draft_heads_from == "short"
    if cache is not None:
      x_BxTxD = nan_rows_with_bad_ids(embed(tokens_BxL), tokens_BxL, cfg.vocab_size)
      out = build_body(cfg)(x_BxTxD, True, cache, position, **self._from_tokens(tokens_BxL),
                            **(dict(tap=True) if tap and short else {}))
      x_BxTxD, cache = out[:2]
      logits = head(x_BxTxD if every_logit else x_BxTxD[:, -1]).astype(jnp.float32)
      return (logits, out[2] if tap and short else x_BxTxD, cache) if tap else (logits, cache)
    length = tokens_BxL.shape[1]
    if cfg.kind == "retina":
      check_windows_fit(cfg.parsed_scales, cfg.retina_windows, length)
    multiple = cfg.pad_multiple
    padded = -(-length // multiple) * multiple
    # Padding at the end is causal-safe: no real position can see it.
    tokens_BxP = jnp.pad(tokens_BxL, ((0, 0), (0, padded - length)))
    e_BxPxD = nan_rows_with_bad_ids(embed(tokens_BxP), tokens_BxP, cfg.vocab_size)
    x_BxPxD = Dropout(cfg.dropout)(e_BxPxD, deterministic=deterministic)
    # The heads run where they train or are made (a plain apply, an evaluation's logits, leaves them out).
    drafting = heads is not None and (self.is_initializing() or self.is_mutable_collection("losses"))
    out = build_body(cfg)(x_BxPxD, deterministic, **self._from_tokens(tokens_BxP, targets=True),
                          **(dict(tap=True) if drafting and short else {}))
    x_BxPxD, tap_BxPxD = (out, out) if not (drafting and short) else out
    logits_BxPxV = head(x_BxPxD)
    if drafting:  # head i reads byte t+i (the true bytes: its input at decoding is the byte drafted before)
      after_BxPxMxD = jnp.stack([jnp.roll(e_BxPxD, -i, axis=1) for i in range(1, cfg.draft_heads + 1)], axis=2)
      draft_BxPxMxV = head(heads(tap_BxPxD, after_BxPxMxD)[0])
      if not self.is_initializing():
        sow_draft_losses(self, draft_BxPxMxV, tokens_BxP, length, cfg.draft_loss_weight)
    return logits_BxPxV[:, :length].astype(jnp.float32)

  def _from_tokens(self, tokens_BxL, targets: bool = False) -> dict:
    """What the outermost dynamic level's predictor reads from the tokens rather than from its stream, as the body's
    keywords (`targets`: a whole sequence, not decoding)."""
    if not self.cfg.dynamic:
      return {}
    return self.cfg.level_predictors[0].from_tokens(self.cfg, tokens_BxL, targets)
