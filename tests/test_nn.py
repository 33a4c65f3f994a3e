"""The public layer API (hourglass_jax.nn): plain keyword arguments, any width, exact causality, logical axes, and
the LM built from the same modules."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.nnx import bridge

from hourglass_jax import nn as hnn
from hourglass_jax.model import build_model
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.layer_config import LAYER_FIELDS
from hourglass_jax.model.layers import dense
from hourglass_jax.runtime.sharding import DEFAULT_RULES
from tests.helpers import SMALL, small_config

WIDTH = 24  # no config default: every module takes the input's width


def stream(length: int, width: int = WIDTH, seed: int = 0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(1, length, width)), jnp.float32)


def perturbed_variables(module, *inputs):
  """Init shapes with every parameter N(0, 0.3^2), so LayerNorm scales/biases and zero-init biases matter too."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs))
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.3, s.dtype), shapes)


def influence(f, x_BxLxD):
  """|d f(x)[t] / d x[p]| maximised over channels: [T, L]."""
  jacobian_TxDxLxD = np.asarray(jax.jit(jax.jacrev(lambda x: f(x)[0]))(x_BxLxD))[:, :, 0]
  return np.abs(jacobian_TxDxLxD).max(axis=(1, 3))


BODIES = {
    "hourglass": hnn.Hourglass(hierarchy="1@1 1@2 1@4 1@2 1@1", num_heads=4),
    "hourglass_linear_relative": hnn.Hourglass(hierarchy="1@1 2@3 1@1", shorten="linear", upsample="linear",
                                               position="relative", num_heads=2),
    "hourglass_attention_linear": hnn.Hourglass(hierarchy="1@1 1@2 1@1", shorten="attention_linear",
                                                upsample="attention_linear", num_heads=2, d_ff=40),
    "hourglass_dynamic": hnn.Hourglass(hierarchy="1@1 1@3 1@1", shorten="dynamic", upsample="repeat", num_heads=2,
                                       segment_capacity=1.0),
    "decoder_stack": hnn.DecoderStack(num_layers=2, num_heads=4),
    "topdown": hnn.TopDown(scales="4,2,1", layers_per_scale="1,1,1", downsampler="conv", num_heads=2),
    "bottomup": hnn.BottomUp(scales="4,2,1", layers_per_scale="1,0,1", heads_per_scale="1,1,1", num_heads=3),
    "retina": hnn.Retina(num_layers=1, scales="4,2,1", retina_windows="0:2,2:6,6:20", num_heads=3,
                         position="relative"),
}

SLOW_BODIES = {"hourglass", "hourglass_attention_linear", "hourglass_dynamic", "bottomup"}  # 23-39 s each on 2 cores


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW_BODIES else name
                                  for name in sorted(BODIES)])
def test_every_body_maps_any_width_and_length_causally(name):
  """A length that is no multiple of any factor: the body pads inside and still returns [B, L, D], causally."""
  body = BODIES[name]
  x_BxLxD = stream(11)
  variables = perturbed_variables(body, x_BxLxD)
  assert jax.eval_shape(body.apply, variables, x_BxLxD).shape == x_BxLxD.shape
  influence_LxL = influence(lambda x: body.apply(variables, x), x_BxLxD)
  assert np.all(np.triu(influence_LxL, k=1) == 0.0), "an output depends on a later input"
  assert np.all(np.diag(influence_LxL) > 0.0)


def test_dynamic_shortening_pools_given_segments_and_reads_the_newest_completed_one():
  """With boundaries after positions 1 and 4: z = the means of x[0:2], x[2:5]; position t reads the newest segment
  closed at or before it (none for t = 0), through the output norm, plus x[t]."""
  x_BxLxD = stream(7)
  boundaries_BxL = jnp.asarray([[False, True, False, False, True, False, False]])
  shorten = hnn.DynamicShorten(factor=3, boundaries="whitespace", num_heads=2)
  upsample = hnn.DynamicUpsample(num_heads=2)
  z_BxMxD, segments = shorten.apply({}, x_BxLxD, boundaries_BxL=boundaries_BxL)
  np.testing.assert_allclose(z_BxMxD[0, :3], np.stack([x_BxLxD[0, 0:2].mean(0), x_BxLxD[0, 2:5].mean(0),
                                                        x_BxLxD[0, 5:].mean(0)]), atol=1e-6)
  y_BxLxD = upsample.apply(upsample.init(jax.random.key(0), z_BxMxD, segments, x_BxLxD), z_BxMxD, segments, x_BxLxD)
  norm = lambda v: (v - v.mean()) / np.sqrt(v.var() + 1e-6)
  expected = [np.zeros(WIDTH)] + [norm(z_BxMxD[0, 0])] * 3 + [norm(z_BxMxD[0, 1])] * 3
  np.testing.assert_allclose(y_BxLxD[0] - x_BxLxD[0], np.stack(expected), atol=1e-4)


@pytest.mark.parametrize("method", hnn.SHORTEN_METHODS)
def test_shorten_is_causal_for_every_method(method):
  """z[j] summarises x[jk-k+1 .. jk]: it depends on x[p] only for p <= jk, and on x[jk] itself."""
  k, length = 3, 12
  shorten = hnn.Shorten(factor=k, method=method, num_heads=2)
  x_BxLxD = stream(length)
  variables = perturbed_variables(shorten, x_BxLxD)
  influence_QxL = influence(lambda x: shorten.apply(variables, x), x_BxLxD)
  assert influence_QxL.shape == (length // k, length)
  last_seen_Q = np.arange(length // k) * k
  allowed_QxL = np.arange(length)[None, :] <= last_seen_Q[:, None]
  assert np.all(influence_QxL[~allowed_QxL] == 0.0), "a shortened token sees a later input"
  assert np.all(influence_QxL[np.arange(length // k), last_seen_Q] > 0.0)


@pytest.mark.parametrize("method", hnn.UPSAMPLE_METHODS)
def test_upsample_is_causal_for_every_method(method):
  """y[q] reads z[j] only for j <= q // k and the residual r[q] only at q."""
  k, length = 2, 8
  upsample = hnn.Upsample(factor=k, method=method, num_heads=2)
  z_BxQxD, r_BxLxD = stream(length // k, seed=1), stream(length, seed=2)
  variables = perturbed_variables(upsample, z_BxQxD, r_BxLxD)
  from_z_LxQ = influence(lambda z: upsample.apply(variables, z, r_BxLxD), z_BxQxD)
  from_r_LxL = influence(lambda r: upsample.apply(variables, z_BxQxD, r), r_BxLxD)
  allowed_LxQ = np.arange(length // k)[None, :] <= (np.arange(length) // k)[:, None]
  assert np.all(from_z_LxQ[~allowed_LxQ] == 0.0), "an upsampled position reads a later shortened token"
  assert np.all(np.triu(from_r_LxL, k=1) == 0.0) and np.all(np.diag(from_r_LxL) > 0.0)
  if method != "none":
    assert np.all(from_z_LxQ[np.arange(length), np.arange(length) // k] > 0.0)


def test_shift_right_feeds_zeros_in_front():
  x_BxLxD = stream(5)
  np.testing.assert_array_equal(hnn.shift_right(x_BxLxD, 2)[0, :2], 0.0)
  np.testing.assert_array_equal(hnn.shift_right(x_BxLxD, 2)[0, 2:], x_BxLxD[0, :3])


def test_defaults_follow_the_input_width():
  stack = hnn.DecoderStack(num_layers=1, num_heads=4)
  params = stack.init(jax.random.key(0), stream(4, width=32))["params"]
  assert nn.meta.unbox(params)["blocks"]["mlp"]["wi"]["kernel"].shape == (1, 32, 4 * 32)


@pytest.mark.parametrize("module, inputs, message", [
    (hnn.Hourglass(d_model=32, num_heads=4), (stream(6),), "the input has 24 channels but d_model=32"),
    (hnn.Hourglass(num_heads=5), (stream(6),), "Hourglass: d_model=24 is not divisible by num_heads=5"),
    (hnn.Hourglass(hierarchy="1@1 2@3"), (stream(6),), "hierarchy='1@1 2@3'"),
    (hnn.Shorten(factor=4, num_heads=2), (stream(6),), "length 6 is not a multiple of factor=4"),
    (hnn.Shorten(method="max"), (stream(6),), "Shorten.method='max' is not supported"),
    (hnn.Upsample(factor=2, num_heads=2), (stream(2), stream(6)), "z has 2 positions and r has 6"),
    (hnn.DecoderStack(dropout=1.5, num_heads=2), (stream(6),), "DecoderStack: dropout=1.5 must be in"),
    (hnn.DecoderStack(rope_base=0.5, num_heads=2), (stream(6),), "rope_base=0.5 must be > 1"),
    (hnn.TopDown(scales="4,3,1", num_heads=2), (stream(6),), "4 is not an integer multiple (> 1) of the next scale 3"),
    (hnn.Retina(scales="4,2,1", retina_windows="0:2,2:6,6:20", num_heads=3), (stream(5),),
     "starts beyond this 5-token sequence"),
    (hnn.DynamicShorten(boundaries="whitespace", num_heads=2), (stream(6),),
     "needs boundaries_BxL of shape (1, 6) (got None); pass whitespace_boundaries(tokens)"),
    (hnn.DynamicShorten(factor=1, num_heads=2), (stream(6),), "DynamicShorten.factor=1 must be an integer >= 2"),
    (hnn.Hourglass(hierarchy="1@1 1@2 1@4 1@2 1@1", shorten="dynamic", upsample="repeat", num_heads=2,
                   boundaries="gumbel,entropy"), (stream(8),), "Hourglass.boundaries='gumbel,entropy': level 2"),
    (hnn.DynamicShorten(boundaries="gumbel,routing", num_heads=2), (stream(6),),
     "DynamicShorten.boundaries='gumbel,routing' is not supported"),
])
def test_bad_arguments_name_the_problem(module, inputs, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    module.init(jax.random.key(0), *inputs)


def test_every_parameter_keeps_its_logical_axes():
  """Each parameter is boxed with one logical name per dimension, scanned ones led by the layers axis."""
  body = hnn.Hourglass(hierarchy="1@1 1@2 1@1", num_heads=2, position="relative")
  boxed = jax.eval_shape(body.init, jax.random.key(0), stream(8))["params"]
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves and all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in leaves)
  assert all(len(leaf.names) == leaf.value.ndim for leaf in leaves)
  scanned = jax.tree.leaves(boxed["pre"]["blocks"], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert all(leaf.names[0] == hnn.LAYERS_AXIS for leaf in scanned)
  assert boxed["pre"]["final_norm"]["scale"].names == ("embed",)


@pytest.mark.slow
def test_build_model_is_the_public_body_between_an_embedding_and_a_head():
  """The LM's logits equal Embed -> hnn.Hourglass (same keyword arguments, the LM's body params) -> head."""
  cfg = small_config(hierarchy="1@1 2@3 1@1", position="relative")
  tokens_BxL = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
  lm = build_model(cfg)
  params = jax.jit(lm.init)(jax.random.key(0), tokens_BxL)["params"]
  body = hnn.Hourglass(hierarchy=cfg.hierarchy, shorten=cfg.shorten, upsample=cfg.upsample, num_heads=cfg.num_heads,
                       d_ff=cfg.d_ff, position="relative")
  x_BxLxD = nn.meta.unbox(params)["embed"]["embedding"][tokens_BxL]
  y_BxLxD = jax.jit(body.apply)({"params": params["body"]}, x_BxLxD)
  head = dense(cfg.layer_config, cfg.vocab_size, ("embed", "vocab"), "head")
  want_BxLxV = head.apply({"params": params["head"]}, y_BxLxD)
  np.testing.assert_allclose(jax.jit(lm.apply)({"params": params}, tokens_BxL), want_BxLxV, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_the_body_and_a_block_run_as_nnx_layers():
  """flax.nnx.bridge wraps the public modules: an NNX model of a user's own trains an Hourglass body over its
  embeddings, and a Shorten block runs as an NNX layer."""

  class PatchModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.embed = nnx.Linear(4, WIDTH, rngs=rngs)
      self.body = bridge.ToNNX(hnn.Hourglass(hierarchy="1@1 1@2 1@1", num_heads=2), rngs=rngs)
      self.out = nnx.Linear(WIDTH, 4, rngs=rngs)

    def __call__(self, patches_BxLx4):
      return self.out(self.body(self.embed(patches_BxLx4)))

  patches = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, 4)), jnp.float32)
  with nnx.use_eager_sharding(False):
    model = PatchModel(nnx.Rngs(0))
    bridge.lazy_init(model.body, jnp.zeros((2, 8, WIDTH)))
    shorten = bridge.ToNNX(hnn.Shorten(factor=2, method="attention_linear", num_heads=2), rngs=nnx.Rngs(1))
    bridge.lazy_init(shorten, jnp.zeros((2, 8, WIDTH)))
  assert shorten(jnp.ones((2, 8, WIDTH))).shape == (2, 4, WIDTH)

  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    def loss_fn(model):  # predict the next patch
      return jnp.mean((model(patches)[:, :-1] - patches[:, 1:]) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(10)]
  assert losses[-1] < 0.8 * losses[0]


@pytest.mark.slow
def test_the_body_shards_over_a_mesh_by_its_logical_axes():
  """The docs/layers.md recipe: logical specs from the boxed params, the rule table, a jitted init and apply."""
  body = hnn.Hourglass(hierarchy="1@1 1@2 1@1", num_heads=4, d_ff=48)
  x_BxLxD = jnp.ones((4, 8, WIDTH))
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  abstract = jax.eval_shape(body.init, jax.random.key(0), x_BxLxD)
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, DEFAULT_RULES)
  variables = jax.jit(body.init, out_shardings=shardings)(jax.random.key(0), x_BxLxD)
  wi = variables["params"]["pre"]["blocks"]["mlp"]["wi"]["kernel"].value
  assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")  # [layers, embed, mlp]
  assert len({shard.device for shard in wi.addressable_shards}) == 8
  with jax.set_mesh(mesh), nn.logical_axis_rules(DEFAULT_RULES):
    y_BxLxD = jax.jit(body.apply)(variables, x_BxLxD)
  np.testing.assert_allclose(y_BxLxD, body.apply(jax.device_get(variables), x_BxLxD), rtol=1e-5, atol=1e-5)


def test_module_keyword_arguments_are_the_block_settings_of_model_config():
  """LayerOptions' fields come from the one declaration ModelConfig and LayerConfig inherit: the same names and
  defaults, except the two a module takes from its input's width."""
  model_defaults = {name: getattr(ModelConfig(), name) for name in LAYER_FIELDS}
  option_defaults = {f.name: f.default for f in dataclasses.fields(hnn.LayerOptions) if f.name in LAYER_FIELDS}
  assert option_defaults.pop("d_model") is None and option_defaults.pop("d_ff") is None
  del model_defaults["d_model"], model_defaults["d_ff"]
  assert option_defaults == model_defaults
  assert [f.name for f in dataclasses.fields(hnn.LayerConfig)] == list(LAYER_FIELDS)


def test_dynamic_level_keyword_arguments_are_the_dynamic_settings_of_model_config():
  """Hourglass and DynamicShorten take the dynamic level's settings (its own and its predictors') from the one
  declaration ModelConfig inherits: the same names and defaults, and the LM forwards every one of them to its body."""
  from hourglass_jax.model.hourglass.dynamic.level import DYNAMIC_FIELDS
  from hourglass_jax.model.lm import build_body
  model_defaults = {name: getattr(ModelConfig(), name) for name in DYNAMIC_FIELDS}
  for module in (hnn.Hourglass, hnn.DynamicShorten):
    assert {f.name: f.default for f in dataclasses.fields(module) if f.name in DYNAMIC_FIELDS} == model_defaults
  changed = dict(boundaries="whitespace", segment_capacity=1.0, segment_pooling="linear", gumbel_temperature=0.7,
                 gumbel_evaluation="sample", boundary_loss_weight=0.3, boundary_bytes=" .", boundary_run_bytes=" ",
                 vocab_size=SMALL["vocab_size"])
  assert set(changed) == set(DYNAMIC_FIELDS)
  body = build_body(small_config(hierarchy="1@1 1@2 1@1", shorten="dynamic", upsample="repeat", **changed))
  assert {name: getattr(body, name) for name in DYNAMIC_FIELDS} == changed


def test_a_body_decodes_with_its_own_cache():
  """The public modules decode through `new_cache` and cache=/position=: a prompt then single rows equal the
  full pass at every position; a cache length that is no multiple of the shortening is refused."""
  body = hnn.Hourglass(hierarchy="1@1 1@3 1@1", shorten="attention_linear", upsample="attention_repeat", num_heads=2)
  x_BxLxD = jax.random.normal(jax.random.key(1), (2, 9, 16))
  variables = jax.jit(body.init)(jax.random.key(0), x_BxLxD)
  full_BxLxD = jax.jit(body.apply)(variables, x_BxLxD)
  y_BxPxD, cache = jax.jit(body.apply)(variables, x_BxLxD[:, :4], cache=body.new_cache(2, 9, 16))
  step = jax.jit(lambda cache, x_Bx1xD, t: body.apply(variables, x_Bx1xD, cache=cache, position=t))
  rows = [y_BxPxD]
  for t in range(4, 9):
    y_Bx1xD, cache = step(cache, x_BxLxD[:, t:t + 1], t)
    rows.append(y_Bx1xD)
  np.testing.assert_allclose(np.concatenate(rows, axis=1), full_BxLxD, atol=1e-5)
  with pytest.raises(ValueError, match="length=10 must be a positive multiple of 3"):
    body.new_cache(2, 10, 16)
