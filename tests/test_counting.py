import itertools

import jax
import jax.numpy as jnp
import pytest

from hourglass_jax.model import build_model
from hourglass_jax.model import counting
from hourglass_jax.model.config import MULTISCALE_KINDS, SHORTEN, UPSAMPLE
from tests.helpers import small_config


@pytest.mark.parametrize("position", ["rope", "relative"])
@pytest.mark.parametrize("shorten, upsample", list(itertools.product(SHORTEN, UPSAMPLE)))
def test_analytic_params_equal_initialised_params(shorten, upsample, position):
  for hierarchy in ("1@1 2@3 1@1", "2@1 1@2 3@6 0@2 1@1"):
    cfg = small_config(hierarchy=hierarchy, shorten=shorten, upsample=upsample, position=position)
    shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
    assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)


@pytest.mark.parametrize("overrides", [dict(draft_heads_from="short"), dict(kind="vanilla", hierarchy="2@1")])
def test_analytic_params_count_the_draft_heads(overrides):
  cfg = small_config(draft_heads=3, draft_loss_weight=0.3, **overrides)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
  assert "draft_heads" in shapes["params"]
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)


MULTISCALE = [
    dict(kind="topdown", scales="4,2,1", layers_per_scale="1,0,2"),
    dict(kind="topdown", scales="8,2,1", layers_per_scale="1,1,1", downsampler="conv", upsampler="repeat"),
    dict(kind="topdown", scales="6,1", layers_per_scale="2,1", downsampler="conv"),
    dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2"),
    dict(kind="bottomup", scales="8,2,1", layers_per_scale="1,2,0", heads_per_scale="2,1,1", downsampler="conv"),
    dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:2,2:6,6:12"),
    dict(kind="retina", hierarchy="1@1", scales="8,1", retina_windows="0:8,8:24", downsampler="conv"),
]


@pytest.mark.parametrize("position", ["rope", "relative"])
@pytest.mark.parametrize("overrides", MULTISCALE)
def test_analytic_params_equal_initialised_params_for_multiscale_kinds(overrides, position):
  cfg = small_config(position=position, **overrides)
  shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 24), jnp.int32))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)


def test_multiscale_parts_follow_the_scales():
  names = lambda **o: [p.name for p in counting.count(small_config(**o), seq_len=100)]
  assert names(**MULTISCALE[1]) == ["embed", "downsample@1->2", "downsample@2->8", "scale@8", "upsample@8->2",
                                    "merge@2", "scale@2", "upsample@2->1", "merge@1", "scale@1", "head"]
  assert names(**MULTISCALE[4]) == ["embed", "downsample@1->2", "scale@2", "downsample@2->8", "scale@8",
                                    "aggregate@1", "scale@1", "head"]
  assert names(**MULTISCALE[5]) == ["embed", "retina@1", "head"]
  assert [p.length for p in counting.count(small_config(**MULTISCALE[1]), seq_len=100)][3] == 104 // 8


def test_parts_follow_the_hierarchy():
  cfg = small_config(hierarchy="2@1 1@2 3@6 0@2 1@1")
  parts = counting.count(cfg, seq_len=100)
  assert [p.name for p in parts] == ["embed", "pre@1", "shorten@1->2", "pre@2", "shorten@2->6", "center@6",
                                     "upsample@6->2", "post@2", "upsample@2->1", "post@1", "head"]
  assert [p.length for p in parts if p.name.startswith(("pre", "center"))] == [102, 51, 17]
  assert [p.layers for p in parts if p.layers] == [2, 1, 3, 1]
  assert "total" in counting.format_table(cfg, 100)


@pytest.mark.parametrize("kind, hierarchy, shorten, upsample", [
    ("vanilla", "2@1", "avg", "repeat"),
    ("hourglass", "1@1 2@3 1@1", "linear", "linear"),
    ("hourglass", "1@1 2@3 1@1", "attention_avg", "attention_repeat"),
    ("topdown", "1@1", "avg", "repeat"),
    ("retina", "1@1", "avg", "repeat"),
])
def test_analytic_flops_match_xla_cost_analysis(kind, hierarchy, shorten, upsample):
  """Matmuls dominate at this size, so XLA's count (which adds elementwise ops) sits just above ours. XLA's cost
  analysis counts a loop body once, so the stacks are unrolled here (scan_unroll=0: same function, same params)."""
  multiscale = dict(scales="16,4,1", layers_per_scale="1,1,1", heads_per_scale="1,1,2", downsampler="conv",
                    retina_windows="0:8,8:32,32:96", position="relative" if kind == "retina" else "rope")
  cfg = small_config(kind=kind, hierarchy=hierarchy, shorten=shorten, upsample=upsample, d_model=256, scan_unroll=0,
                     num_heads=4, d_ff=1024, vocab_size=256, **(multiscale if kind in MULTISCALE_KINDS else {}))
  model = build_model(cfg)
  tokens = jnp.zeros((1, 96), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
  compiled = jax.jit(model.apply).lower(variables, tokens).compile()
  xla_flops = compiled.cost_analysis()["flops"]
  ours = counting.forward_flops(cfg, 96)
  assert 0.9 < ours / xla_flops <= 1.02, (ours, xla_flops)
