import itertools

import jax
import jax.numpy as jnp
import pytest

from hourglass_jax.model import build_model
from hourglass_jax.model import counting
from hourglass_jax.model.config import SHORTEN, UPSAMPLE
from tests.helpers import small_config


@pytest.mark.parametrize("position", ["rope", "relative"])
@pytest.mark.parametrize("shorten, upsample", list(itertools.product(SHORTEN, UPSAMPLE)))
def test_analytic_params_equal_initialised_params(shorten, upsample, position):
  for hierarchy in ("1@1 2@3 1@1", "2@1 1@2 3@6 0@2 1@1"):
    cfg = small_config(hierarchy=hierarchy, shorten=shorten, upsample=upsample, position=position)
    shapes = jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32))
    assert sum(x.size for x in jax.tree.leaves(shapes)) == counting.total_params(cfg)


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
])
def test_analytic_flops_match_xla_cost_analysis(kind, hierarchy, shorten, upsample):
  """Matmuls dominate at this size, so XLA's count (which adds elementwise ops) sits just above ours."""
  cfg = small_config(kind=kind, hierarchy=hierarchy, shorten=shorten, upsample=upsample, d_model=256,
                     num_heads=4, d_ff=1024, vocab_size=256)
  model = build_model(cfg)
  tokens = jnp.zeros((1, 96), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), tokens)
  compiled = jax.jit(model.apply).lower(variables, tokens).compile()
  xla_flops = compiled.cost_analysis()["flops"]
  ours = counting.forward_flops(cfg, 96)
  assert 0.9 < ours / xla_flops <= 1.02, (ours, xla_flops)
