"""Dynamic shortening ops (model/hourglass/dynamic/segments.py): segment ids, pooling and up-sampling against a NumPy
transcription of their definitions, the merged tail past max_segments, and causality by perturbation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model.hourglass import whitespace_boundaries
from hourglass_jax.model.hourglass.dynamic.segments import (completed_segments, pool_segments, positions_in_segments,
                                                            segment_boundary_probs, segment_ids, smooth_segments,
                                                            straight_through_weights, upsample_segments)
from hourglass_jax.model.hourglass.dynamic.predictors.routing import ratio_loss

RNG = np.random.default_rng(0)


def reference(x_LxD, b_L, m):
  """One row, by the definitions: segments split after each boundary, those from m-1 on merged; a position reads
  the newest segment completed at or before it."""
  ids = np.minimum(np.concatenate([[0], np.cumsum(b_L)[:-1]]), m - 1)
  z = np.zeros((m, x_LxD.shape[1]), np.float32)
  ends = np.full(m, len(b_L))
  for j in range(m):
    rows = np.flatnonzero(ids == j)
    if len(rows):
      z[j] = x_LxD[rows].mean(axis=0)
      if j < m - 1 and b_L[rows[-1]]:
        ends[j] = rows[-1]
  completed = np.array([sum(j < m - 1 and ends[j] <= t for j in range(m)) for t in range(len(b_L))])
  up = np.stack([z[r - 1] if r > 0 else np.zeros_like(z[0]) for r in completed])
  return ids, z, completed, up


@pytest.mark.parametrize("max_segments", [2, 5, 40])  # 5 and 2 overflow into the merged tail; 40 leaves it empty
def test_ops_follow_their_definitions(max_segments):
  x_BxLxD = RNG.normal(size=(3, 29, 4)).astype(np.float32)
  b_BxL = RNG.random((3, 29)) < 0.3
  b_BxL[1] = False  # a row with one open segment
  ids = segment_ids(jnp.asarray(b_BxL), max_segments)
  z, count = pool_segments(jnp.asarray(x_BxLxD), ids, max_segments)
  completed_BxL = completed_segments(jnp.asarray(b_BxL), max_segments)
  up = upsample_segments(z, completed_BxL)
  for row in range(3):
    want_ids, want_z, want_completed, want_up = reference(x_BxLxD[row], b_BxL[row], max_segments)
    np.testing.assert_array_equal(ids[row], want_ids)
    np.testing.assert_allclose(z[row], want_z, atol=1e-6)
    np.testing.assert_array_equal(count[row], np.bincount(want_ids, minlength=max_segments))
    np.testing.assert_array_equal(completed_BxL[row], want_completed)
    np.testing.assert_allclose(up[row], want_up, atol=1e-6)


def test_positions_in_segments_count_from_each_start_and_continue_an_open_segment():
  starts_BxL = RNG.random((3, 17)) < 0.3
  starts_BxL[:, 0] = [True, False, False]  # rows 1 and 2 continue a segment opened before them (decoding)
  starts_BxL[2] = False
  open_B = np.array([0, 5, 2])
  got = positions_in_segments(jnp.asarray(starts_BxL), jnp.asarray(open_B))
  for row in range(3):
    want, count = [], open_B[row] - 1
    for start in starts_BxL[row]:
      count = 0 if start else count + 1
      want.append(count)
    np.testing.assert_array_equal(got[row], want)
  np.testing.assert_array_equal(positions_in_segments(jnp.asarray(starts_BxL[:1]))[0], got[0])


def causal_model(x_BxLxD, b_BxL, max_segments=6):
  """Shorten dynamically, mix the segments causally (a running mean over segment index), up-sample, add x."""
  ids = segment_ids(b_BxL, max_segments)
  z, _ = pool_segments(x_BxLxD, ids, max_segments)
  y = jnp.cumsum(z, axis=1) / jnp.arange(1, max_segments + 1)[None, :, None]
  return upsample_segments(y, completed_segments(b_BxL, max_segments)) + x_BxLxD


def test_a_position_depends_only_on_earlier_positions_and_boundaries():
  """Changing x[p] or the boundary decision at p (the merged tail included: few segments) leaves every output
  before p alone; a position that closes a segment reads it at once, x[p] included."""
  run = jax.jit(causal_model)
  x_BxLxD = jnp.asarray(RNG.normal(size=(2, 24, 3)), jnp.float32)
  b_BxL = jnp.asarray(RNG.random((2, 24)) < 0.4).at[:, 5].set(True).at[:, 11].set(False)
  base = np.asarray(run(x_BxLxD, b_BxL))
  for p in (0, 5, 11, 23):
    moved = np.asarray(run(x_BxLxD.at[:, p].add(3.0), b_BxL.at[:, p].set(~b_BxL[:, p])))
    np.testing.assert_array_equal(moved[:, :p], base[:, :p])
  closing = np.asarray(run(x_BxLxD.at[:, 5].add(3.0), b_BxL))  # b_5 = 1: position 5 reads the segment it closed
  assert np.abs(closing[:, 5] - base[:, 5] - 3.0).max() > 1e-3
  open_at = np.asarray(run(x_BxLxD.at[:, 11].add(3.0), b_BxL))  # b_11 = 0: x[11] reaches 11 by the residual only
  np.testing.assert_allclose(open_at[:, 11] - base[:, 11], 3.0, atol=1e-5)
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


def test_routing_smoothing_and_start_probabilities_follow_their_definitions():
  """H-Net's pieces: P_j is the probability at the position that closes segment j (0 for the open one);
  ybar_j = P_j y_j + (1 - P_j) ybar_{j-1}; the ratio loss is 1 at the target rate and larger elsewhere."""
  b_BxL = RNG.random((2, 17)) < 0.3
  b_BxL[:, -1] = False  # the last segment stays open
  p_BxL = RNG.random((2, 17)).astype(np.float32)
  ids = segment_ids(jnp.asarray(b_BxL), 9)
  probs = np.asarray(segment_boundary_probs(jnp.asarray(p_BxL), jnp.asarray(b_BxL), ids, 9))
  y_BxMxD = RNG.normal(size=(2, 9, 3)).astype(np.float32)
  smoothed = np.asarray(smooth_segments(jnp.asarray(y_BxMxD), jnp.asarray(probs)))
  for row in range(2):
    members = [np.flatnonzero(np.asarray(ids[row]) == j) for j in range(9)]
    expected_P = np.array([p_BxL[row, m[-1]] if len(m) and b_BxL[row, m[-1]] else 0.0 for m in members],
                          np.float32)
    np.testing.assert_allclose(probs[row], expected_P, rtol=1e-6)
    ybar = np.zeros(3, np.float32)
    for j in range(9):
      ybar = expected_P[j] * y_BxMxD[row, j] + (1 - expected_P[j]) * ybar
      np.testing.assert_allclose(smoothed[row, j], ybar, rtol=1e-5, atol=1e-6)
  at_target = ratio_loss(jnp.asarray([[1.0, 0, 0, 0]]), jnp.full((1, 4), 0.25), 4)
  np.testing.assert_allclose(at_target, 1.0, rtol=1e-6)
  assert ratio_loss(jnp.asarray([[1.0, 1, 0, 0]]), jnp.full((1, 4), 0.5), 4) > 1.0
  assert ratio_loss(jnp.zeros((1, 4)), jnp.full((1, 4), 0.1), 4) > 1.0
