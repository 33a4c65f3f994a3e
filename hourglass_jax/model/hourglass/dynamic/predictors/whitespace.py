"""'whitespace': segments close after given bytes (no parameters): the byte sets, masks and merging of runs."""

import string

import jax.numpy as jnp
import numpy as np

from hourglass_jax.model.hourglass.dynamic.predictors.base import DYNAMIC, BoundaryPredictor, Decision, register
from hourglass_jax.model.layer_config import setting

# Bytes after which the 'whitespace' predictor closes a segment: space, newline, tab and common ASCII punctuation.
WHITESPACE_BYTES = b" \n\t" + bytes(sorted(set(b".,;:!?\"'()[]{}-/")))
# Every ASCII punctuation byte as well: with run_bytes=' ' it cuts source code near one boundary in 4 bytes.
CODE_BOUNDARY_BYTES = b" \n\t" + bytes(sorted(set(string.punctuation.encode())))


def whitespace_boundaries(tokens_BxL, boundary_bytes: bytes = WHITESPACE_BYTES, run_bytes: bytes = b""):
  """bool [B, L]: a boundary after every byte of `boundary_bytes` (the parameter-free 'whitespace' predictor),
  except after a byte of `run_bytes` that follows one: a run of them closes one segment, at its first byte."""
  return merge_runs(byte_mask(tokens_BxL, boundary_bytes), byte_mask(tokens_BxL, run_bytes))


def byte_mask(tokens_BxL, byte_set: bytes):
  """bool [B, L]: the token is a byte of `byte_set`."""
  if not jnp.issubdtype(jnp.result_type(tokens_BxL), jnp.integer):
    raise ValueError(f"whitespace_boundaries / byte_mask take integer byte ids [batch, length], got dtype "
                     f"{jnp.result_type(tokens_BxL)}; pass the token ids (e.g. tokens.astype('int32')), not "
                     "embeddings.")
  table_V = np.zeros(256, bool)
  table_V[list(byte_set)] = True
  return jnp.asarray(table_V)[jnp.clip(tokens_BxL, 0, 255)] & (tokens_BxL >= 0) & (tokens_BxL < 256)


def merge_runs(boundaries_BxL, runs_BxL, run_before_B=None):
  """`boundaries_BxL` without those at a position of `runs_BxL` that follows one. `run_before_B`: whether the
  position before the first was one (cached decoding; none before a row's start when None)."""
  before_B = jnp.zeros(runs_BxL.shape[:1], bool) if run_before_B is None else run_before_B
  before_BxL = jnp.concatenate([before_B[:, None], runs_BxL[:, :-1]], axis=1)
  return boundaries_BxL & ~(runs_BxL & before_BxL)


@register
class Whitespace(BoundaryPredictor):
  """b_t = `boundaries_BxL`, less those `merge_runs` drops where `runs_BxL` marks run bytes, both made by the LM from
  the tokens (`from_tokens`): a segment closes after each byte of `boundary_bytes`, but a run of `boundary_run_bytes`
  closes one, after its first byte (' ': an indentation stays in one segment; decoding keeps the last token's)."""
  # 'whitespace': a segment closes after each of these bytes (a string of characters 0-255)
  boundary_bytes: str = setting(WHITESPACE_BYTES.decode(), function_of=(DYNAMIC,))
  # 'whitespace': some of boundary_bytes, a run of which closes one segment, after its first byte
  boundary_run_bytes: str = setting("", function_of=(DYNAMIC,))

  key = "whitespace"
  module_name = "whitespace"
  inner = False  # it reads bytes
  inputs = ("boundaries_BxL", "runs_BxL")

  @classmethod
  def check(cls, level, prefix: str) -> None:
    if not level.boundary_bytes or any(ord(c) > 255 for c in level.boundary_bytes):
      raise ValueError(f"{prefix}boundary_bytes={level.boundary_bytes!r} must be a non-empty string of byte values "
                       "(characters 0-255), e.g. ' \\n.,'.")
    strays = sorted(set(level.boundary_run_bytes) - set(level.boundary_bytes))
    if strays:
      raise ValueError(f"{prefix}boundary_run_bytes={level.boundary_run_bytes!r} has {''.join(strays)!r}, not in "
                       f"{prefix}boundary_bytes: a run byte only merges boundaries that its byte makes. Add it to "
                       "boundary_bytes, or drop it.")

  @classmethod
  def from_tokens(cls, cfg, tokens_BxL, targets: bool) -> dict:
    inputs = {"boundaries_BxL": byte_mask(tokens_BxL, cfg.boundary_bytes.encode("latin-1"))}
    if cfg.boundary_run_bytes:  # the level merges runs, across decoding steps as well
      inputs["runs_BxL"] = byte_mask(tokens_BxL, cfg.boundary_run_bytes.encode("latin-1"))
    return inputs

  new_state = classmethod(lambda cls, batch, d_model, dtype: {"run": jnp.zeros((batch,), bool)})

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
