"""`generate`: sampling with the cache through the one decode loop (loop.py), plain or speculative; the arguments
are checked here, once, into a `Sampling` (options.py); the filters are in filters.py."""

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model.checks import check_tokens
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.decode import fallback, loop
from hourglass_jax.model.decode.drafts import DRAFTS
from hourglass_jax.model.decode.options import MAX_DRAFT_TOKENS, MAX_TOKENS, Sampling, check_draft, count
from hourglass_jax.model.decode.steps import check_cache_fits, check_params, unbox_params

__all__ = ["MAX_DRAFT_TOKENS", "Programs", "Sampling", "draft_for", "generate"]


def _seed_key(rng):
  """A PRNG key from `rng` (a key, or an integer seed in [0, 2**63))."""
  if isinstance(rng, jax.Array) and (jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) or rng.dtype == jnp.uint32):
    return rng
  if isinstance(rng, numbers.Integral) and not isinstance(rng, bool) and 0 <= rng < 2 ** 63:
    return jax.random.key(int(rng))
  raise ValueError(f"rng={rng!r} must be a PRNG key (e.g. jax.random.key(0)) or an integer seed in [0, 2**63).")


def draft_for(draft, draft_params, cfg: ModelConfig, draft_tokens: int):
  """(the Draft that `draft` names, set up for `cfg`; the params it reads: `draft_params`, the target's own for a
  draft that reads the target) for None, a registered name ('ngram', 'self') or a Draft; ValueError naming the fix."""
  if draft is None:
    if draft_params is not None:
      raise ValueError("draft_params are the params of a draft model; pass draft=drafts.Model(draft_cfg) with them.")
    return None
  names = ", ".join(name for name in DRAFTS if name != "model")
  if isinstance(draft, str):
    if draft not in DRAFTS or draft == "model":
      raise ValueError(f"draft={draft!r} is not a draft name; use one of {names}, or drafts.Model(cfg) with "
                       "draft_params for a draft model.")
    draft = DRAFTS[draft]()
  check_draft(draft)
  if draft.reads_target and draft_params is not None:
    raise ValueError(f"draft={draft.name!r} drafts with this model's own params; leave draft_params unset.")
  draft.check(cfg, draft_params)
  return draft.for_target(cfg, draft_tokens), draft_params


@functools.partial(jax.jit, static_argnames=("cfg", "options", "pass_cost"))
def _whole(params, draft_params, prompt_BxP, rng, end_token, threshold, cfg, options, pass_cost):
  """The whole generation as one program: the loop to the end, the fallback rule on `threshold` tokens per pass."""
  state = loop.start(params, draft_params, prompt_BxP, rng, end_token, cfg, options)
  state = loop.advance(params, draft_params, state, end_token, threshold, loop.UNLIMITED, cfg, options)
  return loop.finish(state, prompt_BxP, end_token, cfg, options, pass_cost)


@dataclasses.dataclass(frozen=True)
class Programs:
  """The loop's pieces for a generation in timed windows (fallback.measured): `compile` makes `start`, `advance`
  (the state donated; it also returns `loop.progress`) and `finish` for one shape of arguments, ahead of time so
  that no window's timing includes a compile; `run` generates with them. `in_shardings` of (params, draft_params,
  prompt, rng) and `out_sharding` of finish's outputs where the params are sharded (generation.py), else None."""
  cfg: ModelConfig
  options: Sampling
  in_shardings: tuple | None = None
  out_sharding: object = None

  def compile(self, params, draft_params, prompt_BxP, rng, end_token, compiler_options=None) -> dict:
    cfg, options = self.cfg, self.options
    shardings = {} if self.in_shardings is None else dict(in_shardings=self.in_shardings + (None,))

    def start(params, draft_params, prompt_BxP, rng, end_token):
      state = loop.start(params, draft_params, prompt_BxP, rng, end_token, cfg, options)
      return state, loop.progress(state)

    start = jax.jit(start, **shardings).lower(params, draft_params, prompt_BxP, rng, end_token).compile(
        compiler_options)

    def advance(params, draft_params, state, end_token, iterations, only):
      state = loop.advance(params, draft_params, state, end_token, jnp.float32(0), iterations, cfg, options, only)
      return state, loop.progress(state)

    same = jax.tree.map(lambda info: info.sharding, start.out_info)  # so that each window feeds the next
    # A program of passes and one of plain steps (loop.advance's `only`): the host picks the mode of each window.
    advance = {only: jax.jit(functools.partial(advance, only=only), donate_argnums=(2,), out_shardings=same).lower(
        params, draft_params, start.out_info[0], end_token, jnp.int32(0)).compile(compiler_options)
        for only in ((False,) if options.draft is None else (True, False))}
    out = {} if self.out_sharding is None else dict(out_shardings=self.out_sharding)
    finish = jax.jit(functools.partial(loop.finish, cfg=cfg, options=options), **out).lower(
        advance[False].out_info[0], prompt_BxP, end_token).compile(compiler_options)
    return dict(start=start, advance=advance, finish=finish)

  def run(self, compiled: dict, params, draft_params, prompt_BxP, rng, end_token, to_host=jax.device_get):
    """(tokens, Stats with the measured pass cost) of the generation in timed windows; `to_host` reads the
    loop's progress (sharding.to_host on a mesh)."""
    read = lambda counts: tuple(value.item() for value in to_host(counts))
    # On the device once, not at each window: host arrays (a checkpoint's) would be copied in every call.
    on_device = lambda tree: tree if all(isinstance(a, jax.Array) for a in jax.tree.leaves(tree)) else \
        jax.device_put(tree)
    placed = on_device(params)
    params, draft_params = placed, (placed if draft_params is params else on_device(draft_params))
    state, counts = compiled["start"](params, draft_params, prompt_BxP, rng, end_token)
    now = {"progress": read(counts)}

    def advance(state, speculating, iterations):
      state = dataclasses.replace(state, speculating=jnp.asarray(speculating))
      state, counts = compiled["advance"][speculating](params, draft_params, state, end_token,
                                                       jnp.int32(iterations))
      now["progress"] = read(counts)
      return state

    for speculating in compiled["advance"]:  # each program run once untimed (0 iterations): no first-run costs
      state = advance(state, speculating, 0)

    state, clock, to_plain, to_draft = fallback.measured(advance, state, lambda state: now["progress"])
    tokens, stats = compiled["finish"](state, prompt_BxP, end_token)
    cost = clock.measured_pass_cost
    estimate = fallback.pass_cost(prompt_BxP.shape[0], self.options.proposals)
    # The iterations before the first switch to plain decoding are all passes.
    return tokens, dataclasses.replace(
        stats, fell_back_at=jnp.int32(to_plain[0] if to_plain else -1), returns=jnp.int32(len(to_draft)),
        pass_cost=estimate if cost is None else cost, measured=cost is not None,
        seconds_per_step=clock.seconds_per_step)


def generate(params, cfg: ModelConfig, prompt_BxP, *, max_new_tokens: int, rng, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, end_token: int | None = None, draft=None, draft_params=None,
             draft_tokens: int = 4, fallback_below: float | None = None, return_stats: bool = False):
  """Samples `max_new_tokens` tokens after each prompt row with the cache; returns them, int32 [B, max_new_tokens].

  The decode loop (loop.py): a parallel prefill, then steps until every row has produced `end_token` (later
  entries of a finished row are `end_token`) or `max_new_tokens`. The cache holds `decode.max_len_for(cfg,
  P + max_new_tokens - 1)` positions (plus draft_tokens when speculating). temperature 0 is greedy; top_k 0 and
  top_p 1 disable those filters; a temperature that is negative or not finite, a negative top_k or a top_p outside
  (0, 1] raises ValueError (`Sampling`). `rng` is a PRNG key or an integer seed; the prompt needs >= 1 token (no BOS
  convention). A prompt id outside [0, vocab) raises ValueError; when the prompt is traced (generate under your own
  jit), that row comes back as -1 everywhere.

  Speculative decoding: `draft` 'ngram' (prompt lookup), 'self' (the model's own draft heads, model/draft_heads.py)
  or `drafts.Model(draft_cfg)` with its `draft_params` proposes `draft_tokens` tokens per pass, which the model
  checks in one pass; the output follows this model's distribution exactly (greedy: its greedy tokens). When
  speculation is slower than plain decoding the loop decodes plainly and tries the draft again later
  (fallback.py): by default on measured time (eager calls; under your own jit on the backend's pass cost);
  `fallback_below` instead falls back below that many tokens per pass (0: never). `return_stats` returns (tokens,
  speculative.Stats) instead (`stats.describe(...)` is one line).
  """
  if params is None:
    raise ValueError("params is None; pass the model's params (from module.init, weights.load_params or a "
                     "checkpoint).")
  if not isinstance(cfg, ModelConfig):
    raise ValueError(f"cfg must be the model's ModelConfig, got a {type(cfg).__name__}; pass "
                     "ModelConfig.from_dict(section) for a config section or dict.")
  prompt_BxP = jnp.asarray(check_tokens(prompt_BxP, cfg.vocab_size, "prompt"), jnp.int32)
  batch, length = prompt_BxP.shape
  if length < 1:
    raise ValueError(f"generate needs prompts [batch, length >= 1], got shape {prompt_BxP.shape}: this model has "
                     "no BOS convention, so start from at least one real token (e.g. a newline byte).")
  count("max_new_tokens", max_new_tokens, 1, MAX_TOKENS - length - MAX_DRAFT_TOKENS)
  end = jnp.int32(-1 if end_token is None else count("end_token", end_token, 0, cfg.vocab_size - 1))
  key = _seed_key(rng)
  if draft is not None:
    count("draft_tokens", draft_tokens, 1, MAX_DRAFT_TOKENS)
  drafted = draft_for(draft, draft_params, cfg, draft_tokens)
  draft, draft_params = (None, None) if drafted is None else drafted
  options = Sampling(max_new_tokens, temperature, top_k, top_p, draft, draft_tokens, fallback_below)
  if draft is None and return_stats:
    raise ValueError("return_stats=True reports speculative decoding; pass a draft (e.g. draft='ngram').")
  check_cache_fits(cfg, batch, loop.cache_len(cfg, length, options), "max_new_tokens")
  params = unbox_params(params)
  if draft is not None and draft.reads_target:
    draft_params = params
  elif draft_params is not None:
    draft_params = unbox_params(draft_params)
  static = dataclasses.replace(options, fallback_below=None)  # the threshold is an argument: one program for all
  traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((params, prompt_BxP, key)))
  if draft is None or traced or fallback_below is not None:
    estimate = 1.0 if draft is None else fallback.pass_cost(batch, draft_tokens)
    threshold = estimate if fallback_below is None else fallback_below
    tokens, stats = _whole(params, draft_params, prompt_BxP, key, end, jnp.float32(threshold if draft else 0),
                           cfg=cfg, options=static, pass_cost=estimate)
  else:
    args = (params, draft_params, prompt_BxP, key, end)
    leaves, tree = jax.tree.flatten(args)
    compiled = _compiled(cfg, static, tree, tuple((leaf.shape, jnp.result_type(leaf)) for leaf in leaves))
    tokens, stats = Programs(cfg, static).run(compiled, *args)
  return (tokens, stats) if return_stats else tokens


@functools.lru_cache(maxsize=8)
def _compiled(cfg: ModelConfig, options: Sampling, tree, shapes: tuple) -> dict:
  """`Programs(cfg, options).compile` for arguments of this tree and these shapes, kept for the next call."""
  args = jax.tree.unflatten(tree, [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes])
  return Programs(cfg, options).compile(*args)
