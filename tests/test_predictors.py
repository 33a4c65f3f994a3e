"""The boundary-predictor registry: each predictor keeps the parameter paths checkpoints were written with, the
decoding cache holds the chosen predictor's state only, and generic code reaches a predictor through the registry."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import traverse_util

from hourglass_jax.model import build_model, decode
from hourglass_jax.model.hourglass.dynamic.predictors import BOUNDARY_PREDICTORS, PREDICTORS, resolve
from tests.helpers import small_config

DYNAMIC = dict(hierarchy="1@1 2@3 1@1", shorten="dynamic", upsample="repeat", segment_pooling="linear")
POOL = {"body/shorten/pool/bias": (32,), "body/shorten/pool/kernel": (3, 32, 32)}
PARAMS = {  # body/shorten/... as the layout before the registry wrote them
    "whitespace": {},
    "gumbel": {"body/shorten/predictor/hidden/bias": (32,), "body/shorten/predictor/hidden/kernel": (32, 32),
               "body/shorten/predictor/logit/bias": (1,), "body/shorten/predictor/logit/kernel": (32, 1)},
    "routing": {"body/shorten/router/key/kernel": (32, 32), "body/shorten/router/query/kernel": (32, 32)},
    "entropy": {"body/shorten/entropy/head/bias": (50,), "body/shorten/entropy/head/kernel": (32, 50),
                "body/shorten/entropy/threshold": ()},
}
STATE = {"whitespace": {"run"}, "gumbel": set(), "routing": {"key", "seen"}, "entropy": {"entropy", "seen"}}


@pytest.mark.parametrize("predictor", BOUNDARY_PREDICTORS)
def test_each_predictor_keeps_its_parameter_paths_and_decodes_with_its_own_state(predictor):
  cfg = small_config(**DYNAMIC, boundaries=predictor)
  shapes = nn.meta.unbox(jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, 12), jnp.int32)))
  shapes = shapes["params"]
  flat = {"/".join(path): leaf.shape for path, leaf in traverse_util.flatten_dict(shapes).items()
          if "shorten" in path}
  assert flat == {**POOL, **PARAMS[predictor]}
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  state = decode.init_cache(cfg, 2, 12, params)["state"]["state"]  # after each of the 12 positions
  assert set(state) == {"sum", "size", "completed"} | STATE[predictor]
  assert all(leaf.shape[:2] == (2, 12) for leaf in state.values())


def test_the_registry_lists_every_predictor_in_order_and_names_the_choices():
  assert BOUNDARY_PREDICTORS == ("whitespace", "gumbel", "routing", "entropy")
  assert set(BOUNDARY_PREDICTORS) <= set(PREDICTORS)
  assert resolve("gumbel").cls is PREDICTORS["gumbel"] and resolve(resolve("gumbel")) == resolve("gumbel")
  with pytest.raises(ValueError, match="model.boundaries='spaces' is not supported; choose one of whitespace"):
    resolve("spaces", "model.boundaries")
