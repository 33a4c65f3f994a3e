"""Hourglass shortening / upsampling ops against plain NumPy computations of their formulas."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.hourglass.resampling import Shorten, Upsample
from hourglass_jax.model import counting
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.resampling import (DOWNSAMPLERS, SHORTEN_METHODS, SHORTENINGS, UPSAMPLE_METHODS, UPSAMPLERS,
                                           Shortening, downsampling, register_shortening, scale_upsampling,
                                           shift_right, shorten_mask, shortening, upsample_mask)

D, N, F, B, L = 16, 2, 32, 2, 12
H = D // N
EPS = 1e-6
TOL = dict(rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------- NumPy reference helpers
def layer_norm(x, p):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + EPS) * p["scale"] + p["bias"]


def gelu_tanh(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def dense(x, p):
  return x @ p["kernel"] + p["bias"]


def ffn(x, p):
  return dense(gelu_tanh(dense(x, p["wi"])), p["wo"])


def rope(x_BxTxNxH, pos_T, base=10_000.0):
  """Rotate (first half, second half) channel pairs by angle pos * base^(-i/half)."""
  half = x_BxTxNxH.shape[-1] // 2
  ang = np.asarray(pos_T, np.float64)[:, None] * base ** (-np.arange(half) / half)
  sin, cos = np.sin(ang)[None, :, None], np.cos(ang)[None, :, None]
  x1, x2 = x_BxTxNxH[..., :half], x_BxTxNxH[..., half:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def sinusoids(dist, d_model):
  ang = np.asarray(dist, np.float64)[..., None] * 10_000.0 ** (-np.arange(0, d_model, 2) / d_model)
  return np.concatenate([np.sin(ang), np.cos(ang)], axis=-1)


def mha(xq, xkv, p, pos_q, pos_k, mask, position="rope"):
  """softmax(q k^T / sqrt(H), masked) v through q/k/v/out projections; rope or Transformer-XL positions."""
  proj = lambda x, name: np.einsum("btd,dnh->btnh", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value")
  if position == "rope":
    logits = np.einsum("btnh,bsnh->bnts", rope(q, pos_q), rope(k, pos_k))
  else:  # (q+u)·k + (q+v)·W_r R(pos_q - pos_k)
    r_TxSxNxH = np.einsum("tsd,dnh->tsnh", sinusoids(pos_q[:, None] - pos_k[None, :], D), p["position"]["kernel"])
    logits = (np.einsum("btnh,bsnh->bnts", q + p["content_bias"], k)
              + np.einsum("btnh,tsnh->bnts", q + p["position_bias"], r_TxSxNxH))
  logits = np.where(mask, logits / np.sqrt(H), -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum("bnts,bsnh->btnh", probs, v)
  return np.einsum("btnh,nhd->btd", out, p["out"]["kernel"]) + p["out"]["bias"]


def attention_residual(x, kv, p, pos_q, pos_k, mask, position):
  x = x + mha(x, kv, p["attention"], pos_q, pos_k, mask, position)
  return x + ffn(layer_norm(x, p["mlp_norm"]), p["mlp"])


def np_pool(x, k, method, p):
  b, length, d = x.shape
  x = x.reshape(b, length // k, k, d)
  return x.mean(2) if method == "avg" else dense(x.reshape(b, length // k, k * d), p["proj"])


def np_unpool(s, k, method, p):
  b, short, d = s.shape
  return np.repeat(s, k, axis=1) if method == "repeat" else dense(s, p["proj"]).reshape(b, short * k, d)


def np_shorten(h0, p, option, k, outer, position):
  if not option.startswith("attention_"):
    return np_pool(h0, k, option, p.get("pool"))
  h = layer_norm(h0, p["input_norm"])
  q0 = layer_norm(np_pool(h, k, option.removeprefix("attention_"), p.get("pool")), p["query_norm"])
  length = h0.shape[1]
  mask = np.arange(length)[None, :] // k <= np.arange(length // k)[:, None]
  pos_q, pos_k = np.arange(length // k) * k * outer, (np.arange(length) - (k - 1)) * outer
  return attention_residual(q0, h, p["resample"], pos_q, pos_k, mask, position)


def np_upsample(s, r, p, option, k, outer, position):
  if option == "none":
    return r
  if not option.startswith("attention_"):
    return layer_norm(np_unpool(s, k, option, p.get("unpool")), p["output_norm"]) + r
  s = layer_norm(s, p["input_norm"])
  u = layer_norm(np_unpool(s, k, option.removeprefix("attention_"), p.get("unpool")), p["query_norm"]) + r
  length = r.shape[1]
  mask = np.arange(length // k)[None, :] <= (np.arange(length) // k)[:, None]
  pos_q, pos_k = np.arange(length) * outer, np.arange(length // k) * k * outer
  y = attention_residual(u, s, p["resample"], pos_q, pos_k, mask, position)
  return layer_norm(y, p["output_norm"]) + r


# ------------------------------------------------------------------------------------------------------ plumbing
OPTIONS = dict(d_model=D, num_heads=N, d_ff=F, attention_impl="xla")


def np_shift(x, n):
  """n zero vectors in front, the last n dropped."""
  return np.concatenate([np.zeros_like(x[:, :n]), x[:, :x.shape[1] - n]], axis=1)


def init_perturbed(module, *inputs, seed=0):
  """Param shapes from init (abstractly), every leaf (through the nn.Partitioned boxes) filled with N(0, 0.5^2)."""
  variables = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs, deterministic=True))
  rng = np.random.default_rng(seed)
  variables = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape) * 0.5, jnp.float32), variables)
  plain = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(variables))
  return variables, plain.get("params", {})


def rand(*shape, seed=1):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


KS_OUTERS = [(2, 1), (3, 1), (2, 3), (3, 3)]


# --------------------------------------------------------------------------------------------------------- tests
def test_shift_right():
  x = rand(B, L, D)
  for n in (0, 1, 2, 3):
    want = np.zeros_like(x)
    for t in range(n, L):
      want[:, t] = x[:, t - n]
    np.testing.assert_array_equal(np.asarray(shift_right(jnp.asarray(x), n)), want)


@pytest.mark.parametrize("length,k", [(12, 2), (12, 3), (8, 4), (5, 1)])
def test_masks_brute_force(length, k):
  want_s = np.array([[j // k <= i for j in range(length)] for i in range(length // k)])
  want_u = np.array([[j <= q // k for j in range(length // k)] for q in range(length)])
  np.testing.assert_array_equal(shorten_mask(length, k), want_s)
  np.testing.assert_array_equal(upsample_mask(length, k), want_u)
  assert want_s.any(axis=1).all() and want_u.any(axis=1).all()  # every query sees at least one key


@pytest.mark.parametrize("k,outer", KS_OUTERS)
@pytest.mark.parametrize("option", SHORTEN_METHODS)
def test_shorten_matches_numpy(option, k, outer):
  module = Shorten(factor=k, method=option, outer_factor=outer, **OPTIONS)
  x = rand(B, L, D)
  variables, p = init_perturbed(module, x)
  got = np.asarray(module.apply(variables, x, deterministic=True))
  assert got.shape == (B, L // k, D)
  np.testing.assert_allclose(got, np_shorten(np_shift(x.astype(np.float64), k - 1), p, option, k, outer, "rope"),
                             **TOL)


@pytest.mark.parametrize("k,outer", KS_OUTERS)
@pytest.mark.parametrize("option", UPSAMPLE_METHODS)
def test_upsample_matches_numpy(option, k, outer):
  module = Upsample(factor=k, method=option, outer_factor=outer, **OPTIONS)
  s, r = rand(B, L // k, D, seed=1), rand(B, L, D, seed=2)
  variables, p = init_perturbed(module, s, r)
  got = np.asarray(module.apply(variables, s, r, deterministic=True))
  assert got.shape == (B, L, D)
  want = np_upsample(s.astype(np.float64), r.astype(np.float64), p, option, k, outer, "rope")
  np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("k,outer", [(2, 1), (3, 3)])
def test_shorten_relative_positions(k, outer):
  module = Shorten(factor=k, method="attention_linear", outer_factor=outer, position="relative", **OPTIONS)
  x = rand(B, L, D)
  variables, p = init_perturbed(module, x)
  got = np.asarray(module.apply(variables, x, deterministic=True))
  want = np_shorten(np_shift(x.astype(np.float64), k - 1), p, "attention_linear", k, outer, "relative")
  np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("k,outer", [(2, 1), (3, 3)])
def test_upsample_relative_positions(k, outer):
  module = Upsample(factor=k, method="attention_repeat", outer_factor=outer, position="relative", **OPTIONS)
  s, r = rand(B, L // k, D, seed=1), rand(B, L, D, seed=2)
  variables, p = init_perturbed(module, s, r)
  got = np.asarray(module.apply(variables, s, r, deterministic=True))
  want = np_upsample(s.astype(np.float64), r.astype(np.float64), p, "attention_repeat", k, outer, "relative")
  np.testing.assert_allclose(got, want, **TOL)


def test_perturbation_makes_layer_norm_params_nontrivial():
  module = Shorten(factor=2, method="attention_avg", **OPTIONS)
  _, p = init_perturbed(module, rand(B, L, D))
  assert not np.allclose(p["input_norm"]["scale"], 1.0) and not np.allclose(p["input_norm"]["bias"], 0.0)


def test_the_registries_list_every_method_in_order_and_the_multiscale_names_are_the_same_methods():
  assert SHORTEN_METHODS == ("avg", "linear", "attention_avg", "attention_linear")
  assert UPSAMPLE_METHODS == ("repeat", "linear", "attention_repeat", "attention_linear", "none")
  assert (DOWNSAMPLERS, UPSAMPLERS) == (("avg", "conv"), ("repeat", "transposed_conv"))
  assert downsampling("conv") is shortening("linear") and scale_upsampling("transposed_conv").key == "linear"
  with pytest.raises(ValueError, match="Shorten.method='max'.*avg, linear"):
    Shorten(factor=2, method="max", **OPTIONS).init(jax.random.PRNGKey(0), rand(B, L, D))


def test_a_method_registered_in_one_module_is_picked_by_name_and_counts_itself():
  """A new shortening is one class and one registration: Shorten runs it, the cost count asks it for its own."""
  class MaxPool(Shortening):
    key = "test_max"

    @classmethod
    def pool(cls, cfg, k, h_BxLxD, deterministic, name="pool"):
      b, length, d = h_BxLxD.shape
      return h_BxLxD.reshape(b, length // k, k, d).max(axis=2)

    pool_cost = classmethod(lambda cls, cfg, k, short: (7, 11 * short))

  register_shortening(MaxPool)
  try:
    x = rand(B, L, D)
    got = np.asarray(Shorten(factor=3, method="test_max", **OPTIONS).apply({}, x))
    np.testing.assert_allclose(got, np_shift(x, 2).reshape(B, L // 3, 3, D).max(axis=2))
    cfg = ModelConfig(hierarchy="1@1 1@3 1@1", shorten="test_max", upsample="repeat", d_model=D, num_heads=N,
                      d_ff=F, vocab_size=16)
    part = {part.name: part for part in counting.count(cfg, L)}["shorten@1->3"]
    assert (part.params, part.flops) == (7, 11 * L // 3)
  finally:
    del SHORTENINGS["test_max"]
