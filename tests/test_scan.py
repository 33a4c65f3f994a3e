"""Scanned stacks: one compiled block per stack whatever the depth, and the same function (dropout included)
whether the scan is unrolled or not, with or without rematerialisation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import build_model
from tests.helpers import small_config

MULTISCALE = dict(scales="4,2,1", heads_per_scale="1,1,2")
CASES = {
    "hourglass": small_config(hierarchy="1@1 3@3 1@1", shorten="attention_avg", upsample="attention_repeat"),
    "vanilla": small_config(kind="vanilla", hierarchy="3@1"),
    "retina": small_config(kind="retina", hierarchy="3@1", retina_windows="0:2,2:6,6:12", **MULTISCALE),
}
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 12)), jnp.int32)


def loss_and_grads(cfg, params):
  def loss(params):
    logits = build_model(cfg).apply({"params": params}, TOKENS, deterministic=False,
                                    rngs={"dropout": jax.random.key(7)})
    return jnp.mean(logits ** 2)

  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("kind", [pytest.param("hourglass", marks=pytest.mark.slow), "retina"])
def test_unrolling_and_remat_keep_the_function_and_the_dropout_keys(kind):
  cfg = dataclasses.replace(CASES[kind], dropout=0.2)
  params = jax.jit(build_model(cfg).init)(jax.random.key(0), TOKENS)["params"]
  loss, grads = loss_and_grads(cfg, params)
  # Each option against the plain scan, two options per compiled program (a compile is most of the test's time).
  for variant in (dict(remat_policy="dots_saveable", scan_unroll=0), dict(remat_policy="nothing_saveable",
                                                                           scan_unroll=2)):
    loss_v, grads_v = loss_and_grads(dataclasses.replace(cfg, **variant), params)
    np.testing.assert_allclose(loss_v, loss, rtol=1e-5, err_msg=str(variant))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=str(variant)),
                 grads_v, grads)


def test_blocks_of_a_stack_get_their_own_params():
  params = build_model(CASES["vanilla"]).init(jax.random.key(0), TOKENS)["params"]
  kernel = params["body"]["layers"]["blocks"]["mlp"]["wi"]["kernel"]
  assert kernel.names[0] == "layers" and kernel.value.shape[0] == 3
  assert not np.allclose(kernel.value[0], kernel.value[1])


def dot_count(cfg) -> int:
  params = jax.eval_shape(build_model(cfg).init, jax.random.key(0), TOKENS)["params"]
  text = jax.jit(lambda p: loss_and_grads(cfg, p)).lower(params).as_text()
  return text.count("dot_general")


def test_the_compiled_program_does_not_grow_with_depth():
  shallow = small_config(hierarchy="1@1 1@3 1@1")
  deep = small_config(hierarchy="3@1 4@3 3@1")
  assert dot_count(deep) == dot_count(shallow)
  assert dot_count(dataclasses.replace(deep, scan_unroll=0)) > 2 * dot_count(shallow)
