"""A fixed Hourglass level of the body (shorten by a factor k): its forward pass, its cached decoding and its cache
entries. `body` is the Hourglass module whose level this is: it builds the stacks, resampling and inner level.

In decoding, shortened token j becomes computable at stream entry jk, so the shortening and the inner level run
under `nn.cond(position % k == 0)`: a level at total factor F runs once every F tokens."""

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layers import pad_to


def level_cache(cfg, hierarchy, shorten: str, upsample: str, batch: int, padded: int):
  """(this level's cache entries: the last k-1 pre-stack outputs 'buf', with the newest one the shifted window a
  shortened token summarises, the attention resampling caches 'short' and 'up', the newest shortened output 'z';
  the inner level's stream length, None when nothing reads it)."""
  k = hierarchy.relative_factor(0)
  if upsample == "none":
    return {}, None
  entries = dict(buf=jnp.zeros((batch, k - 1, cfg.d_model), cfg.compute_dtype),
                 z=jnp.zeros((batch, 1, cfg.d_model), cfg.compute_dtype))
  if shorten.startswith("attention_"):
    entries["short"] = kv_cache.new_kv(cfg, batch, padded)
  if upsample.startswith("attention_"):
    entries["up"] = kv_cache.new_kv(cfg, batch, padded // k)
  return entries, padded // k


def forward(body, hierarchy, options, x_BxLxD, deterministic, lengths_B=None, **inputs):
  """pre stack -> shift and shorten -> inner level -> upsample (+ x) -> post stack, padded to the total factor."""
  length = x_BxLxD.shape[1]
  x_BxPxD = pad_to(x_BxLxD, hierarchy.total_factor)
  x_BxPxD = body._stack(hierarchy.levels[0][0], "pre", options)(x_BxPxD, deterministic)
  z_BxQxD = body._shorten(hierarchy, options)(x_BxPxD, deterministic)
  z_BxQxD = body._inner(hierarchy, options)(z_BxQxD, deterministic)
  y_BxPxD = body._upsample(hierarchy, options)(z_BxQxD, x_BxPxD, deterministic)
  y_BxPxD = body._stack(hierarchy.post_layers[0], "post", options)(y_BxPxD, deterministic)
  return y_BxPxD[:, :length]


def decode(body, hierarchy, options, x_BxTxD, cache, position, lengths_B=None, **inputs):
  """The level's cached forward: pre stack, the shortened path when a token completes, upsample, post stack."""
  length = x_BxTxD.shape[1]
  start = 0 if position is None else position
  index_T = start + jnp.arange(length)
  cache = dict(cache)
  x_BxTxD, cache["pre"] = body._stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"], index_T)
  y_BxTxD = x_BxTxD
  if body.upsample != "none":
    k = hierarchy.relative_factor(0)
    window_BxWxD, cache["buf"] = kv_cache.shift_in(cache["buf"], x_BxTxD)  # shifted stream entries start-k+1 ..

    def advance(module, sub, window_BxWxD, j):
      """Shortened tokens from j (all the prompt completes when `position` is None) through the inner level."""
      j0 = 0 if j is None else j
      z_BxNxD, short = module._shorten(hierarchy, options)(window_BxWxD, True, sub.get("short"), j0)
      z_BxNxD, inner = module._inner(hierarchy, options)(z_BxNxD, True, sub["inner"], j)
      sub = dict(sub, inner=inner, z=z_BxNxD[:, -1:])
      if short is not None:
        sub["short"] = short
      return z_BxNxD, sub

    sub = {name: cache[name] for name in ("short", "inner", "z") if name in cache}
    if position is None:
      z_BxNxD, sub = advance(body, sub, window_BxWxD[:, :kv_cache.num_coarse(length, k) * k], None)
    else:
      sub = nn.cond(position % k == 0, lambda module, sub, w, j: advance(module, sub, w, j)[1],
                    lambda module, sub, w, j: sub, body, sub, window_BxWxD, position // k)
      z_BxNxD = sub["z"]
    cache.update(sub)
    y_BxTxD, up = body._upsample(hierarchy, options)(z_BxNxD, x_BxTxD, True, cache.get("up"), start)
    if up is not None:
      cache["up"] = up
  y_BxTxD, cache["post"] = body._stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                   index_T)
  return y_BxTxD, cache
