"""LayerNorm with its backward pass written out: flax.linen.LayerNorm's values, none of its saved float32 copies.

The forward pass is flax's, operation for operation (float32 statistics, E[x^2] - E[x]^2 clipped at 0,
rsqrt(var + eps) * scale, + bias), so the values are identical.

Differentiated by JAX, flax's LayerNorm keeps three float32 arrays of the input's full size for the backward pass
(x^2, x - mean and the normalised x), which a scanned stack stacks per layer and reads back. Here the backward pass
keeps the input itself (usually the residual stream, kept anyway) and two float32 numbers per row (the mean and
the mean of squares), and recomputes 1/std and the normalised x inside the fusions that need them:
dx = rstd (g - mean(g) - x_hat mean(g x_hat)) with g = dy * scale; dscale = sum(dy x_hat); dbias = sum(dy).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax


def _moments(x):
  """(mean, mean of squares) over the last axis in float32 (at least), shaped [..., 1]: one reduction kernel."""
  x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  return x32.mean(-1, keepdims=True), lax.square(x32).mean(-1, keepdims=True)


def _rstd(mean, mean_sq, epsilon: float):
  return lax.rsqrt(jnp.maximum(0.0, mean_sq - lax.square(mean)) + epsilon)


def _normalise(x, scale, bias, mean, mean_sq, epsilon, dtype):
  return jnp.asarray((x - mean) * (_rstd(mean, mean_sq, epsilon) * scale) + bias, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x, scale, bias, epsilon: float, dtype):
  """(x - mean) / sqrt(var + epsilon) * scale + bias over the last axis, returned in `dtype`; `scale` and `bias`
  are [features]. The values of flax.linen.LayerNorm(epsilon=epsilon, dtype=dtype)."""
  return _normalise(x, scale, bias, *_moments(x), epsilon, dtype)


def _layer_norm_fwd(x, scale, bias, epsilon, dtype):
  moments = _moments(x)
  # the moments, not 1/std, are kept: 1/std is recomputed in each fusion that reads it, not a kernel of its own
  return _normalise(x, scale, bias, *moments, epsilon, dtype), (x, scale, bias, *moments)


def _layer_norm_bwd(epsilon, dtype, residuals, d_y):
  x, scale, bias, mean, mean_sq = residuals
  rstd = _rstd(mean, mean_sq, epsilon)
  x_hat = (x - mean) * rstd
  d_y = d_y.astype(x_hat.dtype)
  g = d_y * scale
  d_x = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
  rows = tuple(range(x.ndim - 1))
  return (d_x.astype(x.dtype), (d_y * x_hat).sum(rows).astype(scale.dtype), d_y.sum(rows).astype(bias.dtype))


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)
