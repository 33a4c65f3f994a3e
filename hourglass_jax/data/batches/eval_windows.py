"""Evaluation windows that score every predicted byte of a split exactly once, with per-position weights: the
source sources.make_source returns for evaluating text; pipeline.eval_iterator batches the weights with the tokens.

Over a split of N tokens, window k holds tokens [k*s, k*s + W + 1) (zero-padded past the end) and predicts
tokens k*s+1 .. k*s+W. With `context` c and stride s = W - c, window 0 scores all of its W predictions and every
later window only its last s (each after at least c tokens of context), so the N - 1 tokens that have a
predecessor are each scored once:
  windows       c = 0       non-overlapping windows (s = W)
  sliding       c = W / 2   window W, stride W/2, score the last W/2
  long_context  c given     the Hourglass enwik8 protocol: W = 6912, c = 6784, 128-byte chunks
"""

import numpy as np

PROTOCOLS = ("windows", "sliding", "long_context")


def protocol_context(protocol: str, window: int, eval_context: int) -> int:
  """Context length c of `protocol` for windows of `window` predictions."""
  if protocol == "windows":
    return 0
  if protocol == "sliding":
    return window // 2
  if protocol == "long_context":
    if not 0 < eval_context < window:
      raise ValueError(f"data.eval_protocol='long_context' needs 0 < data.eval_context < the eval window "
                       f"({window} = data.eval_seq_len, or data.seq_len when that is 0); got data.eval_context="
                       f"{eval_context}. The paper's enwik8 setting: eval_seq_len=6912, eval_context=6784.")
    return eval_context
  raise ValueError(f"data.eval_protocol={protocol!r}; choose one of {', '.join(PROTOCOLS)}.")


class ScoredWindows:
  """`[k] -> int32[W + 1]` tokens and `weights(k) -> float32[W]` (1 where prediction j of window k is scored)."""

  def __init__(self, tokens, window: int, context: int = 0):
    if not 0 <= context < window:
      raise ValueError(f"eval context {context} must lie in [0, window={window}).")
    self.tokens, self.window, self.context, self.stride = tokens, window, context, window - context
    self.size = len(tokens)
    if self.size < window + 1:
      raise ValueError(f"the split has {self.size:,} tokens, fewer than one {window}-token eval window + 1; lower "
                       "data.eval_seq_len (or data.seq_len) or use a larger split.")
    self._len = 1 + -(-(self.size - 1 - window) // self.stride)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> np.ndarray:
    start = int(index) * self.stride
    out = np.zeros(self.window + 1, np.int32)
    piece = np.asarray(self.tokens[start:start + self.window + 1])
    out[:len(piece)] = piece
    return out

  def weights(self, index: int) -> np.ndarray:
    start = int(index) * self.stride
    weights = np.zeros(self.window, np.float32)
    weights[0 if index == 0 else self.context:self.size - 1 - start] = 1.0
    return weights
