import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from hourglass_jax.model.layers import causal_mask
from hourglass_jax.model.resampling import shorten_mask, upsample_mask
from hourglass_jax.ops.dropout import keep_mask
from hourglass_jax.ops.attention import (dot_product_attention, fused_attention, reference_attention,
                                         resolve_implementation, sharded_splash_attention, splash_attention)
from tests.helpers import qkv

MASKS = {
    "none": lambda t, s: None,
    "causal": lambda t, s: causal_mask(t),
    "shorten": lambda t, s: shorten_mask(s, s // t),
    "upsample": lambda t, s: upsample_mask(t, t // s),
}
SHAPES = {"none": (7, 5), "causal": (9, 9), "shorten": (4, 12), "upsample": (12, 4)}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("with_bias", [False, True])
def test_xla_matches_reference_values_and_gradients(mask_name, with_bias):
  t, s = SHAPES[mask_name]
  q, k, v = qkv(t, s)
  mask = MASKS[mask_name](t, s)
  bias = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, t, s)), jnp.float32) if with_bias else None

  def loss(fn, q, k, v, bias):
    out = fn(q, k, v, mask, bias)
    return jnp.sum(out * jnp.cos(out)), out

  grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4), has_aux=True), static_argnums=0)
  xla = lambda q, k, v, m, b: dot_product_attention(q, k, v, m, b, impl="xla")
  (g_xla, out_xla), (g_ref, out_ref) = [
      (grad(fn, q, k, v, bias)[0], fn(q, k, v, mask, bias)) for fn in (xla, reference_attention)]
  np.testing.assert_allclose(out_xla, out_ref, atol=1e-5, rtol=1e-5)
  for a, b in zip(g_xla, g_ref):
    if b is not None:
      np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_reference_is_softmax_of_masked_scaled_scores():
  q, k, v = qkv(4, 12, b=1, n=1)
  mask = shorten_mask(12, 3)
  out = np.asarray(reference_attention(q, k, v, mask))[0, :, 0]
  qn, kn, vn = (np.asarray(x)[0, :, 0].astype(np.float64) for x in (q, k, v))
  scores = qn @ kn.T / np.sqrt(8)
  scores[~mask] = -np.inf
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  np.testing.assert_allclose(out, probs @ vn, atol=1e-5)


def test_masked_keys_have_no_influence():
  q, k, v = qkv(12, 4)
  mask = upsample_mask(12, 3)
  base = dot_product_attention(q, k, v, mask, impl="xla")
  changed = dot_product_attention(q, k, v.at[:, 2].add(10.0), mask, impl="xla")
  allowed_rows = np.nonzero(~mask[:, 2])[0]  # queries that may not see key 2
  np.testing.assert_array_equal(base[:, allowed_rows], changed[:, allowed_rows])
  assert not np.allclose(base[:, 6:], changed[:, 6:])


def test_probability_dropout_is_seeded_and_unbiased_in_expectation():
  q, k, v = qkv(9, 9)
  mask = causal_mask(9)
  a = dot_product_attention(q, k, v, mask, dropout_rate=0.5, dropout_rng=jax.random.key(3))
  b = dot_product_attention(q, k, v, mask, dropout_rate=0.5, dropout_rng=jax.random.key(3))
  c = dot_product_attention(q, k, v, mask, dropout_rate=0.5, dropout_rng=jax.random.key(4))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  sample = lambda key: dot_product_attention(q, k, v, mask, dropout_rate=0.5, dropout_rng=key)
  samples = jax.jit(jax.vmap(sample))(jax.random.split(jax.random.key(0), 2000))
  np.testing.assert_allclose(samples.mean(0), reference_attention(q, k, v, mask), atol=0.1)


def test_reference_dropout_draws_the_counter_hash_mask_of_its_key():
  """The einsum path's probability dropout is ops/dropout.keep_mask's mask for the key, at the rate given."""
  q, k, v = qkv(9, 9)
  mask, key = causal_mask(9), jax.random.key(5)
  keep = keep_mask(key, 0.3, (q.shape[0], q.shape[2], 9, 9))
  drawn = reference_attention(q, k, v, mask, dropout_rate=0.3, dropout_rng=key)
  np.testing.assert_allclose(drawn, reference_attention(q, k, v, mask, dropout_rate=0.3, dropout_mask=keep),
                             rtol=1e-6, atol=1e-6)
  assert not np.allclose(drawn, reference_attention(q, k, v, mask, dropout_rate=0.3, dropout_mask=~keep))


def _scanned_attention_grad(attend, layers=4):
  """Gradient of a stack of `layers` attention layers under lax.scan (as the scanned model runs them)."""
  def loss(q, k, v):
    def layer(x, key):
      return attend(x, k, v, key), None
    out, _ = jax.lax.scan(layer, q, jax.random.split(jax.random.key(0), layers))
    return jnp.sum(out ** 2)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def test_dropout_attention_recomputes_probabilities_instead_of_stacking_them():
  t = 256
  q, k, v = qkv(t, t, b=1, n=4, h=16)
  mask = causal_mask(t)
  dispatched = lambda x, k, v, key: dot_product_attention(x, k, v, mask, impl="xla", dropout_rate=0.2,
                                                          dropout_rng=key)
  stored = lambda x, k, v, key: reference_attention(x, k, v, mask, dropout_rate=0.2, dropout_rng=key)
  for a, b in zip(_scanned_attention_grad(dispatched)(q, k, v), _scanned_attention_grad(stored)(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

  def growth(attend):  # temporary memory added by 6 more layers, in units of one layer's [N, T, S] float32 square
    temp = lambda layers: (_scanned_attention_grad(attend, layers).lower(q, k, v).compile()
                           .memory_analysis().temp_size_in_bytes)
    return (temp(8) - temp(2)) / (4 * t * t * 4)

  assert growth(stored) >= 6  # the plain path keeps every layer's probabilities for the backward pass
  assert growth(dispatched) < 1


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="resolution on the CPU backend")
def test_auto_resolution_on_cpu():
  common = dict(dtype=jnp.bfloat16, static_mask=True, lengths=(128, 128))
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **common) == "xla"
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **common) == "reference"
  assert resolve_implementation("xla", has_bias=True, has_dropout=True, **common) == "reference"
  long = dict(common, lengths=(1024, 1024), mask_TxS=causal_mask(1024))
  for bias, dropout in ((False, False), (True, True)):
    assert resolve_implementation("auto", has_bias=bias, has_dropout=dropout, **long) == "block"
  shorten = dict(common, lengths=(682, 2046), mask_TxS=shorten_mask(2046, 3))
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **shorten) == "block"
  unmasked = dict(long, mask_TxS=None)  # nothing to skip: block attention would only save memory
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **unmasked) == "xla"
  for fused in ("cudnn", "splash"):
    with pytest.raises(ValueError, match=f"attention_impl='{fused}' needs a"):
      resolve_implementation(fused, has_bias=False, has_dropout=False, **common)
  with pytest.raises(ValueError, match="not one of"):
    resolve_implementation("tpu_flash", has_bias=False, has_dropout=False, **common)


def test_auto_resolution_on_gpu(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # resolution is pure logic: no GPU needed
  causal = dict(dtype=jnp.bfloat16, static_mask=True, lengths=(2049, 2049), mask_TxS=causal_mask(2049))
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **causal) == "cudnn"
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **causal) == "flash"  # Pallas, dropout inside
  assert resolve_implementation("auto", has_bias=True, has_dropout=False, **causal) == "block"
  float32 = dict(causal, dtype=jnp.float32)
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **float32) == "block"
  unmasked = dict(causal, mask_TxS=None)
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **unmasked) == "flash"
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **dict(unmasked, dtype=jnp.float32)) \
      == "reference"


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_fused_attention_pads_odd_lengths_with_positions_no_query_sees(mask_name):
  # cuDNN refuses odd lengths; the padding is checked here through XLA's kernel, and on a GPU through cuDNN below.
  t, s = {"none": (7, 5), "causal": (9, 9), "shorten": (5, 15), "upsample": (15, 5)}[mask_name]
  q, k, v = qkv(t, s)
  mask = MASKS[mask_name](t, s)
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) ** 3)
  padded = lambda q, k, v: fused_attention(q, k, v, mask, implementation="xla", pad_odd=True)
  plain = lambda q, k, v: reference_attention(q, k, v, mask)
  np.testing.assert_allclose(padded(q, k, v), plain(q, k, v), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.grad(loss(padded), (0, 1, 2))(q, k, v), jax.grad(loss(plain), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fused_attention_refuses_to_pad_beside_a_bias():
  q, k, v = qkv(9, 9)
  with pytest.raises(ValueError, match="pads odd lengths only without a bias"):
    fused_attention(q, k, v, causal_mask(9), jnp.zeros((1, 1, 9, 9)), implementation="xla", pad_odd=True)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("mask_name", ["causal", "shorten", "upsample"])
@pytest.mark.parametrize("odd", [False, True])
def test_cudnn_matches_reference_on_gpu(mask_name, odd):
  even, odd_lengths = {"causal": ((256, 256), (257, 257)), "shorten": ((128, 384), (129, 387)),
                       "upsample": ((384, 128), (387, 129))}[mask_name]
  t, s = odd_lengths if odd else even
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(t, s, h=64))
  mask = MASKS[mask_name](t, s)
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) ** 2)
  fused = lambda q, k, v: dot_product_attention(q, k, v, mask, impl="cudnn")
  plain = lambda q, k, v: reference_attention(q, k, v, mask)
  as32 = lambda xs: [np.asarray(x, np.float32) for x in xs]
  np.testing.assert_allclose(*as32([fused(q, k, v), plain(q, k, v)]), atol=3e-2)
  grads = lambda f: as32(jax.grad(loss(f), (0, 1, 2))(q, k, v))
  for a, b in zip(grads(fused), grads(plain)):
    np.testing.assert_allclose(a, b, atol=0.1 * np.abs(b).max())


@pytest.mark.parametrize("mask_name", ["causal", "shorten"])
def test_splash_kernel_glue_matches_reference_in_the_pallas_interpreter(mask_name):
  t, s = {"causal": (128, 128), "shorten": (128, 384)}[mask_name]
  q, k, v = qkv(t, s, b=1, n=2, h=64)
  mask = MASKS[mask_name](t, s)
  np.testing.assert_allclose(splash_attention(q, k, v, mask, interpret=True), reference_attention(q, k, v, mask),
                             atol=1e-5)


@pytest.mark.skipif(jax.device_count() < 8, reason="a 2 x 2 x 2 mesh (8 virtual CPU devices)")
def test_splash_runs_per_shard_under_shard_map_on_a_sharded_mesh():
  """A Mosaic kernel cannot be partitioned by XLA: on a mesh, each device runs it on its own batch rows and heads."""
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  q, k, v = qkv(128, 128, b=4, n=2, h=64)
  mask = causal_mask(128)
  spec = P(("data", "fsdp"), None, "tensor", None)

  def attend(q, k, v):
    with nn.logical_axis_rules((("batch", ("data", "fsdp")), ("heads", "tensor"))):
      return sharded_splash_attention(q, k, v, mask, interpret=True)

  with jax.set_mesh(mesh):
    q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in (q, k, v))
    jaxpr = jax.make_jaxpr(attend)(q, k, v)
    out = jax.jit(attend)(q, k, v)
  calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "shard_map"]
  assert len(calls) == 1 and calls[0].params["jaxpr"].outvars[0].aval.shape == (1, 128, 1, 64)  # one row, one head
  np.testing.assert_allclose(out, reference_attention(q, k, v, mask), atol=1e-5)
  assert jax.make_jaxpr(lambda q, k, v: sharded_splash_attention(q, k, v, mask, interpret=True))(q, k, v).eqns[0] \
      .primitive.name != "shard_map"  # no mesh: the kernel is called directly


@pytest.mark.skipif(jax.default_backend() != "tpu", reason="splash attention needs a TPU")
def test_splash_matches_reference_on_tpu():
  q, k, v = qkv(256, 256, h=128)
  mask = causal_mask(256)
  np.testing.assert_allclose(dot_product_attention(q, k, v, mask, impl="splash"),
                             reference_attention(q, k, v, mask), atol=2e-3)
