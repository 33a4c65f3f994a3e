"""Speculative decoding: greedy output equals plain greedy decoding for every model kind and draft (the model's own
draft heads included), samples follow the target's distribution exactly (a chi-square test against the exact
next-token distributions, for each kind of draft), rows accept different counts in one batched pass, end tokens and
the fallback to plain decoding (on a threshold, and on measured time) behave, a draft equal to the target keeps every
proposal. The extension it verifies with is checked against the forward pass in test_decode.py."""

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from hourglass_jax.model import build_model, decode
from hourglass_jax.model.decode import drafts, fallback, sampling
from hourglass_jax.model.decode.drafts.ngram import continuation
from hourglass_jax.model.decode.filters import filter_logits
from hourglass_jax.testing import random_variables
from tests.helpers import (BOTTOMUP, DYNAMIC_GEN, GEN_CFG, LENGTH, MULTI_LEVEL, NESTED_CASES, RETINA, TOKENS, TOPDOWN,
                           VOCAB, model_and_params, multiscale_config, small_config)

VANILLA = small_config(kind="vanilla", hierarchy="2@1")
KINDS = {"hourglass": GEN_CFG, "dynamic": DYNAMIC_GEN, "nested dynamic": NESTED_CASES[1],
         "topdown": multiscale_config(TOPDOWN), "bottomup": multiscale_config(BOTTOMUP),
         "retina": multiscale_config(RETINA), "vanilla": VANILLA}
PROMPT = 4  # test_decode's greedy generation shapes: TOKENS[:, :4], LENGTH - 4 new tokens


def greedy(cfg, params, **speculation):
  """Greedy generation of test_decode's shapes; with a draft it speculates at every batch (fallback_below 0) unless
  told otherwise."""
  if speculation.get("draft") is not None:
    speculation.setdefault("fallback_below", 0)
  return sampling.generate(params, cfg, TOKENS[:, :PROMPT], max_new_tokens=LENGTH - PROMPT, rng=0, temperature=0.0,
                           **speculation)


@dataclasses.dataclass(frozen=True)
class Oracle(drafts.Draft):
  """Proposes the plain greedy tokens (its params), each row wrong at its own positions (one in 4), so rows keep
  different counts and every pass both keeps and rejects proposals."""
  name = "oracle"

  def propose(self, params, state, seq_BxL, length_B, key, num, pick):
    index_BxK = length_B[:, None] + jnp.arange(num)[None]
    truth_BxK = jnp.take_along_axis(params["tokens"], jnp.clip(index_BxK - PROMPT, 0, LENGTH - PROMPT - 1), axis=1)
    wrong_BxK = (index_BxK + jnp.arange(len(length_B))[:, None]) % 4 == 0
    return state, jnp.where(wrong_BxK, (truth_BxK + 1) % VOCAB, truth_BxK), None


@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_speculation_gives_plain_greedy_tokens_for_every_kind(kind):
  """A draft that is right but at its own positions in each row, at K=3 on 13 rows, and the n-gram draft (on the
  hourglass: it reads the tokens only, and each draft is one more compiled program per kind): the tokens of plain
  greedy decoding; with the first, rows keep different counts and passes reject proposals."""
  cfg = KINDS[kind]
  _, params = model_and_params(cfg)
  plain = greedy(cfg, params)
  if kind == "hourglass":
    np.testing.assert_array_equal(greedy(cfg, params, draft="ngram", draft_tokens=3), plain)
  tokens, spec = greedy(cfg, params, draft=Oracle(), draft_params={"tokens": plain}, draft_tokens=3,
                        fallback_below=0, return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  kept_B = np.asarray(spec.kept_B)
  assert len(set(kept_B.tolist())) > 1 and 0 < kept_B.min() and kept_B.max() < 3 * int(spec.passes)
  if kind in SELF_KINDS:  # the model drafting for itself, its heads reading the last layer
    heads_cfg, heads_params = with_heads(cfg, "last", identity=True)
    np.testing.assert_array_equal(greedy(heads_cfg, heads_params, draft="self", draft_tokens=3), plain)


# Kinds whose self-draft is checked above besides the hourglass below ('short') and vanilla (sampling): each is one
# more compiled program, so the kinds whose passes differ most (a dynamic level's per-row centre, retina's windows).
SELF_KINDS = ("dynamic", "retina")


def with_heads(cfg, tap: str, identity: bool = False):
  """(cfg with 3 draft heads reading `tap`, its params: cfg's own and drawn heads), so that the model's logits are
  cfg's and its plain programs are reused; `identity`: W2 = b2 = 0, each head starting as the next-token head of
  its input (proposals that the model sometimes keeps and sometimes rejects)."""
  _, params = model_and_params(cfg)
  heads_cfg = dataclasses.replace(cfg, draft_heads=3, draft_heads_from=tap, draft_loss_weight=0.3)
  heads = decode.unbox_params(random_variables(build_model(heads_cfg), TOKENS[:1], seed=5))["draft_heads"]
  if identity:
    heads = dict(heads, w2=jnp.zeros_like(heads["w2"]), b2=jnp.zeros_like(heads["b2"]))
  return heads_cfg, dict(params, draft_heads=heads)


def test_the_self_draft_keeps_only_right_proposals_and_gives_plain_greedy_tokens():
  """draft='self' on an hourglass whose heads read the shortened level: the plain greedy tokens, with every row
  keeping some proposals and rejecting others (a proposal accepted wrongly changes the tokens). Too many proposals
  for the heads, or a model without heads, is refused before anything compiles."""
  base = KINDS["hourglass"]
  cfg, params = with_heads(base, "short", identity=True)
  plain = greedy(base, model_and_params(base)[1])  # the same logits: the plain program of the tests above
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the draft model's size warning is not for the model drafting for itself
    tokens, spec = greedy(cfg, params, draft="self", draft_tokens=3, return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  kept_B, passes = np.asarray(spec.kept_B), int(spec.passes)
  assert (kept_B > 0).all() and (kept_B < 3 * passes).all() and kept_B.min() < kept_B.max()
  with pytest.raises(ValueError, match="draft_tokens <= 3"):
    greedy(cfg, params, draft="self", draft_tokens=4)
  with pytest.raises(ValueError, match="has none"):
    greedy(base, model_and_params(base)[1], draft="self")


@functools.cache
def draft_of(cfg, seed: int = 1):
  """A small random vanilla draft with cfg's vocabulary."""
  draft_cfg = small_config(kind="vanilla", hierarchy="1@1", d_model=16, num_heads=2, d_ff=32,
                           vocab_size=cfg.vocab_size)
  variables = build_model(draft_cfg).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))
  return drafts.Model(draft_cfg), decode.unbox_params(variables)


def test_a_draft_model_gives_plain_greedy_tokens_and_the_target_as_draft_keeps_every_proposal():
  cfg = KINDS["hourglass"]
  _, params = model_and_params(cfg)
  plain = greedy(cfg, params)
  draft, draft_params = draft_of(cfg)
  np.testing.assert_array_equal(greedy(cfg, params, draft=draft, draft_params=draft_params, draft_tokens=2), plain)
  tokens, spec = greedy(cfg, params, draft=drafts.Model(cfg), draft_params=params, draft_tokens=2,
                        return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  # 7 tokens after the prefill's in passes of 3: every proposal kept (the last pass's last token is cut).
  assert int(spec.passes) == 3 and (np.asarray(spec.kept_B) == 6).all()


def test_end_tokens_keep_the_plain_tokens():
  cfg = KINDS["hourglass"]
  _, params = model_and_params(cfg)
  end = int(np.asarray(greedy(cfg, params))[0, 2])
  with_end = greedy(cfg, params, end_token=end)
  np.testing.assert_array_equal(greedy(cfg, params, end_token=end, draft="ngram", draft_tokens=3), with_end)


LONG = 66  # new tokens: 8 passes of at most 4 tokens, RECHECK plain steps, and more to go


def test_below_the_threshold_it_decodes_plainly_then_tries_the_draft_again_and_keeps_the_plain_tokens():
  """fallback_below=4 at K=3 (4 tokens per pass only when every proposal is kept): plain decoding after the first
  window of passes, the draft back after RECHECK plain steps; the same program as fallback_below=0 (the threshold is
  an argument), and the same tokens."""
  cfg = VANILLA
  _, params = model_and_params(cfg)
  run = lambda below: sampling.generate(params, cfg, TOKENS[:, :PROMPT], max_new_tokens=LONG, rng=0, temperature=0.0,
                                        draft="ngram", draft_tokens=3, fallback_below=below, return_stats=True)
  always, spec = run(0)
  assert int(spec.steps) == 0 and int(spec.fell_back_at) == -1 and int(spec.passes) > fallback.WINDOW
  tokens, spec = run(4.0)
  np.testing.assert_array_equal(tokens, always)
  assert int(spec.fell_back_at) == fallback.WINDOW and int(spec.returns) >= 1
  assert int(spec.steps) >= fallback.RECHECK and int(spec.passes) > fallback.WINDOW
  assert 1 <= spec.tokens_per_pass < 4  # over the passes alone, not the plain steps


def test_by_default_it_speculates_on_measured_time_and_keeps_the_plain_tokens():
  """fallback_below None: timed windows of passes and of plain steps (fallback.measured), whichever is faster going
  on; the tokens are those of speculation throughout, and the stats carry the measured pass cost."""
  cfg = VANILLA
  _, params = model_and_params(cfg)
  always, _ = sampling.generate(params, cfg, TOKENS[:, :PROMPT], max_new_tokens=LONG, rng=0, temperature=0.0,
                                draft="ngram", draft_tokens=3, fallback_below=0, return_stats=True)
  tokens, spec = sampling.generate(params, cfg, TOKENS[:, :PROMPT], max_new_tokens=LONG, rng=0, temperature=0.0,
                                   draft="ngram", draft_tokens=3, return_stats=True)
  np.testing.assert_array_equal(tokens, always)
  assert spec.measured and spec.pass_cost > 0 and spec.seconds_per_step > 0
  assert int(spec.passes) >= fallback.WINDOW and int(spec.steps) >= 1 and int(spec.fell_back_at) == fallback.WINDOW
  line = spec.describe("ngram", 3)
  assert f"{int(spec.passes):,} passes of {spec.tokens_per_pass:.2f} tokens" in line and "(measured)" in line


def test_the_estimated_pass_cost_follows_the_backend_table():
  """The estimate used under an outer jit: the table's pass cost (K = 4) at its batches, interpolated in log(batch)
  between them, held beyond them, its part above one step scaled by K / 4."""
  table = fallback.PASS_COSTS["cpu"]
  for batch, cost in table.items():
    assert fallback.pass_cost(batch, 4, "cpu") == pytest.approx(cost)
  assert fallback.pass_cost(4, 4, "cpu") == pytest.approx((table[1] + table[16]) / 2)  # halfway in log(batch)
  assert fallback.pass_cost(10 ** 4, 4, "cpu") == pytest.approx(table[128])
  assert fallback.pass_cost(16, 2, "cpu") - 1 == pytest.approx((table[16] - 1) / 2)
  assert fallback.pass_cost(16, 4, "tpu") == fallback.pass_cost(16, 4, "gpu")  # TPUs are taken as GPUs


def test_the_ngram_draft_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
  seq = jnp.asarray([[1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3, 0, 0], [7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0],
                     [5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], jnp.int32)
  proposals = np.asarray(continuation(seq, jnp.asarray([12, 7, 2]), 4, 4))
  np.testing.assert_array_equal(proposals[0], [4, 5, 1, 2])  # "1 2 3" last followed by 4 (not 9)
  np.testing.assert_array_equal(proposals[1], [7, 7, 7, 7])  # a run goes on
  np.testing.assert_array_equal(proposals[2], [6, 6, 6, 6])  # nothing earlier: the last token repeated


# The statistical test: many rows of one prompt, 3 new tokens (the 2nd and 3rd from one speculative pass).
ROWS, PATTERN = 4000, np.array([3, 1, 4, 1, 5, 9, 3, 1, 4], np.int32)


def exact_distributions(cfg, params, filters):
  """The exact distributions after PATTERN under `filters` (temperature, top_k, top_p), from the forward pass over
  every continuation: of the 1st new token [V], of the 2nd given the 1st [V, V], and of the 3rd [V]."""
  model = build_model(cfg)
  probs = lambda tokens: np.asarray(jax.nn.softmax(filter_logits(
      jax.jit(model.apply)({"params": params}, jnp.asarray(tokens))[:, -1], **filters), axis=-1), np.float64)
  first_V = probs(PATTERN[None])[0]
  grid = np.arange(VOCAB)
  second_VxV = probs(np.concatenate([np.tile(PATTERN, (VOCAB, 1)), grid[:, None]], axis=1))
  pairs = np.stack(np.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, 2)
  third_VVxV = probs(np.concatenate([np.tile(PATTERN, (len(pairs), 1)), pairs], axis=1))
  joint_VV = (first_V[:, None] * second_VxV).reshape(-1)
  return first_V, second_VxV, (joint_VV[:, None] * third_VVxV).sum(axis=0)


def chi_square_p(counts, expected_probs):
  """p-value of the counts under the expected distribution, cells with fewer than 5 expected merged into one."""
  expected = expected_probs * counts.sum()
  small = expected < 5
  observed = np.append(counts[~small], counts[small].sum())
  expected = np.append(expected[~small], expected[small].sum())
  keep = expected > 0
  return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


@pytest.mark.parametrize("draft_name, filters", [
    ("ngram", dict(temperature=0.6)),
    ("model", dict(temperature=0.8, top_k=20, top_p=0.9)),
    ("self", dict(temperature=0.9, top_k=30)),
])
def test_speculative_samples_follow_the_target_distribution(draft_name, filters):
  """4000 rows of one prompt, 3 new tokens, the 2nd and 3rd from one speculative pass: a chi-square test of the
  2nd token in the rows of each of the 3 commonest 1st tokens against its exact conditional distribution, and of
  the 3rd token against its exact marginal. The draft is deterministic (n-gram: one proposal per 1st token) or a
  random model; a draft kept more often than min(1, p/q), or a rejection drawn from p instead of max(0, p - q),
  fails it."""
  cfg = VANILLA
  _, params = model_and_params(cfg)
  draft, draft_params = (draft_name, None) if draft_name != "model" else draft_of(cfg)
  heads_cfg, heads_params = with_heads(cfg, "last") if draft_name == "self" else (cfg, params)
  sample = lambda seed: np.asarray(sampling.generate(
      heads_params, heads_cfg, np.tile(PATTERN, (ROWS, 1)), max_new_tokens=3, rng=seed, draft=draft,
      draft_params=draft_params, draft_tokens=2, fallback_below=0, **filters))
  tokens = sample(11)
  np.testing.assert_array_equal(tokens, sample(11))  # a fixed seed gives a fixed sample
  first_V, second_VxV, third_V = exact_distributions(cfg, params, filters)  # the heads change no logit
  checks = [(f"token 2 after {t}", tokens[tokens[:, 0] == t, 1], second_VxV[t]) for t in np.argsort(-first_V)[:3]]
  for what, drawn, exact in checks + [("token 3", tokens[:, 2], third_V)]:
    counts = np.bincount(drawn, minlength=VOCAB)
    assert counts[exact == 0].sum() == 0, f"{what}: drawn where the filters leave no mass"
    assert chi_square_p(counts, exact) > 1e-4, f"{what} does not follow the target ({draft_name}, {len(drawn)} rows)"
