"""Sampling from params on a mesh: the one generation path of `hourglass-sample` (cli/sample.py) and the trainer's
end-of-run sample (train/loop/loop.py).

Both run model/decode/sampling.py's `generate` (the decode loop of model/decode/loop.py: a parallel prefill, then
KV-cached decode steps or speculative passes) the same way: the prompts padded to, and sharded over, the
data-parallel devices like a training batch, the params in their training shardings (fsdp / tensor parallel
included) and the tokens replicated, so every process of a multi-host run feeds its own rows, runs the same program
with the same seed and gets the same tokens back."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import ModelConfig
from hourglass_jax.model.decode import sampling, speculative
from hourglass_jax.runtime import compile_cache, sharding, xla_options


def byte_prompts(prompt: bytes, num_samples: int, vocab_size: int) -> np.ndarray:
  """`num_samples` copies of a byte prompt, int32 [num_samples, len(prompt)]."""
  if not prompt:
    raise ValueError("the prompt is empty, but text models have no start (BOS) token: every prediction is "
                     "conditioned on real bytes. Give at least one byte, e.g. --prompt=$'\\n' or --prompt='The '.")
  if vocab_size < 256:
    raise ValueError(f"model.vocab_size={vocab_size} cannot hold byte prompts; sample a byte-level model "
                     "(vocab_size 256).")
  return np.tile(np.frombuffer(prompt, np.uint8).astype(np.int32), (num_samples, 1))


def texts(prompt: bytes, tokens_NxT: np.ndarray, end_byte: int | None = None) -> list[bytes]:
  """Each row of sampled tokens as bytes after `prompt`, cut after its first `end_byte` (kept); ids >= 256 (none
  in a byte vocabulary) are dropped."""
  out = []
  for row in np.asarray(tokens_NxT):
    row = [int(t) for t in row]
    if end_byte is not None and end_byte in row:
      row = row[:row.index(end_byte) + 1]
    out.append(prompt + bytes(t for t in row if 0 <= t < 256))
  return out


@dataclasses.dataclass(frozen=True)
class Generated:
  """tokens: int32 [N, max_new_tokens] (on every process); seconds: running the compiled program;
  compile_seconds and cache: compiling it, and the persistent compilation cache's hits and misses meanwhile;
  speculation: what speculative decoding did (None without a draft)."""
  tokens: np.ndarray
  seconds: float
  compile_seconds: float
  cache: compile_cache.Counts
  speculation: speculative.Stats | None = None


def generate_on_mesh(params, param_shardings, cfg: ModelConfig, prompts_NxP, mesh: jax.sharding.Mesh, rules, *,
                     max_new_tokens: int, seed: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     end_token: int | None = None, draft=None, draft_params=None, draft_tokens: int = 4,
                     fallback_below: float | None = None) -> Generated:
  """`sampling.generate` for host prompts [N, P] with params sharded as `param_shardings` on `mesh` (`rules`: the
  logical axis rules, for the batch sharding); a draft model's `draft_params` are replicated. Call it on every
  process with the same arguments. With a draft and `fallback_below` None, a single process decides when to
  speculate on measured time (the loop's programs compiled apart and run in timed windows); several processes,
  which must take the same decisions, on the backend's estimated pass cost (model/decode/fallback.py)."""
  prompts_NxP = np.asarray(prompts_NxP, np.int32)
  if prompts_NxP.ndim != 2 or not prompts_NxP.size:
    raise ValueError(f"prompts must be [samples >= 1, length >= 1], got shape {prompts_NxP.shape}.")
  num = len(prompts_NxP)
  batch_sharding = sharding.batch_sharding(mesh, rules)
  parallel = sharding.batch_parallelism(mesh, rules)
  rows = -(-num // parallel) * parallel
  padded = np.concatenate([prompts_NxP, np.repeat(prompts_NxP[-1:], rows - num, axis=0)])
  drafted = sampling.draft_for(draft, draft_params, cfg, draft_tokens)
  measured = drafted is not None and fallback_below is None and jax.process_count() == 1
  options = sampling.Sampling(max_new_tokens, temperature, top_k, top_p, None if drafted is None else drafted[0],
                              draft_tokens)
  speculating = draft is not None

  def run(params, draft_params, prompt_BxP, rng):
    return sampling.generate(params, cfg, prompt_BxP, max_new_tokens=max_new_tokens, rng=rng,
                             temperature=temperature, top_k=top_k, top_p=top_p, end_token=end_token, draft=draft,
                             draft_params=draft_params, draft_tokens=draft_tokens, fallback_below=fallback_below,
                             return_stats=speculating)

  with jax.set_mesh(mesh):
    lo, hi = sharding.process_rows(batch_sharding, rows, padded.shape[1:])
    prompt_BxP = jax.make_array_from_process_local_data(batch_sharding, padded[lo:hi], padded.shape)
    draft_params = None if draft_params is None else jax.device_put(draft_params, sharding.replicated(mesh))
    rng = jax.random.key(seed)
    end = jnp.int32(-1 if end_token is None else end_token)
    compiler_options = xla_options.compiler_options(cfg.dtype, mesh.devices.flat[0].platform)
    cache, begin = compile_cache.counts(), time.perf_counter()
    if measured:
      programs = sampling.Programs(cfg, options, in_shardings=(param_shardings, None, batch_sharding, None),
                                   out_sharding=sharding.replicated(mesh))
      target = params if drafted[0].reads_target else draft_params
      compiled = programs.compile(params, target, prompt_BxP, rng, end, compiler_options)
    else:
      program = jax.jit(run, in_shardings=(param_shardings, None, batch_sharding, None),
                        out_shardings=sharding.replicated(mesh)).lower(params, draft_params, prompt_BxP,
                                                                       rng).compile(compiler_options)
    compiled_seconds, cache = time.perf_counter() - begin, compile_cache.counts() - cache
    begin = time.perf_counter()
    if measured:
      out = programs.run(compiled, params, target, prompt_BxP, rng, end, to_host=sharding.to_host)
    else:
      out = program(params, draft_params, prompt_BxP, rng)
    tokens, stats = out if speculating else (out, None)
    tokens = sharding.to_host(tokens)[:num]
    seconds = time.perf_counter() - begin
  if stats is not None:  # the padding rows' counts dropped
    stats = sharding.to_host(stats)
    stats = dataclasses.replace(stats, generated_B=stats.generated_B[:num], kept_B=stats.kept_B[:num],
                                drafted_B=stats.drafted_B[:num], passes_B=stats.passes_B[:num])
  return Generated(tokens=tokens, seconds=seconds, compile_seconds=compiled_seconds, cache=cache, speculation=stats)
