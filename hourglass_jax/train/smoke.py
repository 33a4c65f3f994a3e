"""A short single-device training run on the embedded corpus: the main job until the full trainer lands."""

import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tqdm import tqdm

from hourglass_jax.data.embedded import stdlib_bytes
from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model import counting


def _windows(corpus: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> np.ndarray:
  starts = rng.integers(0, len(corpus) - length - 1, size=batch)
  return np.stack([corpus[s:s + length + 1] for s in starts]).astype(np.int32)


def loss_fn(params, model, tokens_BxL1, dropout_rng, deterministic: bool):
  """Mean next-token cross-entropy in nats."""
  logits = model.apply({"params": params}, tokens_BxL1[:, :-1], deterministic=deterministic,
                       rngs={"dropout": dropout_rng})
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens_BxL1[:, 1:]).mean()


def train_smoke(cfg: ml_collections.ConfigDict, log=print) -> dict:
  """Trains `cfg.train.steps` steps with AdamW on the stdlib corpus; returns first/last train and eval loss."""
  model_cfg = ModelConfig.from_dict(cfg.model)
  model = build_model(model_cfg)
  seq_len, batch = cfg.data.seq_len, cfg.data.batch_size
  corpus = stdlib_bytes(max_bytes=4_000_000)
  split = int(len(corpus) * 0.95)
  train_corpus, eval_corpus = corpus[:split], corpus[split:]
  if len(eval_corpus) <= seq_len + 1:
    raise ValueError(f"data.seq_len={seq_len} is longer than the held-out corpus ({len(eval_corpus)} bytes).")
  log(f"model: {model_cfg.kind} {model_cfg.hierarchy}, {counting.total_params(model_cfg):,} params, "
      f"{3 * counting.forward_flops(model_cfg, seq_len) * batch / 1e9:.2f} GFLOPs per train step")

  rng = jax.random.key(cfg.train.seed)
  params = jax.jit(model.init)(rng, jnp.zeros((1, seq_len), jnp.int32))["params"]
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.train.learning_rate, cfg.train.warmup_steps,
                                                max(cfg.train.steps, cfg.train.warmup_steps + 1))
  optimizer = optax.chain(optax.clip_by_global_norm(cfg.train.grad_clip_norm),
                          optax.adamw(schedule, b1=cfg.train.b1, b2=cfg.train.b2, eps=cfg.train.eps,
                                      weight_decay=cfg.train.weight_decay))
  opt_state = optimizer.init(params)

  @jax.jit
  def train_step(params, opt_state, tokens, step_rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, model, tokens, step_rng, False)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  eval_loss = jax.jit(lambda p, t: loss_fn(p, model, t, rng, True))
  data_rng = np.random.default_rng(cfg.train.seed)
  eval_batch = _windows(eval_corpus, np.random.default_rng(1), batch, seq_len)
  first_eval = float(eval_loss(params, eval_batch))
  losses, start = [], time.perf_counter()
  with tqdm(range(cfg.train.steps), desc="train", unit="step") as bar:
    for step in bar:
      if step == 1:
        start = time.perf_counter()  # exclude the first step's compile from throughput
      tokens = _windows(train_corpus, data_rng, batch, seq_len)
      params, opt_state, loss = train_step(params, opt_state, tokens, jax.random.fold_in(rng, step))
      losses.append(loss)
      if step % cfg.train.log_every == 0 or step == cfg.train.steps - 1:
        value = float(losses[-1])
        if not math.isfinite(value):
          raise FloatingPointError(f"loss became {value} at step {step}; lower train.learning_rate.")
        bar.set_postfix(loss=f"{value:.3f}", bits_per_byte=f"{value / math.log(2):.3f}")
  elapsed = time.perf_counter() - start
  last_eval = float(eval_loss(params, eval_batch))
  result = dict(first_train_loss=float(losses[0]), last_train_loss=float(losses[-1]), first_eval_loss=first_eval,
                last_eval_loss=last_eval, tokens_per_second=max(cfg.train.steps - 1, 1) * batch * seq_len / elapsed)
  log(f"eval bits/byte {first_eval / math.log(2):.3f} -> {last_eval / math.log(2):.3f}; "
      f"{result['tokens_per_second']:,.0f} tokens/s")
  return result
