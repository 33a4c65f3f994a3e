"""dense_dot_general: DenseGeneral's matmul with the same values and gradients as lax.dot_general, whose kernel
gradient on CPU contracts its left operand's last axis (the form XLA:CPU runs in YNNPACK)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hourglass_jax import nn as hnn
from hourglass_jax.ops.weight_gradient import dense_dot_general

# (input shape, kernel shape, contracted input axes): DenseGeneral's forms in the library (MLP, q/k/v, attention out).
FORMS = {"matrix": ((2, 5, 6), (6, 7), 1), "to_heads": ((2, 5, 6), (6, 3, 4), 1),
         "from_heads": ((2, 5, 3, 4), (3, 4, 6), 2), "no_tokens": ((2, 0, 6), (6, 7), 1)}


def _operands(x_shape, w_shape, dtype=jnp.float32):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.normal(size=x_shape), dtype), jnp.asarray(rng.normal(size=w_shape), dtype))


def _dims(x_ndim: int, n_in: int):
  return ((tuple(range(x_ndim - n_in, x_ndim)), tuple(range(n_in))), ((), ()))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_values_and_gradients_equal_lax_dot_general(form, dtype, tol):
  x_shape, w_shape, n_in = FORMS[form]
  x, w = _operands(x_shape, w_shape, dtype)
  dims = _dims(len(x_shape), n_in)
  loss = lambda x, w, dot: jnp.sum(jnp.sin(dot(x, w, dims).astype(jnp.float32)))
  expected = jax.value_and_grad(loss, (0, 1))(x, w, lax.dot_general)
  got = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnums=2)(x, w, dense_dot_general)
  for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
    assert g.dtype == e.dtype and g.shape == e.shape
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dims", [(((2,), (1,)), ((0,), (0,))), (((1,), (0,)), ((), ()))], ids=["batched", "middle"])
def test_other_dot_forms_are_plain_lax_dot_general(dims):
  x, w = _operands((2, 6, 5), (2, 5, 6) if dims[1][0] else (6, 3))
  jaxpr = str(jax.make_jaxpr(lambda x, w: dense_dot_general(x, w, dims))(x, w))
  assert "custom_vjp" not in jaxpr and "dot_general" in jaxpr
  np.testing.assert_array_equal(dense_dot_general(x, w, dims), lax.dot_general(x, w, dims))


def test_every_decoder_matmul_gradient_contracts_its_left_operands_last_axis():
  """The transformer's kernel gradients (x^T dy) are taken on x^T materialised: with the transposed operand folded
  into the dot instead, XLA:CPU runs them as Eigen dots at 44-79 GFLOP/s against 100-190 in YNNPACK."""
  stack = hnn.DecoderStack(num_layers=2, num_heads=4, d_ff=64)
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 16, 32)), jnp.float32)
  variables = stack.init(jax.random.key(0), x)
  grad = jax.jit(jax.grad(lambda v: jnp.sum(stack.apply(v, x) ** 2)))
  hlo = grad.lower(variables).compile().as_text()
  matrix_dots = re.findall(r"= f32\[\d+,\d+\]\{1,0\} dot\([^)]*\), lhs_contracting_dims=\{(\d+)\}", hlo)
  assert len(matrix_dots) >= 12  # per block: 4 projections and 2 MLP matmuls, each with a kernel gradient
  assert set(matrix_dots) == {"1"}
