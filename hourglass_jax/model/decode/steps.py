"""Incremental (KV-cache) decoding for every model kind: prefill a prompt in one parallel pass, then one token per
step (`decode_step`) or K at once (`extend`, what a speculative decoder verifies with), with logits equal to
`build_model(cfg).apply` position by position.

There is no second copy of the model here: `HourglassLM` and its modules take a `cache` and a `position` and
return the cache (gemma's `Block(x, cache) -> (y, cache)`), so a change to a block changes decoding with it. Each
body documents its cache (hourglass/body.py, multiscale/topdown_bottomup.py, multiscale/retina.py; K/V caches in
kv_cache.py). A shortened level or coarse scale runs for the tokens the new rows complete (under nn.cond when they
may complete none), so fed one token at a time a level at total factor F runs once every F tokens.

Every cache entry is indexed by position, and nothing else is kept: a cache fed through position t + K - 1 holds, in
its entries before t + j, exactly what it held when fed through t + j - 1. Going back to t + j (the bytes a
verifier rejected) is feeding position t + j next; nothing is copied. Relative-position tables (W_r R(d) for every
distance) are made once per cache, in the 'tables' collection. Sampling and `generate` (a jit-compiled decode loop)
live in sampling.py, speculative decoding in speculative.py.
"""

import functools
import os
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from hourglass_jax.model.checks import check_tokens, is_checkable
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.lm import HourglassLM, build_body
from hourglass_jax.model.multiscale.retina import check_windows_fit


def unbox_params(variables):
  """Plain param tree from `module.init` output, boxed or not, with or without the 'params' collection."""
  params = nn.meta.unbox(variables)
  return params["params"] if "params" in params else params


@functools.lru_cache(maxsize=16)
def _param_shapes(cfg: ModelConfig) -> dict:
  variables = jax.eval_shape(HourglassLM(cfg).init, jax.random.key(0), jnp.zeros((1, cfg.pad_multiple), jnp.int32))
  return {key: tuple(leaf.shape) for key, leaf in traverse_util.flatten_dict(unbox_params(variables), sep="/").items()}


def check_params(params, cfg: ModelConfig, name: str = "params") -> None:
  """Raises ValueError, in one line naming `name`, unless `params` are a tree of arrays with the names and shapes
  that `build_model(cfg).init` makes (shapes only: nothing is computed)."""
  if not isinstance(params, Mapping):
    raise ValueError(f"{name} must be the model's params (the dict `init` or weights.load_params gives), got a "
                     f"{type(params).__name__} {params!r:.40}.")
  try:
    found = {key: tuple(np.shape(leaf)) for key, leaf in traverse_util.flatten_dict(unbox_params(params),
                                                                                  sep="/").items()}
  except (TypeError, ValueError, AttributeError) as error:
    raise ValueError(f"{name} is not a tree of arrays ({error}); pass the model's params.") from None
  expected = _param_shapes(cfg)
  problems = [f"{key} missing" for key in sorted(expected.keys() - found.keys())]
  problems += [f"{key} not in the model" for key in sorted(found.keys() - expected.keys())]
  problems += [f"{key} has shape {found[key]}, the model {expected[key]}"
               for key in sorted(found.keys() & expected.keys()) if found[key] != expected[key]]
  if problems:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    raise ValueError(f"{name} do not fit the model ({cfg.kind} {cfg.hierarchy}, d_model {cfg.d_model}): "
                     f"{'; '.join(problems[:3])}{more}; pass the params of that model.")


def padded_length(cfg: ModelConfig, max_len: int) -> int:
  """Positions the cache holds: max_len rounded up to the total shortening factor (or coarsest scale)."""
  return -(-max_len // cfg.pad_multiple) * cfg.pad_multiple


def max_len_for(cfg: ModelConfig, needed: int) -> int:
  """The max_len a cache for `needed` positions gets: `needed`, raised for a retina model whose widest window
  starts at or beyond it (the heads of such a window would never see a token, which init_cache refuses; the
  positions past `needed` are never fed)."""
  if cfg.kind == "retina":
    needed = max([needed] + [start + 1 for start, _ in cfg.parsed_scales.windows])
  return needed


def memory_limit() -> tuple[int, str]:
  """(bytes, what) a device holds: the first local device's memory limit, or the host's physical memory where the
  backend reports none (the CPU)."""
  device = jax.local_devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # backends without memory stats raise or return None
    stats = {}
  if "bytes_limit" in stats:
    return stats["bytes_limit"], f"a {device.device_kind}'s memory"
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's memory"


def cache_bytes(cfg: ModelConfig, batch: int, max_len: int) -> int:
  """Bytes of a decoding cache for `batch` sequences of `max_len` tokens (computed from shapes: nothing is
  allocated)."""
  body = build_body(cfg)
  shapes = jax.eval_shape(lambda: body.new_cache(batch, padded_length(cfg, max_len), cfg.d_model))
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))


def check_cache_fits(cfg: ModelConfig, batch: int, max_len: int, name: str = "max_len") -> None:
  """Raises ValueError, naming `name` (what sets max_len) and the fix, when a cache for `batch` sequences of
  `max_len` tokens would not fit the device (before anything is allocated or compiled)."""
  need, (have, what) = cache_bytes(cfg, batch, max_len), memory_limit()
  if need > have:
    raise ValueError(f"{name}: a decoding cache for {batch} sequences of {max_len:,} tokens needs "
                     f"{need / 2 ** 30:,.1f} GiB, more than {what} ({have / 2 ** 30:,.1f} GiB); ask for fewer tokens "
                     "or fewer sequences at once.")


def _empty_cache(cfg: ModelConfig, batch: int, max_len: int):
  """The body's empty cache arrays for `batch` sequences of up to `max_len` tokens, and no tables yet."""
  if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
    raise ValueError(f"max_len={max_len!r} must be an integer >= 1.")
  if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
    raise ValueError(f"batch={batch!r} must be an integer >= 1.")
  if cfg.kind == "retina":
    check_windows_fit(cfg.parsed_scales, cfg.retina_windows, max_len)
  check_cache_fits(cfg, batch, max_len)
  return {"state": build_body(cfg).new_cache(batch, padded_length(cfg, max_len), cfg.d_model), "tables": {}}


def init_cache(cfg: ModelConfig, batch: int, max_len: int, params=None):
  """Empty cache for `batch` sequences of up to `max_len` tokens: {'state': the body's arrays (its `new_cache`),
  'tables': the relative-position distance tables}.

  position='relative' needs `params`: the attention modules make their tables here, on a 1-token call. Decoding
  may start from an empty cache at position 0 without a prefill.
  """
  cache = _empty_cache(cfg, batch, max_len)
  if cfg.position == "relative":
    if params is None:
      raise ValueError("init_cache: position='relative' needs `params` to build its relative-position tables.")
    cache["tables"] = _run(params, cfg, _empty_cache(cfg, 1, max_len), jnp.zeros((1, 1), jnp.int32), None)[0]["tables"]
  return cache


def cache_length(cache) -> int:
  """Positions a cache holds (its padded max_len): the entries of its largest, full-resolution K/V cache."""
  leaves = jax.tree_util.tree_leaves_with_path(cache["state"])
  return max(leaf.shape[-2] for path, leaf in leaves if getattr(path[-1], "key", None) == "v")


def _run(params, cfg, cache, tokens_BxT, position, every_logit: bool = False, tap: bool = False):
  """(cache, logits) after feeding tokens_BxT, with `tap` (cache, logits, what the draft heads read [B, T, D]); a
  cache without tables gets them made in this same call."""
  variables = {"params": unbox_params(params), "tables": cache["tables"]}
  apply = lambda **kw: HourglassLM(cfg).apply(variables, tokens_BxT, cache=cache["state"], position=position,
                                              every_logit=every_logit, tap=tap, **kw)
  if cache["tables"] or cfg.position != "relative":
    *out, state = apply()
    return (dict(cache, state=state), *out)
  (*out, state), made = apply(mutable=["tables"])
  return ({"state": state, "tables": made["tables"]}, *out)


def draft_step(params, cfg: ModelConfig, z_BxD, token_B, head: int):
  """(draft head `head`'s logits [B, vocab], the chain's next state) from the chain's state (for head 0 what the
  heads read at one position per row, a row of `extend(..., tap=True)`'s tap) and the byte after that position's
  (head 0) or the one head - 1 drafted (model/draft_heads.py)."""
  return HourglassLM(cfg).apply({"params": unbox_params(params)}, token_B[:, None], draft_step=(z_BxD, head))


def prefill(params, cfg: ModelConfig, prompt_BxP, max_len: int, tap: bool = False):
  """Fills every cache from a prompt in one parallel (masked, whole-prompt) pass.

  Returns (cache, logits [B, vocab] predicting token P), with `tap` also what the draft heads read at each prompt
  position [B, P, D]. The models have no BOS token of their own (image data starts each sequence with one, see
  data/batches/image_source.py), so the prompt needs >= 1 token; prompt + generated tokens must fit in `max_len`.
  """
  prompt_BxP = check_tokens(prompt_BxP, cfg.vocab_size, "prompt")
  length = prompt_BxP.shape[1]
  if length < 1:
    raise ValueError("prefill needs a prompt of at least 1 token: this model has no BOS convention, so the first "
                     "prediction is conditioned on a real token (e.g. a newline byte).")
  if length > max_len:
    raise ValueError(f"the prompt has {length} tokens but the cache holds max_len={max_len}; raise max_len.")
  # The prompt's own pass makes the relative-position tables, so the model is applied once.
  return _run(params, cfg, _empty_cache(cfg, prompt_BxP.shape[0], max_len), prompt_BxP, None, tap=tap)


def decode_step(params, cfg: ModelConfig, cache, token_B, position):
  """Feeds token_B at `position` (an int or int scalar, traced under jit); returns (cache, logits [B, vocab]).

  Positions must be fed in order from the end of the prompt (or from 0 on an empty cache) and stay below
  `cache_length(cache)` (max_len rounded up to the shortening factor). A concrete position or token id out of range
  raises ValueError; under jit, a position out of range gives NaN logits for every row (and a row with an
  out-of-range id NaN logits for it), and the cache is no longer valid.
  """
  token_B = check_tokens(token_B, cfg.vocab_size, "token_B", "[batch]")
  size = cache_length(cache)
  if np.ndim(position) or not jnp.issubdtype(jnp.result_type(position), jnp.integer):
    raise ValueError(f"position={position!r} must be an integer scalar (the index of token_B in the sequence).")
  if is_checkable(position) and not 0 <= int(position) < size:
    raise ValueError(f"position={int(position)} is outside the cache, which holds positions [0, {size}); "
                     "init the cache (or prefill) with a larger max_len.")
  position = jnp.asarray(position, jnp.int32)
  cache, logits_BxV = _run(params, cfg, cache, jnp.asarray(token_B)[:, None], position)
  if not is_checkable(position):
    logits_BxV = jnp.where((position < 0) | (position >= size), jnp.nan, logits_BxV)
  return cache, logits_BxV


def row_positions(position_B):
  """`extend`'s position for rows at position_B: the scalar of a single row (then a level that may not run sits
  under a cond of its own), else position_B."""
  return position_B[0] if position_B.shape[0] == 1 else position_B


def extend(params, cfg: ModelConfig, cache, tokens_BxK, position, tap: bool = False):
  """Feeds K tokens per row in one pass; returns (cache, logits [B, K, vocab]): logits[:, i] are the forward pass's
  at the position of tokens[:, i] (they predict the token after it). `tap`: also what the draft heads read at each
  of the K positions [B, K, D] (model/draft_heads.py), as (cache, logits, tap).

  `position` is the first token's position: an int or int scalar for every row, or int [B] for each row its own
  (rows a speculative decoder advanced by different counts): one batched pass either way, every cache written row
  by row at its rows' positions under per-row masks. The K tokens go through every layer together, attending to the
  cache and to each other; a shortened level runs once for the tokens they complete (for rows at their own
  positions, when any row completes one). The cache must hold position + K entries (`cache_length`): a concrete
  position out of range raises ValueError, a traced one gives that row NaN logits. To take the cache back to
  position + j (j < K; the tokens a verifier rejected), feed position + j next: every entry is indexed by position,
  so nothing is copied or undone.
  """
  tokens_BxK = jnp.asarray(check_tokens(tokens_BxK, cfg.vocab_size, "tokens_BxK"), jnp.int32)
  batch, num = tokens_BxK.shape
  if num < 1:
    raise ValueError(f"tokens_BxK has shape {tokens_BxK.shape}: extend feeds at least one token per row.")
  size = cache_length(cache)
  if np.ndim(position) not in (0, 1) or (np.ndim(position) and np.shape(position) != (batch,)) or \
      not jnp.issubdtype(jnp.result_type(position), jnp.integer):
    raise ValueError(f"position={position!r} must be an integer scalar or int [{batch}] (one per row): the position "
                     "of each row's first token.")
  if is_checkable(position):
    low, high = int(np.min(position)), int(np.max(position))
    if low < 0 or high + num > size:
      raise ValueError(f"extend: {num} tokens from position {low if low < 0 else high} do not fit the cache, which "
                       f"holds positions [0, {size}); init the cache (or prefill) with a larger max_len.")
  position = jnp.asarray(position, jnp.int32)
  cache, logits_BxKxV, *rest = _run(params, cfg, cache, tokens_BxK, position, every_logit=True, tap=tap)
  if not is_checkable(position):
    bad_B = jnp.broadcast_to((position < 0) | (position + num > size), (batch,))
    logits_BxKxV = jnp.where(bad_B[:, None, None], jnp.nan, logits_BxKxV)
  return (cache, logits_BxKxV, *rest)
