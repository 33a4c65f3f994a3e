import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.layers import causal_mask
from hourglass_jax.model.positions import relative_distance_index
from hourglass_jax.model.resampling import shorten_mask, upsample_mask
from hourglass_jax.model.multiscale.attention import retina_mask
from hourglass_jax.ops import block_attention as ba
from hourglass_jax.ops.attention import dot_product_attention, reference_attention, resolve_implementation
from tests.helpers import mix32_numpy, qkv

# (T, S, mask, query positions, key positions): several blocks of at most 8, lengths not all multiples of 8.
CASES = {
    "none": (37, 29, None, np.arange(37), np.arange(29)),
    "causal": (40, 40, causal_mask(40), np.arange(40), np.arange(40)),
    "shorten": (14, 42, shorten_mask(42, 3), np.arange(14) * 3, np.arange(42) - 2),
    "upsample": (42, 14, upsample_mask(42, 3), np.arange(42), np.arange(14) * 3),
    "retina": (40, 20, retina_mask(40, 2, 3, 12), np.arange(40), np.arange(20) * 2),
}
BLOCK = dict(block_q=8, block_k=8)


def _bias(kind, t, s, mask, pos_q, pos_k, b=2, n=3):
  rng = np.random.default_rng(1)
  if kind == "full":
    return jnp.asarray(rng.normal(size=(1, n, t, s)), jnp.float32)
  if kind == "relative":
    distances_R, index_TxS = relative_distance_index(pos_q, pos_k, mask)
    return jnp.asarray(rng.normal(size=(b, n, t, len(distances_R))), jnp.float32), index_TxS
  return None


def _loss_and_grads(fn, q, k, v, bias, rows_T):
  """Output and d/d(q, k, v, bias) of a non-linear loss over the rows the mask leaves non-empty."""
  def loss(q, k, v, bias):
    out = fn(q, k, v, bias) * rows_T[None, :, None, None]
    return jnp.sum(out * jnp.cos(out)), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, bias)
  return out, grads


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bias_kind,dropout", [(None, 0.0), ("full", 0.0), ("relative", 0.3)])
def test_block_matches_reference_values_and_gradients(case, bias_kind, dropout, key_impl="rbg"):
  """Outputs and gradients (q, k, v, bias) against the einsum reference; dropout with the same keep mask
  ('rbg' keys here: threefry takes seconds to compile on CPU; the default keys are checked once below)."""
  t, s, mask, pos_q, pos_k = CASES[case]
  q, k, v = qkv(t, s)
  bias = _bias(bias_kind, t, s, mask, pos_q, pos_k)
  rng = jax.random.key(7, impl=key_impl)
  keep = ba.dropout_keep_mask(rng, dropout, 2, 3, t, s, **BLOCK) if dropout else None
  rows = np.ones(t, bool) if mask is None else mask.any(1)
  index = bias[1] if isinstance(bias, tuple) else None
  wrap = (lambda p: (p, index)) if index is not None else (lambda p: p)
  block = lambda q, k, v, p: ba.block_attention(q, k, v, mask, None if p is None else wrap(p), dropout_rate=dropout,
                                                dropout_rng=rng, **BLOCK)
  ref = lambda q, k, v, p: reference_attention(q, k, v, mask, None if p is None else wrap(p), dropout_rate=dropout,
                                               dropout_mask=keep)
  p = bias[0] if isinstance(bias, tuple) else bias
  out_block, g_block = _loss_and_grads(block, q, k, v, p, rows)
  out_ref, g_ref = _loss_and_grads(ref, q, k, v, p, rows)
  np.testing.assert_allclose(out_block, out_ref, atol=1e-5, rtol=1e-5)
  for name, a, b in zip("qkvb", g_block, g_ref):
    if b is not None:
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4, err_msg=f"d{name}")
  if dropout:  # the dropout really drops: the undropped output differs
    assert not np.allclose(out_block, reference_attention(q, k, v, mask, None if p is None else wrap(p)) * rows[
        None, :, None, None], atol=1e-3)


@pytest.mark.parametrize("bias_kind,key_impl", [(None, "rbg"), ("relative", None)])
def test_causal_dropout_without_bias_and_with_default_keys(bias_kind, key_impl):
  test_block_matches_reference_values_and_gradients("causal", bias_kind, 0.2, key_impl=key_impl)


def test_empty_rows_return_zero_and_send_no_gradient():
  t, s, mask, *_ = CASES["retina"]
  empty = ~mask.any(1)
  assert empty.any() and not empty.all()
  q, k, v = qkv(t, s)
  out = ba.block_attention(q, k, v, mask, **BLOCK)
  np.testing.assert_array_equal(out[:, empty], 0.0)
  dq = jax.grad(lambda q: ba.block_attention(q, k, v, mask, **BLOCK).sum())(q)
  np.testing.assert_array_equal(dq[:, empty], 0.0)
  assert np.all(np.isfinite(dq))


def _equations(jaxpr):
  """Every equation of a jaxpr, nested ones (custom_vjp, pjit) included, not descending into scans."""
  for e in jaxpr.eqns:
    yield e
    if e.primitive.name != "scan":
      for value in e.params.values():
        inner = getattr(value, "jaxpr", value)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


@pytest.mark.parametrize("n", [4, 5, 16])
def test_causal_plan_computes_only_the_lower_triangle_of_blocks(n):
  length = 8 * n
  plan = ba.make_plan(causal_mask(length), length, length, 8, 8)
  assert plan.num_pairs == n * (n + 1) // 2
  rounds, lanes = plan.q_blocks.shape
  assert rounds * lanes == n * (n + 1) // 2  # lanes pair block i with block n-1-i: no idle slot
  real = plan.q_blocks < plan.nq
  assert np.all(plan.k_blocks[real] <= plan.q_blocks[real])  # nothing above the diagonal
  pairs = set(zip(plan.q_blocks[real], plan.k_blocks[real]))
  assert len(pairs) == plan.num_pairs
  for r in range(rounds):  # a q block appears at most once per round (its statistics update is one set)
    assert len(set(plan.q_blocks[r][real[r]])) == real[r].sum()
  partial = plan.mask_ids[real] != 0
  assert partial.sum() == n  # only the diagonal blocks apply a mask
  np.testing.assert_array_equal(plan.masks[0], True)
  # The traced program: one scan of `rounds` steps, whose logits hold `lanes` blocks of 8 x 8.
  q, k, v = qkv(length, length, b=1, n=1)
  jaxpr = jax.make_jaxpr(lambda q, k, v: ba.block_attention(q, k, v, causal_mask(length), **BLOCK))(q, k, v)
  scans = [e for e in _equations(jaxpr.jaxpr) if e.primitive.name == "scan"]
  assert [e.params["length"] for e in scans] == [rounds]
  dots = [e for e in scans[0].params["jaxpr"].jaxpr.eqns if e.primitive.name == "dot_general"]
  assert dots[0].outvars[0].aval.shape == (lanes, 1, 1, 8, 8)


@pytest.mark.parametrize("case", ["shorten", "upsample", "retina"])
def test_plan_skips_every_hidden_block(case):
  t, s, mask, *_ = CASES[case]
  plan = ba.make_plan(mask, t, s, 8, 8)
  assert plan.bq * plan.nq - t < plan.nq and plan.bk * plan.nk - s < plan.nk  # padding < one row per block
  padded = np.zeros((plan.nq * plan.bq, plan.nk * plan.bk), bool)
  padded[:t, :s] = mask
  visible = padded.reshape(plan.nq, plan.bq, plan.nk, plan.bk).any((1, 3))
  real = plan.q_blocks < plan.nq
  assert plan.num_pairs == visible.sum() == real.sum() < plan.nq * plan.nk
  assert set(zip(plan.q_blocks[real], plan.k_blocks[real])) == set(zip(*np.nonzero(visible)))


def test_bfloat16_matches_float32_reference_loosely():
  t, s, mask = 35, 35, causal_mask(35)
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(t, s, h=16))
  block = lambda q, k, v, _: ba.block_attention(q, k, v, mask, **BLOCK)
  out, grads = _loss_and_grads(block, q, k, v, None, np.ones(t, bool))
  assert out.dtype == jnp.bfloat16
  ref, ref_grads = _loss_and_grads(lambda q, k, v, _: reference_attention(q, k, v, mask), *(
      x.astype(jnp.float32) for x in (q, k, v)), None, np.ones(t, bool))
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=2e-2)
  for a, b in zip(grads[:3], ref_grads[:3]):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=5e-2)


def test_block_sizes_need_not_match_or_divide_the_lengths():
  t, s, mask, *_ = CASES["upsample"]
  q, k, v = qkv(t, s)
  ref = reference_attention(q, k, v, mask)
  for bq, bk in ((16, 4), (5, 3), (64, 64)):
    np.testing.assert_allclose(ba.block_attention(q, k, v, mask, block_q=bq, block_k=bk), ref, atol=1e-5)


def test_dropout_keep_mask_is_blockwise_seeded_and_keeps_one_minus_rate():
  keep = ba.dropout_keep_mask(jax.random.key(0), 0.25, 2, 3, 40, 36, 8, 8)
  assert keep.shape == (2, 3, 40, 36) and keep.dtype == jnp.bool_
  assert abs(float(keep.mean()) - 0.75) < 0.02
  again = ba.dropout_keep_mask(jax.random.key(0), 0.25, 2, 3, 40, 36, 8, 8)
  other = ba.dropout_keep_mask(jax.random.key(1), 0.25, 2, 3, 40, 36, 8, 8)
  np.testing.assert_array_equal(keep, again)
  assert not np.array_equal(keep, other)
  # Pair (1, 2) of the 5 x 5 blocks (6 x 5 seeds with the spare q block): its seed hashed with each counter.
  seed = np.asarray(jax.random.bits(jax.random.key(0), (6 * 5,), jnp.uint32))[1 * 5 + 2]
  words = mix32_numpy(mix32_numpy(np.arange(2 * 3 * 8 * 4, dtype=np.uint32)) ^ seed).reshape(2, 3, 8, 4)
  halves = words[..., None] >> np.array([0, 16], np.uint32) & 0xFFFF  # little-endian 16-bit halves
  np.testing.assert_array_equal(keep[:, :, 8:16, 16:24], halves.reshape(2, 3, 8, 8) < 49152)


def test_dropout_masks_of_different_blocks_are_independent():
  """Each block's mask agrees with another block's, or with a shifted copy of it, at the chance rate
  p^2 + (1-p)^2, and every row, column and head keeps about 1 - rate."""
  keep = np.asarray(ba.dropout_keep_mask(jax.random.key(3), 0.5, 4, 8, 256, 256, 128, 128))
  blocks = [keep[..., i:i + 128, j:j + 128].ravel() for i in (0, 128) for j in (0, 128)]
  for a in range(4):
    for b in range(a + 1, 4):
      for shift in (0, 1, 64, 2048):
        assert abs(float(np.mean(blocks[a] == np.roll(blocks[b], shift))) - 0.5) < 0.01, (a, b, shift)
  for axis in (0, 1, 2, 3):
    means = keep.mean(axis=tuple(x for x in range(4) if x != axis))
    assert np.all(np.abs(means - 0.5) < 0.03), axis


def test_dispatcher_runs_block_and_materialises_the_relative_bias_elsewhere():
  t, s, mask, pos_q, pos_k = CASES["shorten"]
  q, k, v = qkv(t, s)
  bias = _bias("relative", t, s, mask, pos_q, pos_k)
  block = dot_product_attention(q, k, v, mask, bias, impl="block")
  np.testing.assert_array_equal(block, ba.block_attention(q, k, v, mask, bias))
  for impl in ("xla", "reference"):
    np.testing.assert_allclose(dot_product_attention(q, k, v, mask, bias, impl=impl), block, atol=1e-5)
  np.testing.assert_allclose(dot_product_attention(q, k, v, mask, ba.materialize_bias(bias), impl="xla"), block,
                             atol=1e-5)
  common = dict(dtype=jnp.float32, has_bias=True, has_dropout=True, lengths=(t, s))
  assert resolve_implementation("block", static_mask=True, **common) == "block"
  assert resolve_implementation("auto", static_mask=True, **common) == "reference"
  with pytest.raises(ValueError, match="numpy mask"):
    resolve_implementation("block", static_mask=False, **common)


def test_block_attention_pays_rule():
  assert ba.block_attention_pays(causal_mask(1024), 1024, 1024)
  assert ba.block_attention_pays(shorten_mask(2046, 3), 682, 2046)
  assert not ba.block_attention_pays(causal_mask(128), 128, 128)  # one block: nothing skipped
  assert not ba.block_attention_pays(None, 1024, 1024)
  assert not ba.block_attention_pays(jnp.asarray(causal_mask(1024)), 1024, 1024)  # no static plan


def test_benchmark_runs_at_tiny_sizes(tmp_path):
  from benchmarks import block_attention as bench
  record = bench.main(["--cases", "causal_24,shorten_24", "--batches", "1", "--dtypes", "float32", "--dropout",
                       "0.0,0.2", "--blocks", "8", "--heads", "2", "--head_dim", "8", "--rounds", "1", "--results",
                       str(tmp_path)])
  assert [(r["case"], r["impl"]) for r in record["rows"][:4]] == [("causal_24", "xla"), ("causal_24", "block8"),
                                                                  ("causal_24", "reference"), ("causal_24", "block8")]
  assert all(r["step_s"] > 0 for r in record["rows"])
  assert record["rows"][1]["computed_fraction"] == 6 * 64 / 24**2
  assert (tmp_path / "block_attention.json").exists()


def test_gradients_through_a_scan_of_layers():
  """Under an outer trace (nn.scan / lax.scan over layers) the custom VJP must close over no tracer of it."""
  t, s, mask, pos_q, pos_k = CASES["causal"]
  q, k, v = qkv(t, s)
  bias = _bias("relative", t, s, mask, pos_q, pos_k)
  scales = jnp.asarray([1.0, 0.5])

  def stack(fn, q):
    def layer(x, scale):
      return fn(x * scale, k, v, mask, (bias[0] * scale, bias[1])), None
    return jnp.sum(jax.lax.scan(layer, q, scales)[0] ** 2)

  block = lambda *a: ba.block_attention(*a, **BLOCK)
  np.testing.assert_allclose(jax.grad(stack, argnums=1)(block, q), jax.grad(stack, argnums=1)(reference_attention, q),
                             atol=1e-5, rtol=1e-4)


def test_every_block_matmul_contracts_its_left_operands_last_axis():
  """dK and dV are accumulated transposed so that no batched matmul contracts a left operand over a non-minor axis
  (the query axis of "gbnqk,gbnqh->gbnkh"): XLA:CPU runs those as Eigen dots at a third of YNNPACK's rate."""
  t, s, mask, _, _ = CASES["causal"]
  q, k, v = qkv(t, s)
  grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(ba.block_attention(q, k, v, mask, **BLOCK) ** 2), (0, 1, 2)))
  hlo = grad.lower(q, k, v).compile().as_text()
  contracting = re.findall(r"lhs_batch_dims=\{0,1,2\}, lhs_contracting_dims=\{(\d+)\}", hlo)
  assert len(contracting) >= 5  # forward: QK^T, PV; backward: QK^T, dO V^T, dS K, dO^T P, Q^T dS
  assert set(contracting) == {"4"}


def test_dropout_refuses_a_block_counter_past_two_to_the_32():
  with pytest.raises(ValueError, match="2\\^32 counter"):
    jax.eval_shape(lambda s: ba._keep(s, 0.1, 2 ** 17, 16, 128, 128), jax.ShapeDtypeStruct((1,), jnp.uint32))
