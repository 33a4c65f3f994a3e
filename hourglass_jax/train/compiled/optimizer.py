"""AdamW with global-norm clipping and a warmup + decay schedule, all from the `train` section (TrainSettings)."""

import jax
import jax.numpy as jnp
import optax

from hourglass_jax.config.train_settings import TrainSettings

DECAYED = ("kernel", "embedding")  # norms, biases and attention position biases are not decayed


def make_schedule(train: TrainSettings) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then cosine (to min_lr_ratio * lr), rsqrt or constant."""
  lr, warmup, steps = train.learning_rate, train.warmup_steps, train.steps
  if train.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1),
                                              end_value=lr * train.min_lr_ratio)
  if train.schedule == "rsqrt":
    scale = max(warmup, 1)
    decay = lambda count: lr * jnp.sqrt(scale / jnp.maximum(count + scale, 1))
  else:
    decay = optax.constant_schedule(lr)
  if not warmup:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def _leaf_name(path) -> str:
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  return names[-1] if names else ""


def decay_mask(params):
  """True for matrices (Dense kernels, embeddings), False for norm scales and biases."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _leaf_name(path) in DECAYED, params)


def make_optimizer(train: TrainSettings) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule): clip_by_global_norm -> AdamW(b1, b2, eps, masked weight decay)."""
  schedule = make_schedule(train)
  adamw = optax.adamw(schedule, b1=train.b1, b2=train.b2, eps=train.eps,
                      weight_decay=train.weight_decay, mask=decay_mask)
  if train.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train.grad_clip_norm), adamw), schedule
  return adamw, schedule
