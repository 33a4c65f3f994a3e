"""AdamW with global-norm clipping and a warmup + decay schedule, all from the `train` config section."""

import jax
import jax.numpy as jnp
import optax

DECAYED = ("kernel", "embedding")  # norms, biases and attention position biases are not decayed


def make_schedule(train_cfg) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then cosine (to min_lr_ratio * lr), rsqrt or constant."""
  lr, warmup, steps = train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.steps
  if train_cfg.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1),
                                              end_value=lr * train_cfg.min_lr_ratio)
  if train_cfg.schedule == "rsqrt":
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


def make_optimizer(train_cfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule): clip_by_global_norm -> AdamW(b1, b2, eps, masked weight decay)."""
  schedule = make_schedule(train_cfg)
  adamw = optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                      weight_decay=train_cfg.weight_decay, mask=decay_mask)
  if train_cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(train_cfg.grad_clip_norm), adamw), schedule
  return adamw, schedule
