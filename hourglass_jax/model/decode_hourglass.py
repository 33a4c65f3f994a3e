"""Incremental decoding of kind='hourglass' and 'vanilla' (a vanilla model is the center level alone).

The cache holds, per level (total factor F, relative factor k to the next level, L_F = padded max_len / F entries):
  pre / post / layers  K/V of every decoder block of the level's stacks.
  buf     the last k-1 outputs of the pre stack: with the newest one they are the shifted window h0[jk .. jk+k-1]
          (= stream positions jk-k+1 .. jk, zeros before the start) that shortened token j summarises.
  short   attention shortening's K/V of LN(h0[m]) at positions (m-k+1)F, L_F entries; LN(0) for m < k-1.
  rows    the k up-sampled vectors of the newest shortened token; stream position q uses row q % k.
  up      attention up-sampling's K/V of LN(s_j) at positions jkF, L_F/k entries.
  inner   the next level's cache.
At stream position i a level runs its pre stack, its up-sampling and its post stack. Shortened token j = i/k
becomes computable exactly when i % k == 0: only then (under lax.cond) do the shortening, the inner level at its
own position j and the up-sampling's rows/keys run, so a level at total factor F advances every F tokens.
With upsample='none' the shortened path cannot reach the output and is skipped.
"""

import jax.numpy as jnp
from jax import lax

from hourglass_jax.model import decode_layers as dl


def _shorten(cfg, p, st, seg_BxNkxD, j0, k: int, factor: int):
  """Shortened tokens j0..j0+n-1 from their shifted windows h0[j0 k .. (j0+n) k - 1]; extends the 'short' cache."""
  method = cfg.shorten.removeprefix("attention_")
  if not cfg.shorten.startswith("attention_"):
    return dl.pool(cfg, p.get("pool"), k, method, seg_BxNkxD), st
  n = seg_BxNkxD.shape[1] // k
  pa = p["resample"]["attention"]
  h_BxNkxD = dl.ln(cfg, p["input_norm"], seg_BxNkxD)
  m_T = j0 * k + jnp.arange(n * k)
  st = dict(st, short=dl.write_kv(cfg, pa["key"], pa["value"], st["short"], h_BxNkxD, (m_T - k + 1) * factor,
                                  j0 * k))
  q0_BxNxD = dl.ln(cfg, p["query_norm"], dl.pool(cfg, p.get("pool"), k, method, h_BxNkxD))
  j_N = j0 + jnp.arange(n)
  size = st["short"]["v"].shape[2]
  mask_NxS = jnp.arange(size)[None, :] // k <= j_N[:, None]
  q0_BxNxD = q0_BxNxD + dl.attend(cfg, pa, st["short"], q0_BxNxD, j_N * k * factor,
                                  (jnp.arange(size) - k + 1) * factor, mask_NxS, factor)
  return dl.ffn_residual(cfg, p["resample"], q0_BxNxD), st


def _upsample_rows(cfg, p, st, z_BxNxD, j0, k: int, factor: int):
  """Up-sampled rows [B, n k, D] of inner outputs j0..j0+n-1; attention up-sampling also caches K/V of LN(s_j)."""
  method = cfg.upsample.removeprefix("attention_")
  if not cfg.upsample.startswith("attention_"):
    return dl.ln(cfg, p["output_norm"], dl.unpool(cfg, p.get("unpool"), k, method, z_BxNxD)), st
  s_BxNxD = dl.ln(cfg, p["input_norm"], z_BxNxD)
  pa = p["resample"]["attention"]
  positions_N = (j0 + jnp.arange(z_BxNxD.shape[1])) * k * factor
  st = dict(st, up=dl.write_kv(cfg, pa["key"], pa["value"], st["up"], s_BxNxD, positions_N, j0))
  return dl.ln(cfg, p["query_norm"], dl.unpool(cfg, p.get("unpool"), k, method, s_BxNxD)), st


def _upsample(cfg, p, st, x_BxTxD, rows_BxTxD, index_T, k: int, factor: int):
  """Upsample's output at stream entries index_T (includes "+ r" with r = x)."""
  if not cfg.upsample.startswith("attention_"):
    return rows_BxTxD + x_BxTxD
  u_BxTxD = rows_BxTxD + x_BxTxD
  size = st["up"]["v"].shape[2]
  mask_TxS = jnp.arange(size)[None, :] <= (index_T // k)[:, None]
  u_BxTxD = u_BxTxD + dl.attend(cfg, p["resample"]["attention"], st["up"], u_BxTxD, index_T * factor,
                                jnp.arange(size) * k * factor, mask_TxS, factor)
  u_BxTxD = dl.ffn_residual(cfg, p["resample"], u_BxTxD)
  return dl.ln(cfg, p["output_norm"], u_BxTxD) + x_BxTxD


def _advance(cfg, level, p, sub, seg_BxNkxD, j):
  """Shorten -> inner level -> up-sampling rows/keys: the part that runs every k entries.

  j None: every shortened token the prompt makes computable (prefill); else the one token j (traced).
  """
  hierarchy = cfg.parsed_hierarchy
  k, factor = hierarchy.relative_factor(level), hierarchy.levels[level][1]
  j0 = 0 if j is None else j
  z_BxNxD, sub = _shorten(cfg, p.get("shorten", {}), sub, seg_BxNkxD, j0, k, factor)
  z_BxNxD, inner = _run_level(cfg, level + 1, p["inner"], sub["inner"], z_BxNxD, j)
  return _upsample_rows(cfg, p["upsample"], dict(sub, inner=inner), z_BxNxD, j0, k, factor)


def _run_level(cfg, level, p, st, x_BxTxD, position=None):
  """Level outputs and updated cache: for the whole prompt (entries 0..T-1) when `position` is None (prefill),
  else for one entry at the traced scalar `position`, with the shortened path under lax.cond(position % k == 0).
  """
  hierarchy = cfg.parsed_hierarchy
  num_pre, factor = hierarchy.levels[level]
  length = x_BxTxD.shape[1]
  start = 0 if position is None else position
  index_T = start + jnp.arange(length)
  st = dict(st)
  if level == hierarchy.depth:
    x_BxTxD, st["layers"] = dl.stack(cfg, p["layers"], st["layers"], x_BxTxD, index_T, start, num_pre, factor)
    return x_BxTxD, st
  x_BxTxD, st["pre"] = dl.stack(cfg, p["pre"], st["pre"], x_BxTxD, index_T, start, num_pre, factor)
  y_BxTxD = x_BxTxD
  if cfg.upsample != "none":
    k = hierarchy.relative_factor(level)
    window_BxWxD, st["buf"] = dl.shift_in(st["buf"], x_BxTxD)  # h0[start .. start+T+k-2]
    sub = {name: st[name] for name in ("short", "inner", "rows", "up") if name in st}
    if position is None:  # shortened tokens 0 .. (T-1)//k are computable from the prompt
      num_short = dl.num_coarse(length, k)
      rows_BxRxD, sub = _advance(cfg, level, p, sub, window_BxWxD[:, :num_short * k], None)
      sub["rows"] = rows_BxRxD[:, -k:]
      rows_BxTxD = rows_BxRxD[:, :length]
    else:
      def advance(sub):
        rows_BxKxD, sub = _advance(cfg, level, p, sub, window_BxWxD, position // k)
        return dict(sub, rows=rows_BxKxD)
      sub = lax.cond(position % k == 0, advance, lambda sub: sub, sub)
      rows_BxTxD = lax.dynamic_slice_in_dim(sub["rows"], position % k, 1, axis=1)
    st.update(sub)
    y_BxTxD = _upsample(cfg, p["upsample"], st, x_BxTxD, rows_BxTxD, index_T, k, factor)
  num_post = hierarchy.post_layers[level]
  x_BxTxD, st["post"] = dl.stack(cfg, p["post"], st["post"], y_BxTxD, index_T, start, num_post, factor)
  return x_BxTxD, st


def _init_level(cfg, level, batch, padded):
  hierarchy = cfg.parsed_hierarchy
  num_pre, factor = hierarchy.levels[level]
  size = padded // factor
  if level == hierarchy.depth:
    return {"layers": dl.new_stack(cfg, batch, num_pre, size)}
  st = {"pre": dl.new_stack(cfg, batch, num_pre, size),
        "post": dl.new_stack(cfg, batch, hierarchy.post_layers[level], size)}
  if cfg.upsample != "none":
    k = hierarchy.relative_factor(level)
    st["buf"] = jnp.zeros((batch, k - 1, cfg.d_model), cfg.compute_dtype)
    st["rows"] = jnp.zeros((batch, k, cfg.d_model), cfg.compute_dtype)
    st["inner"] = _init_level(cfg, level + 1, batch, padded)
    if cfg.shorten.startswith("attention_"):
      st["short"] = dl.new_kv(cfg, batch, size)
    if cfg.upsample.startswith("attention_"):
      st["up"] = dl.new_kv(cfg, batch, size // k)
  return st


def init_state(cfg, batch: int, padded: int):
  """Empty per-level caches for `batch` sequences of `padded` (a multiple of the total factor) entries."""
  return _init_level(cfg, 0, batch, padded)


def relative_tables(cfg, body, padded: int):
  factors = [factor for _, factor in cfg.parsed_hierarchy.levels]
  deeper = dict(zip(factors, factors[1:]))
  return dl.relative_tables(cfg, body, padded, 1, lambda name, f: deeper[f] if name == "inner" else f)


def run(cfg, body, state, x_BxTxD, position=None):
  """Body outputs and cache: prefill of entries 0..T-1 (position None) or one entry at `position`."""
  return _run_level(cfg, 0, body, state, x_BxTxD, position)
