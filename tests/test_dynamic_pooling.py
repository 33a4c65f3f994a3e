"""Dynamic shortening ops (model/hourglass/dynamic.py): segment ids, pooling and up-sampling against a NumPy
transcription of their definitions, the merged tail past max_segments, and causality by perturbation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.hourglass.dynamic import (pool_segments, segment_ends, segment_ids, straight_through_weights,
                                                   upsample_segments,
                                                   whitespace_boundaries)

RNG = np.random.default_rng(0)


def reference(x_LxD, b_L, m):
  """One row, by the definitions: segments split after each boundary, those from m-1 on merged."""
  ids = np.minimum(np.concatenate([[0], np.cumsum(b_L)[:-1]]), m - 1)
  z = np.zeros((m, x_LxD.shape[1]), np.float32)
  ends = np.full(m, len(b_L))
  for j in range(m):
    rows = np.flatnonzero(ids == j)
    if len(rows):
      z[j] = x_LxD[rows].mean(axis=0)
      if j < m - 1 and b_L[rows[-1]]:
        ends[j] = rows[-1]
  up = np.stack([z[i - 1] if i > 0 else np.zeros_like(z[0]) for i in ids])
  return ids, z, ends, up


@pytest.mark.parametrize("max_segments", [2, 5, 40])  # 5 and 2 overflow into the merged tail; 40 leaves it empty
def test_ops_follow_their_definitions(max_segments):
  x_BxLxD = RNG.normal(size=(3, 29, 4)).astype(np.float32)
  b_BxL = RNG.random((3, 29)) < 0.3
  b_BxL[1] = False  # a row with one open segment
  ids = segment_ids(jnp.asarray(b_BxL), max_segments)
  z, count = pool_segments(jnp.asarray(x_BxLxD), ids, max_segments)
  ends, completed = segment_ends(jnp.asarray(b_BxL), ids, max_segments)
  up = upsample_segments(z, ids)
  for row in range(3):
    want_ids, want_z, want_ends, want_up = reference(x_BxLxD[row], b_BxL[row], max_segments)
    np.testing.assert_array_equal(ids[row], want_ids)
    np.testing.assert_allclose(z[row], want_z, atol=1e-6)
    np.testing.assert_array_equal(count[row], np.bincount(want_ids, minlength=max_segments))
    np.testing.assert_array_equal(ends[row], want_ends)
    np.testing.assert_array_equal(completed[row], want_ends < 29)
    np.testing.assert_allclose(up[row], want_up, atol=1e-6)


def causal_model(x_BxLxD, b_BxL, max_segments=6):
  """Shorten dynamically, mix the segments causally (a running mean over segment index), up-sample, add x."""
  ids = segment_ids(b_BxL, max_segments)
  z, _ = pool_segments(x_BxLxD, ids, max_segments)
  y = jnp.cumsum(z, axis=1) / jnp.arange(1, max_segments + 1)[None, :, None]
  return upsample_segments(y, ids) + x_BxLxD


def test_a_position_depends_only_on_earlier_positions_and_boundaries():
  """Changing x[p] or the boundary decision at p (the merged tail included: few segments) leaves every output
  before p alone, and the output at p sees x[p] only through the residual."""
  run = jax.jit(causal_model)
  x_BxLxD = jnp.asarray(RNG.normal(size=(2, 24, 3)), jnp.float32)
  b_BxL = jnp.asarray(RNG.random((2, 24)) < 0.4)
  base = np.asarray(run(x_BxLxD, b_BxL))
  for p in (0, 5, 11, 23):
    moved = np.asarray(run(x_BxLxD.at[:, p].add(3.0), b_BxL.at[:, p].set(~b_BxL[:, p])))
    np.testing.assert_array_equal(moved[:, :p], base[:, :p])
    np.testing.assert_allclose(moved[:, p] - base[:, p], 3.0, atol=1e-5)  # only the residual changed at p
  later = np.asarray(run(x_BxLxD.at[:, 3].add(3.0), b_BxL))
  assert np.abs(later[:, 4:] - base[:, 4:]).max() > 1e-3  # and the shortened path does carry information forward


def test_whitespace_boundaries_close_words():
  text = b"The quick, brown fox.\n"
  tokens = jnp.asarray(np.frombuffer(text, np.uint8).astype(np.int32))[None]
  marked = bytes(c for byte, b in zip(text, np.asarray(whitespace_boundaries(tokens))[0])
                 for c in ([byte, ord("|")] if b else [byte]))
  assert marked == b"The |quick,| |brown |fox.|\n|"
  assert not np.asarray(whitespace_boundaries(jnp.asarray([[-1, 256, 32]])))[0, :2].any()


def test_max_segments_below_two_is_refused():
  with pytest.raises(ValueError, match="max_segments=1 must be an integer >= 2"):
    segment_ids(jnp.zeros((1, 4), bool), 1)


def test_a_batch_sharded_over_devices_needs_no_communication():
  """Segment sums run per row, so a data-parallel batch pools and up-samples without any collective."""
  mesh = jax.make_mesh((len(jax.devices()),), ("data",))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  batch = 2 * len(jax.devices())

  def shorten_and_back(x_BxLxD, b_BxL):
    ids = segment_ids(b_BxL, 9)
    z, _ = pool_segments(x_BxLxD, ids, 9, straight_through_weights(b_BxL))
    return upsample_segments(z, ids, straight_through_weights(b_BxL))

  program = jax.jit(shorten_and_back, in_shardings=(rows, rows), out_shardings=rows).lower(
      jax.ShapeDtypeStruct((batch, 32, 8), jnp.float32), jax.ShapeDtypeStruct((batch, 32), jnp.bool_)).compile()
  assert len(jax.devices()) > 1
  assert not [op for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute")
              if op in program.as_text()]
