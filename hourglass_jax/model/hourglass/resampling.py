"""Hourglass resampling modules: shift right by k-1 and shorten (`Shorten`), upsample back with "+ r" (`Upsample`),
by the fixed methods of hourglass_jax/model/resampling/ (one module each, picked by name).

A shortened token j summarises shifted positions jk .. jk+k-1, i.e. original stream positions jk-k+1 .. jk, so a
full-resolution position q may use shortened tokens j <= q // k.
"""

import flax.linen as nn

from hourglass_jax.model import kv_cache
from hourglass_jax.model.hourglass.hierarchy import HourglassSettings
from hourglass_jax.model.layer_config import LayerOptions, check_int
from hourglass_jax.model.resampling import shift_right, shortening, upsampling


def _check_resampling(module, length: int | None) -> None:
  """The module's factors, and a full-resolution `length` that factor divides (None: decoding single rows)."""
  name = type(module).__name__
  check_int(f"{name}.factor", module.factor, 1)
  check_int(f"{name}.outer_factor", module.outer_factor, 1)
  if length is not None and length % module.factor:
    raise ValueError(f"{name}: the full-resolution length {length} is not a multiple of factor={module.factor}; "
                     "pad the sequence at the end (causal-safe) or use the Hourglass body, which pads for you.")


class Shorten(LayerOptions):
  """x [B, L, D] -> z [B, L/factor, D], causal: x is shifted right by factor-1 first, so z[j] summarises
  x[j*factor - factor + 1 .. j*factor]. `method` 'avg' | 'linear' pool each group of `factor` vectors; the
  'attention_*' methods pool queries that way and attend over the shifted stream (then a feed-forward tail).
  `outer_factor` is the input stream's own total shortening (for positions). Block settings: `LayerOptions`.

  Cached decoding (`start` given): x holds the shifted rows of whole segments start, start+1, ... (the caller
  keeps the last factor-1 rows of the stream); `kv` is the method's cache entry (None for 'avg' | 'linear');
  returns (z, kv).
  """
  factor: int = 2
  method: str = HourglassSettings.shorten  # SHORTEN_METHODS; the model's default (`HourglassSettings`)
  outer_factor: int = 1

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True, kv=None, start=None):
    method = shortening(self.method, "Shorten.method")
    _check_resampling(self, x_BxLxD.shape[1])
    cfg, k = self.layer_config(x_BxLxD.shape[-1]), self.factor
    cached = start is not None
    h0_BxLxD = x_BxLxD if cached else shift_right(x_BxLxD, k - 1)
    z_BxLkxD, kv = method.shorten(cfg, k, self.outer_factor, h0_BxLxD, deterministic, kv, start)
    return (z_BxLkxD, kv) if cached else z_BxLkxD


class Upsample(LayerOptions):
  """Shortened z [B, L/factor, D] and the full-resolution residual r [B, L, D] -> [B, L, D] (includes "+ r").
  Position q reads only z[j] with j <= q // factor. `method` 'repeat' | 'linear' expand each vector to `factor`;
  'attention_*' expand that way and attend over z; 'none' returns r. Block settings: `LayerOptions`.

  Cached decoding (`start` given): r holds stream entries start.., z the shortened tokens from entry `first` (at
  most start // factor) through the last one they read; `kv` is the method's cache entry (None otherwise);
  returns (y, kv).
  """
  factor: int = 2
  method: str = HourglassSettings.upsample  # UPSAMPLE_METHODS; the model's default (`HourglassSettings`)
  outer_factor: int = 1

  @nn.compact
  def __call__(self, z_BxLkxD, r_BxLxD, deterministic: bool = True, kv=None, start=None, first=None):
    length = r_BxLxD.shape[1]
    cached = start is not None
    method = upsampling(self.method, "Upsample.method")
    _check_resampling(self, None if cached else length)
    if not cached and z_BxLkxD.shape[1] * self.factor != length:
      raise ValueError(f"Upsample: z has {z_BxLkxD.shape[1]} positions and r has {length}; with factor="
                       f"{self.factor} z needs {length // self.factor}.")
    cfg, k = self.layer_config(r_BxLxD.shape[-1]), self.factor
    # Cached: z's first token covers entries first * k ..; r's rows start at offset start - first * k of its rows.
    rows = (lambda u: kv_cache.read_rows(u, start - first * k, length)) if cached else (lambda u: u)
    y_BxLxD, kv = method.upsample(cfg, k, self.outer_factor, z_BxLkxD, r_BxLxD, deterministic, rows, kv, start, first)
    return (y_BxLxD, kv) if cached else y_BxLxD
