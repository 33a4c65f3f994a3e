"""The train state (step, params, optimizer state, dropout key) and its sharded creation."""

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from hourglass_jax.runtime import sharding


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint holds besides the data position. `rng` is raw key data (uint32), so it saves."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def make_init_fn(model: nn.Module, optimizer: optax.GradientTransformation | None, seq_len: int,
                 seed: int) -> Callable[[], Any]:
  """A no-argument function building the (logically annotated) initial state from `seed`; without an optimizer,
  the params alone (what evaluation and sampling restore)."""

  def init():
    params_key, dropout_key = jax.random.split(jax.random.key(seed))
    params = model.init(params_key, jnp.zeros((1, seq_len), jnp.int32))["params"]
    if optimizer is None:
      return params
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                      rng=jax.random.key_data(dropout_key))

  return init


def unbox(tree):
  """Drops the logical-axis boxes, keeping the values."""
  return jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x, tree,
                      is_leaf=lambda x: isinstance(x, nn.Partitioned))


def state_layout(init_fn: Callable[[], Any], mesh, rules) -> tuple[Any, Any]:
  """(abstract state (or params) with shardings attached, shardings), from shapes alone; checks every split
  divides."""
  boxed = jax.eval_shape(init_fn)
  shardings = sharding.tree_shardings(boxed, mesh, rules)
  if isinstance(boxed, TrainState):
    sharding.check_divisible(boxed.params, shardings.params)
  else:
    sharding.check_divisible(boxed, shardings)
  shapes = unbox(boxed)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
  return abstract, shardings


def create_state(init_fn: Callable[[], TrainState], shardings: TrainState) -> TrainState:
  """The initial state, each array created directly in its shards."""
  return jax.jit(lambda: unbox(init_fn()), out_shardings=shardings)()
