"""A dense layer's matmul whose kernel gradient XLA:CPU runs in YNNPACK, not in a slow Eigen dot.

The kernel gradient of y = x W contracts the token axis of both x [T, D] and dy [T, F]. XLA:CPU may then copy dy to
[F, T] and run dot(x, dy^T) with the left operand contracted on its first axis: an Eigen dot at 79 GFLOP/s on the
2-core AMD VM against 190 for the same product in YNNPACK (the whole step:
benchmarks/results/dense_kernel_gradient.json).
On CPU, `dense_dot_general` computes that gradient from x^T materialised once (optimization_barrier keeps XLA from
folding the transpose back into the dot), so the product contracts its left operand's last axis. GPU and TPU
libraries take transposed operands at full speed, so there it is plain `lax.dot_general`.

It is a `jax.custom_vjp`, so on CPU these layers support reverse-mode differentiation only (jax.grad, jax.vjp),
not jax.jvp. Written as a `custom_jvp` instead, the transpose moves into the forward pass and the whole-step gain
is lost (1.01x against 1.06-1.08x for the peer-shape step, measured side by side).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax


def dense_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """`lax.dot_general` for DenseGeneral: inputs [..., *in] times kernel [*in, *out], the same values and gradients;
  on CPU the kernel gradient is taken as (x^T) dy. Other forms and backends go to `lax.dot_general` unchanged."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  n_in = len(lhs_contract)
  dense_form = (not lhs_batch and not rhs_batch and tuple(rhs_contract) == tuple(range(n_in))
                and tuple(lhs_contract) == tuple(range(lhs.ndim - n_in, lhs.ndim)))
  if not dense_form or jax.default_backend() != "cpu":
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  return _dense_matmul(lhs, rhs, n_in, precision, preferred_element_type)


def _forward(lhs, rhs, n_in, precision, preferred_element_type):
  dims = ((tuple(range(lhs.ndim - n_in, lhs.ndim)), tuple(range(n_in))), ((), ()))
  return lax.dot_general(lhs, rhs, dims, precision=precision, preferred_element_type=preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _dense_matmul(lhs, rhs, n_in, precision, preferred_element_type):
  return _forward(lhs, rhs, n_in, precision, preferred_element_type)


def _dense_matmul_fwd(lhs, rhs, n_in, precision, preferred_element_type):
  return _forward(lhs, rhs, n_in, precision, preferred_element_type), (lhs, rhs)


def _dense_matmul_bwd(n_in, precision, preferred_element_type, residuals, d_out):
  lhs, rhs = residuals
  _, lhs_vjp = jax.vjp(lambda x: _forward(x, rhs, n_in, precision, preferred_element_type), lhs)
  (d_lhs,) = lhs_vjp(d_out)
  tokens = math.prod(lhs.shape[:lhs.ndim - n_in])
  in_size, out_size = math.prod(rhs.shape[:n_in]), math.prod(rhs.shape[n_in:])
  lhs_t = lax.optimization_barrier(lhs.reshape(tokens, in_size).T)  # [in, T], transposed here in the backward pass
  d_rhs = jnp.matmul(lhs_t, d_out.reshape(tokens, out_size).astype(lhs.dtype), precision=precision,
                     preferred_element_type=preferred_element_type)
  return d_lhs, d_rhs.reshape(rhs.shape).astype(rhs.dtype)


_dense_matmul.defvjp(_dense_matmul_fwd, _dense_matmul_bwd)
