"""The Pallas flash-attention kernel with in-kernel dropout, in the Pallas interpreter (on a GPU, in Triton), against
the einsum reference: values, gradients and the keep mask given the same key. Tiny shapes: the interpreter runs
each grid program as a loop of XLA ops."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.resampling import shorten_mask
from hourglass_jax.model.layers import causal_mask
from hourglass_jax.ops.attention import dot_product_attention, reference_attention, resolve_implementation
from hourglass_jax.ops.dropout import keep_mask
from hourglass_jax.ops import flash_dropout
from hourglass_jax.ops.flash_dropout import Blocks, flash_attention
from tests.helpers import qkv

INTERPRET = jax.default_backend() != "gpu"
BLOCKS = dict(block_q=16, block_k=16, block_bwd=16)
# dK/dV and dQ tiled differently from each other and from the forward, as the Hopper row of flash_dropout.BLOCKS
UNEVEN = dict(blocks=Blocks(16, 32, 16, 32, 32, 16))


def _values_and_grads(attend, q, k, v):
  w = jax.random.normal(jax.random.key(7), q.shape[:2] + v.shape[2:])

  def loss(*a):
    out = attend(*a)
    return (out * w).sum(), out

  (value, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return (value, grads), out


@pytest.mark.parametrize("mask_name, blocks", [("causal", BLOCKS), ("shorten", BLOCKS), ("causal", UNEVEN)],
                         ids=["causal", "shorten", "causal-uneven-blocks"])
def test_flash_matches_reference_with_dropout(mask_name, blocks):
  # causal at an odd length (padded to the blocks, computed in the kernel); shorten: queries and keys of different
  # lengths, the mask read per tile, a query block with no key in some tiles.
  mask = causal_mask(19) if mask_name == "causal" else shorten_mask(24, 3)
  q, k, v = qkv(*mask.shape, b=1, n=1)
  rng = jax.random.key(3)
  flash = functools.partial(flash_attention, mask_TxS=mask, dropout_rate=0.25, dropout_rng=rng, interpret=INTERPRET,
                            **blocks)
  ref = functools.partial(reference_attention, mask_TxS=mask, dropout_rate=0.25, dropout_rng=rng)
  (loss, grads), out = _values_and_grads(flash, q, k, v)
  (ref_loss, ref_grads), ref_out = _values_and_grads(ref, q, k, v)
  np.testing.assert_allclose(out, ref_out, atol=2e-5)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  for g, r in zip(grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=5e-5)


def test_flash_draws_the_keep_mask_of_the_hash():
  # q = k = 0 gives uniform probabilities and v = identity reads them out: out[b, t, n, s] = keep / (S (1 - rate)).
  b, n, t, rate = 2, 2, 16, 0.4
  q = jnp.zeros((b, t, n, t))
  v = jnp.broadcast_to(jnp.eye(t)[None, :, None, :], (b, t, n, t))
  rng = jax.random.key(11)
  out = flash_attention(q, q, v, None, dropout_rate=rate, dropout_rng=rng, interpret=INTERPRET, **BLOCKS)
  kept = np.asarray(jnp.transpose(out, (0, 2, 1, 3))) * t * (1 - rate) > 0.5
  expected = np.asarray(keep_mask(rng, rate, (b, n, t, t)))
  np.testing.assert_array_equal(kept, expected)
  other = flash_attention(q, q, v, None, dropout_rate=rate, dropout_rng=jax.random.key(12), interpret=INTERPRET,
                          **BLOCKS)
  assert not np.array_equal(np.asarray(other), np.asarray(out))


def test_block_sizes_follow_the_gpu_generation_and_shrink_rather_than_pad_much(monkeypatch):
  class Device:
    platform, compute_capability = "gpu", "9.0"

  monkeypatch.setattr(jax, "devices", lambda *_: [Device()])
  assert flash_dropout.device_blocks() == flash_dropout.BLOCKS[9]
  Device.compute_capability = "7.5"
  assert flash_dropout.device_blocks() == flash_dropout.DEFAULT_BLOCKS
  # 2052 tokens pad to 2176 with 128-blocks (6%); 513 would pad to 640 (25%), so it takes 64 (576)
  assert (flash_dropout._block(128, 2052), flash_dropout._block(128, 513), flash_dropout._block(128, 40)) == (128, 64, 64)


def test_dispatcher_picks_flash_on_gpu_with_dropout(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # resolution is pure logic
  causal = dict(dtype=jnp.bfloat16, static_mask=True, lengths=(2049, 2049), mask_TxS=causal_mask(2049))
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **causal) == "flash"
  assert resolve_implementation("auto", has_bias=False, has_dropout=False, **causal) == "cudnn"
  assert resolve_implementation("auto", has_bias=True, has_dropout=True, **causal) == "block"
  assert resolve_implementation("auto", has_bias=False, has_dropout=True, **dict(causal, dtype=jnp.float32)) \
      == "block"
  assert resolve_implementation("flash", has_bias=False, has_dropout=False, **causal) == "flash"
  with pytest.raises(ValueError, match="attention_impl='flash' needs"):
    resolve_implementation("flash", has_bias=True, has_dropout=True, **causal)


@pytest.mark.parametrize("rate", [0.0, 0.2])
def test_dispatcher_runs_flash_by_name(rate):
  mask = causal_mask(16)
  q, k, v = qkv(16, 16, b=1, n=1)
  rng = jax.random.key(5)
  out = dot_product_attention(q, k, v, mask, impl="flash", dropout_rate=rate, dropout_rng=rng)
  np.testing.assert_allclose(out, reference_attention(q, k, v, mask, dropout_rate=rate, dropout_rng=rng), atol=2e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_flash_lowers_to_triton_for_an_h100():
  # Lowering (not PTX compilation) needs no GPU: an abstract H100 stands in for the device.
  try:
    from jax._src.mesh import AbstractDevice, AbstractMesh
  except ImportError:
    pytest.skip("this jax has no abstract devices")
  mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H100 80GB HBM3", 132, "gpu"))
  mask = causal_mask(2049)
  x = jax.ShapeDtypeStruct((1, 2049, 2, 64), jnp.bfloat16)
  rng = jax.random.key(0)
  loss = lambda q, k, v: flash_attention(q, k, v, mask, dropout_rate=0.2, dropout_rng=rng).astype(jnp.float32).sum()
  with jax.sharding.use_abstract_mesh(mesh):
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(x, x, x).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") >= 3  # forward, dK/dV and dQ kernels


@pytest.mark.skipif(jax.device_count() < 8, reason="a 2 x 2 x 2 mesh (8 virtual CPU devices)")
def test_flash_per_shard_draws_its_part_of_the_whole_mask():
  # On a mesh the kernel runs per device (batch rows over data x fsdp, heads over tensor); each shard offsets its
  # rows in the hash, so the result is the one-device result, dropout included.
  import flax.linen as nn
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  from hourglass_jax.ops.attention import sharded_flash_attention

  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  mask = causal_mask(16)
  q, k, v = qkv(16, 16, b=4, n=2)
  rng = jax.random.key(9)

  def attend(q, k, v):
    with nn.logical_axis_rules((("batch", ("data", "fsdp")), ("heads", "tensor"))):
      return sharded_flash_attention(q, k, v, mask, dropout_rate=0.3, dropout_rng=rng, interpret=INTERPRET)

  with jax.set_mesh(mesh):
    sharded = [jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))) for x in (q, k, v)]
    out = jax.jit(attend)(*sharded)
  np.testing.assert_allclose(out, reference_attention(q, k, v, mask, dropout_rate=0.3, dropout_rng=rng), atol=2e-5)
