"""'whitespace': segments close after the bytes of `model.boundary_bytes`, given from outside (no parameters)."""

import jax.numpy as jnp

from hourglass_jax.model.hourglass.dynamic.segments import byte_mask, merge_runs
from hourglass_jax.model.hourglass.dynamic.predictors.base import BoundaryPredictor, Decision, register


@register
class Whitespace(BoundaryPredictor):
  """b_t = `boundaries_BxL` (`whitespace_boundaries(tokens)`, bool [B, L]), less those `merge_runs` drops where
  `runs_BxL` marks run bytes (a run closes one segment; cached decoding keeps whether the last token was one)."""
  key = "whitespace"
  module_name = "whitespace"
  inner = False  # it reads bytes
  inputs = ("boundaries_BxL", "runs_BxL")

  @classmethod
  def from_tokens(cls, cfg, tokens_BxL, targets: bool) -> dict:
    inputs = {"boundaries_BxL": byte_mask(tokens_BxL, cfg.boundary_bytes.encode("latin-1"))}
    if cfg.boundary_run_bytes:  # the level merges runs, across decoding steps as well
      inputs["runs_BxL"] = byte_mask(tokens_BxL, cfg.boundary_run_bytes.encode("latin-1"))
    return inputs

  @classmethod
  def new_state(cls, batch: int, d_model: int, dtype) -> dict:
    return {"run": jnp.zeros((batch,), bool)}

  def __call__(self, x_BxLxD, deterministic=True, positions_L=None, lengths_B=None, state=None,
               boundaries_BxL=None, runs_BxL=None):
    if boundaries_BxL is None or boundaries_BxL.shape != x_BxLxD.shape[:2]:
      raise ValueError(f"DynamicShorten(boundaries='whitespace') needs boundaries_BxL of shape "
                       f"{x_BxLxD.shape[:2]} (got {None if boundaries_BxL is None else boundaries_BxL.shape}); "
                       "pass whitespace_boundaries(tokens), or use boundaries='gumbel' to learn them.")
    b_BxL = boundaries_BxL.astype(bool)
    if runs_BxL is None:
      return Decision(b_BxL.astype(jnp.float32))
    if runs_BxL.shape != boundaries_BxL.shape:
      raise ValueError(f"DynamicShorten: runs_BxL has shape {runs_BxL.shape}, boundaries_BxL "
                       f"{boundaries_BxL.shape}; pass byte_mask(tokens, run_bytes) of the same tokens.")
    b_BxL = merge_runs(b_BxL, runs_BxL.astype(bool), None if state is None else state["run"])
    return Decision(b_BxL.astype(jnp.float32), state={"run": runs_BxL.astype(bool)})
