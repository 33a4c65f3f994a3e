"""A small end-of-training sampler: fills one fixed-length window token by token (no cache; cached decoding is
the generation module's job)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax import sharding


def sample_bytes(trainer, params, prompt: bytes, num_bytes: int, seed: int = 0,
                 temperature: float = 0.8) -> bytes:
  """Continues `prompt` by up to `num_bytes` bytes within one data.seq_len window (one row per batch shard)."""
  length = trainer.seq_len
  prompt = prompt[-(length - 1):]
  start, steps = len(prompt), min(num_bytes, length - len(prompt))
  rows = sharding.batch_parallelism(trainer.mesh, trainer.rules)
  tokens_BxL = np.zeros((rows, length), np.int32)
  tokens_BxL[:, :start] = np.frombuffer(prompt, np.uint8)

  def generate(params, tokens_BxL, rng):
    def body(t, carry):
      tokens_BxL, rng = carry
      rng, key = jax.random.split(rng)
      with nn.logical_axis_rules(trainer.rules):
        logits_BxLxV = trainer.model.apply({"params": params}, tokens_BxL)
      next_B = jax.random.categorical(key, logits_BxLxV[:, t - 1] / temperature)
      return tokens_BxL.at[:, t].set(next_B.astype(jnp.int32)), rng

    return jax.lax.fori_loop(start, start + steps, body, (tokens_BxL, rng))[0]

  generate = jax.jit(generate, in_shardings=(trainer.shardings.params, trainer.batch_sharding, None),
                     out_shardings=sharding.replicated(trainer.mesh))
  lo, hi = sharding.process_rows(trainer.batch_sharding, rows, (length,))
  tokens = jax.make_array_from_process_local_data(trainer.batch_sharding, tokens_BxL[lo:hi], (rows, length))
  out_BxL = np.asarray(generate(params, tokens, jax.random.key(seed)).addressable_shards[0].data)
  return bytes(out_BxL[0, start:start + steps].astype(np.uint8))
