"""'whitespace' with run bytes (model.boundary_run_bytes): a run of them closes one segment, after its first byte.
The exact cuts on a line of code, the rate on the embedded corpus, the model's own cuts, exact causality by
perturbation, and clear errors. Cached decoding is checked with the other predictors in test_decode.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax import nn as hnn
from hourglass_jax.data.embedded import stdlib_bytes
from hourglass_jax.model import build_model
from hourglass_jax.model.hourglass import CODE_BOUNDARY_BYTES, WHITESPACE_BYTES, whitespace_boundaries
from hourglass_jax.testing import random_variables
from tests.helpers import assert_causal, small_config

DYNAMIC = dict(hierarchy="1@1 2@3 1@1", shorten="dynamic", upsample="repeat", boundaries="whitespace")
# Every default boundary byte merges its runs: over random tokens of 50 ids, about one pair in 17 is a run.
RUNS = dict(DYNAMIC, boundary_run_bytes=WHITESPACE_BYTES.decode())
CODE = b"def f(a,  b):\n        return a * b\n"


def segments(text: bytes, *args) -> list[bytes]:
  """`text` cut after each of whitespace_boundaries(text, *args)."""
  bytes_L = np.frombuffer(text, np.uint8)
  cuts = np.flatnonzero(np.asarray(whitespace_boundaries(jnp.asarray(bytes_L[None].astype(np.int32)), *args))[0])
  return [bytes(part) for part in np.split(bytes_L, cuts + 1) if len(part)]


def test_a_run_of_spaces_closes_one_segment_after_its_first_space():
  assert segments(CODE) == [b"def ", b"f(", b"a,", b" ", b" ", b"b)", b":", b"\n", *[b" "] * 8, b"return ", b"a ",
                            b"* ", b"b\n"]
  assert segments(CODE, CODE_BOUNDARY_BYTES, b" ") == [b"def ", b"f(", b"a,", b" ", b" b)", b":", b"\n", b" ",
                                                       b"       return ", b"a ", b"*", b" ", b"b\n"]


def test_code_bytes_with_space_runs_cut_the_embedded_corpus_near_one_byte_in_four():
  """The preset the study runs on code: every byte of CODE_BOUNDARY_BYTES cuts 0.4 of Python source, and merging
  runs of spaces (indentation) brings it to about 1/4, where fixed shortening by 4 is."""
  tokens_1xL = jnp.asarray(stdlib_bytes(2_000_000)[None].astype(np.int32))
  every = float(whitespace_boundaries(tokens_1xL, CODE_BOUNDARY_BYTES).mean())
  merged = float(whitespace_boundaries(tokens_1xL, CODE_BOUNDARY_BYTES, b" ").mean())
  assert every > 0.38 and abs(merged - 0.25) < 0.025, (every, merged)


def test_the_model_cuts_where_whitespace_boundaries_merges_runs():
  model = build_model(small_config(**RUNS))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (8, 24)), jnp.int32)
  _, sown = model.apply(random_variables(model, tokens), tokens, mutable=["intermediates"])
  cuts = np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])
  merged = np.asarray(whitespace_boundaries(tokens, WHITESPACE_BYTES, WHITESPACE_BYTES))
  assert (merged != np.asarray(whitespace_boundaries(tokens))).any()  # else no run was merged
  np.testing.assert_array_equal(cuts, merged)


@pytest.mark.parametrize("length, position", [(12, "rope"), pytest.param(11, "relative", marks=pytest.mark.slow)])
def test_merging_runs_stays_causal(length, position):
  assert_causal(small_config(**RUNS, position=position), length)


def test_run_bytes_outside_the_boundary_bytes_are_named():
  with pytest.raises(ValueError, match=r"boundary_run_bytes=' x' has 'x', not in model.boundary_bytes"):
    small_config(**DYNAMIC, boundary_run_bytes=" x")


def test_runs_for_a_learned_predictor_or_of_another_shape_are_refused():
  x_BxLxD = jnp.zeros((2, 12, 16))
  runs_BxL = jnp.zeros((2, 12), bool)
  gumbel = hnn.Hourglass(hierarchy="1@1 1@3 1@1", shorten="dynamic", upsample="repeat", boundaries="gumbel",
                         num_heads=2)
  with pytest.raises(ValueError, match="only 'whitespace' reads"):
    gumbel.init(jax.random.key(0), x_BxLxD, runs_BxL=runs_BxL)
  given = gumbel.clone(boundaries="whitespace")
  with pytest.raises(ValueError, match="runs_BxL has shape"):
    given.init(jax.random.key(0), x_BxLxD, boundaries_BxL=runs_BxL, runs_BxL=runs_BxL[:, :6])
