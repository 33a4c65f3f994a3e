"""The function-changing fields are derived from ModelConfig (model/config.py `function_fields`), and the derivation
is complete: a field that changes a kind's logits while every parameter shape stays must be one of that kind's
function fields (checkpoints compare them, since the shape check cannot see them); a field that changes nothing
for a kind must not be (it would refuse a harmless resume)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model.config import KINDS, function_fields
from hourglass_jax.model.config import function_changes
from hourglass_jax.train.checkpointing.checkpoint import check_same_function
from tests.helpers import SMALL

BASES = {
    "hourglass": dict(hierarchy="1@1 1@2 1@1", shorten="avg", upsample="repeat"),
    "vanilla": dict(hierarchy="2@1"),
    "topdown": dict(hierarchy="2@1", scales="4,1", layers_per_scale="1,1"),
    "bottomup": dict(hierarchy="2@1", scales="4,1", layers_per_scale="1,1"),
    "retina": dict(hierarchy="1@1", scales="4,1", retina_windows="0:4,4:8"),
    # An hourglass with learned shortening: its own fields matter only there (model.config.function_fields).
    "dynamic": dict(kind="hourglass", hierarchy="1@1 1@2 1@1", shorten="dynamic", upsample="repeat",
                    boundaries="whitespace"),
}
# A valid other value per field; `hierarchy` keeps its depth so that only a factor changes where a kind uses it.
OTHER = dict(vocab_size=60, d_model=48, num_heads=2, d_ff=96, shorten="attention_avg", upsample="none",
             position="relative", dropout=0.1, attention_dropout=0.2, dtype="bfloat16", attention_impl="reference",
             layer_norm_eps=0.1, rope_base=50.0, scales="2,1", layers_per_scale="1,2", heads_per_scale="1,3",
             downsampler="conv", upsampler="repeat", retina_windows="0:3,3:8", remat_policy="nothing_saveable",
             scan_unroll=0, boundaries="gumbel", boundary_bytes=" .",
             boundary_run_bytes=" \n\t.,;:!?\"'()[]{}-/", segment_capacity=0.2, gumbel_temperature=1.0,
             boundary_loss_weight=0.5, segment_pooling="linear",
             gumbel_evaluation="sample", draft_heads=2, draft_heads_from="short", draft_loss_weight=0.5)
OTHER_HIERARCHY = {"hourglass": "1@1 1@4 1@1", "dynamic": "1@1 1@4 1@1", "vanilla": "3@1", "topdown": "3@1",
                   "bottomup": "3@1", "retina": "2@1"}
# Same function by design; bfloat16 only rounds.
EXECUTION = {"dropout": 0.0, "attention_dropout": 0.0, "attention_impl": 1e-5, "remat_policy": 0.0,
             "scan_unroll": 1e-5, "dtype": 0.1}
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 16)), jnp.int32)


def config(kind, **overrides):
  return ModelConfig(**{**SMALL, "kind": kind, **BASES[kind], **overrides})


def valid(kind, field, other) -> bool:
  """Whether `kind`'s base takes the other value of `field` (a dynamic level refuses upsample='none')."""
  try:
    config(kind, **{field: other})
  except ValueError:
    return False
  return True


def listed(kind):
  return function_fields("hourglass") + function_fields(kind) if kind == "dynamic" else function_fields(kind)


@functools.cache
def shapes(cfg):
  return jax.tree.map(lambda a: a.shape, jax.eval_shape(build_model(cfg).init, jax.random.key(0), TOKENS))


def logits_of(cfg, variables):
  """Op by op: every config here has the same shapes, so after the first one each op's compiled kernel is reused,
  where compiling each config's program would cost a second or more."""
  with jax.disable_jit():
    return build_model(cfg).apply(variables, TOKENS)


SLOW = ("hourglass", "bottomup", "dynamic")  # the slowest three


@pytest.mark.parametrize("kind", [pytest.param(kind, marks=pytest.mark.slow) if kind in SLOW else kind
                                  for kind in (*KINDS, "dynamic")])
def test_function_fields_are_exactly_the_fields_that_change_the_function_but_no_shape(kind):
  base = config(kind)
  variables = jax.jit(build_model(base).init)(jax.random.key(0), TOKENS)
  logits = logits_of(base, variables)
  difference = lambda **changes: float(jnp.max(jnp.abs(logits_of(config(kind, **changes), variables) - logits)))
  others = {f.name: OTHER_HIERARCHY[kind] if f.name == "hierarchy" else OTHER[f.name]
            for f in dataclasses.fields(ModelConfig) if f.name != "kind"}
  same_shape = [field for field, other in others.items()
                if valid(kind, field, other) and shapes(config(kind, **{field: other})) == shapes(base)]
  assert {"layer_norm_eps", "rope_base"} <= set(same_shape)  # the two that no shape reveals for any kind
  for field in same_shape:
    if field in listed(kind):
      assert difference(**{field: others[field]}) > 1e-4, f"{kind}: {field} is listed but changes nothing"
    elif field in EXECUTION:
      assert difference(**{field: others[field]}) <= EXECUTION[field], (kind, field)
  unlisted = {field: others[field] for field in same_shape if field not in listed(kind) + tuple(EXECUTION)}
  if difference(**unlisted) > 1e-6:  # all together change nothing, or name the field that does
    culprits = [field for field, other in unlisted.items() if difference(**{field: other}) > 1e-6]
    pytest.fail(f"{kind}: {culprits} change the logits at equal shapes but are not function fields")


def test_a_changed_rope_base_is_named_when_a_checkpoint_is_loaded():
  saved = dataclasses.asdict(config("hourglass"))
  assert function_changes(saved, dict(saved, rope_base=500.0)) == ["model.rope_base: checkpoint 10000.0, config 500.0"]
  with pytest.raises(ValueError, match=r"model.rope_base: checkpoint 10000.0, config 500.0.*allow_settings_change"):
    check_same_function(saved, dict(saved, rope_base=500.0), "the checkpoint")
  assert function_changes(saved, dict(saved, scales="2,1")) == []  # hourglass does not read scales
  assert function_changes({k: v for k, v in saved.items() if k != "rope_base"}, dict(saved, rope_base=5.0)) == []
