"""A fixed Hourglass level of the body (shorten by a factor k): its forward pass, its cached decoding and its cache
entries. `body` is the Hourglass module whose level this is: it builds the level's modules (`stack`, ...).

In decoding, shortened token j becomes computable at stream entry jk, so the shortening and the inner level run
only for the tokens the new rows complete (under `nn.cond` when there may be none): fed one token at a time, a
level at total factor F runs once every F tokens."""

import flax.linen as nn
import jax.numpy as jnp

from hourglass_jax.model import kv_cache
from hourglass_jax.model.layers import pad_to
from hourglass_jax.model.resampling import shortening, upsampling


def level_cache(cfg, hierarchy, shorten: str, upsample: str, batch: int, padded: int):
  """(this level's cache entries: the pre-stack outputs 'stream' shifted by k-1 rows (what shortened tokens pool),
  the inner level's outputs 'z', and the resampling methods' own (the attention methods' 'short' and 'up'); the
  inner level's stream length, None when nothing reads it)."""
  k, up = hierarchy.relative_factor(0), upsampling(upsample)
  if not up.reads_shortened:
    return {}, None
  entries = dict(stream=kv_cache.new_stream(cfg, batch, padded, lead=k - 1),
                 z=kv_cache.new_stream(cfg, batch, padded // k))
  entries.update(shortening(shorten).cache(cfg, batch, padded, k), **up.cache(cfg, batch, padded, k))
  return entries, padded // k


def forward(body, hierarchy, options, x_BxLxD, deterministic, lengths_B=None, **inputs):
  """pre stack -> shift and shorten -> inner level -> upsample (+ x) -> post stack, padded to the total factor;
  returns (y, the up-sampled stream plus x: what the post stack reads)."""
  length = x_BxLxD.shape[1]
  x_BxPxD = pad_to(x_BxLxD, hierarchy.total_factor)
  x_BxPxD = body.stack(hierarchy.levels[0][0], "pre", options)(x_BxPxD, deterministic)
  z_BxQxD = body.shortening(hierarchy, options)(x_BxPxD, deterministic)
  z_BxQxD = body.inner_level(hierarchy, options)(z_BxQxD, deterministic)
  u_BxPxD = body.upsampling(hierarchy, options)(z_BxQxD, x_BxPxD, deterministic)
  y_BxPxD = body.stack(hierarchy.post_layers[0], "post", options)(u_BxPxD, deterministic)
  return y_BxPxD[:, :length], u_BxPxD[:, :length]


def decode(body, hierarchy, options, x_BxTxD, cache, start, lengths_B=None, **inputs):
  """The level's cached forward of x's T rows at stream entries start.. (one for every row, or [B]): pre stack, the
  shortened tokens they complete through the inner level (under nn.cond when T < k: maybe none; rows at their own
  entries run it when any row completes one), upsample, post stack. Returns (y, cache, the up-sampled stream)."""
  length = x_BxTxD.shape[1]
  index_T = kv_cache.entries(start, length)
  cache = dict(cache)
  x_BxTxD, cache["pre"] = body.stack(hierarchy.levels[0][0], "pre", options)(x_BxTxD, True, cache["pre"], index_T)
  y_BxTxD = x_BxTxD
  if upsampling(body.upsample).reads_shortened:
    k, size = hierarchy.relative_factor(0), cache["z"].shape[1]
    cache["stream"] = kv_cache.write_rows(cache["stream"], x_BxTxD, start + k - 1)
    new = kv_cache.coarse_tokens(start, length, k, size)

    def advance(module, sub, window_BxWxD, first):
      """Shortened tokens first.. through the inner level, their outputs written to 'z'."""
      z_BxNxD, short = module.shortening(hierarchy, options)(window_BxWxD, True, sub.get("short"), first)
      z_BxNxD, inner = module.inner_level(hierarchy, options)(z_BxNxD, True, sub["inner"], first)
      sub = dict(sub, inner=inner, z=kv_cache.write_rows(sub["z"], z_BxNxD, first))
      if short is not None:
        sub["short"] = short
      return sub

    sub = {name: cache[name] for name in ("short", "inner", "z") if name in cache}
    window_BxWxD = kv_cache.read_rows(cache["stream"], new.first * k, new.count * k)
    if new.any_new is True:
      sub = advance(body, sub, window_BxWxD, new.first)
    else:
      sub = nn.cond(new.any_new, advance, lambda module, sub, w, first: sub, body, sub, window_BxWxD, new.first)
    cache.update(sub)
    first, count = kv_cache.coarse_read(start, length, k, size)
    y_BxTxD, up = body.upsampling(hierarchy, options)(kv_cache.read_rows(cache["z"], first, count), x_BxTxD, True,
                                                     cache.get("up"), start, first)
    if up is not None:
      cache["up"] = up
  out_BxTxD, cache["post"] = body.stack(hierarchy.post_layers[0], "post", options)(y_BxTxD, True, cache["post"],
                                                                                     index_T)
  return out_BxTxD, cache, y_BxTxD
