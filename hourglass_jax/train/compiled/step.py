"""The pure train step: next-byte cross-entropy, gradient accumulation over micro-batches, AdamW update."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from hourglass_jax.train.compiled.state import TrainState


def token_losses_and_sown(model, params, tokens_BxL1, rules, *, rng=None):
  """(per-token cross-entropy in nats [B, L] of predicting tokens[:, 1:] from tokens[:, :-1], the auxiliary loss
  (the sum of everything the model sowed into 'losses'; None when nothing), {name: mean of what it sowed into
  'metrics'}), names being the sowing module's path ('body/shorten/boundary_rate')."""
  deterministic = rng is None
  with nn.logical_axis_rules(rules):
    tokens_BxL1 = nn.with_logical_constraint(tokens_BxL1, ("batch", None))
    logits_BxLxV, sown = model.apply({"params": params}, tokens_BxL1[:, :-1], deterministic=deterministic,
                                     rngs=None if deterministic else {"dropout": rng}, mutable=["losses", "metrics"])
  sown_losses = [jnp.sum(jnp.stack(v)) for v in traverse_util.flatten_dict(sown.get("losses", {})).values()]
  aux_loss = sum(sown_losses[1:], sown_losses[0]) if sown_losses else None
  metrics = {name: jnp.mean(jnp.stack(values))
             for name, values in traverse_util.flatten_dict(sown.get("metrics", {}), sep="/").items()}
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, tokens_BxL1[:, 1:]), aux_loss, metrics


def make_train_step(model, optimizer, schedule, rules, accum_steps: int = 1):
  """`train_step(state, tokens_BxL1) -> (state, metrics)`; with accumulation, the batch is split into
  `accum_steps` strided micro-batches (row i goes to micro-batch i % accum_steps) whose gradients are averaged.
  The gradient is that of the LM loss plus the model's auxiliary losses; metrics report them apart ('loss' stays
  the LM loss, 'aux_loss'), with what the model sowed into 'metrics' under its module path."""

  def loss_fn(params, tokens_BxL1, rng):
    losses_BxL, aux_loss, sown = token_losses_and_sown(model, params, tokens_BxL1, rules, rng=rng)
    lm_loss = losses_BxL.mean()
    if aux_loss is None:
      return lm_loss, (lm_loss, sown)
    return lm_loss + aux_loss, (lm_loss, dict(sown, aux_loss=aux_loss))

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def train_step(state: TrainState, tokens_BxL1):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    if accum_steps == 1:
      (_, (loss, extra)), grads = grad_fn(state.params, tokens_BxL1, rng)
    else:
      batch, width = tokens_BxL1.shape
      micro_AxMxL1 = tokens_BxL1.reshape(batch // accum_steps, accum_steps, width).swapaxes(0, 1)

      def accumulate(carry, inputs):
        index, tokens_MxL1 = inputs
        (_, (loss, extra)), grads = grad_fn(state.params, tokens_MxL1, jax.random.fold_in(rng, index))
        return jax.tree.map(jnp.add, carry, (loss, extra, grads)), None

      extra_shapes = jax.eval_shape(grad_fn, state.params, micro_AxMxL1[0], rng)[0][1][1]
      zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                           (jax.ShapeDtypeStruct((), jnp.float32), extra_shapes, state.params))
      (loss, extra, grads), _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), micro_AxMxL1))
      loss, extra, grads = jax.tree.map(lambda x: x / accum_steps, (loss, extra, grads))
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state)
    return new_state, dict(extra, loss=loss, grad_norm=optax.tree.norm(grads),
                           update_norm=optax.tree.norm(updates), learning_rate=schedule(state.step))

  return train_step

