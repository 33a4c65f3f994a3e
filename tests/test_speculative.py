"""Speculative decoding: greedy output equals plain greedy decoding for every model kind and draft, samples follow
the target's distribution exactly (a chi-square test against the exact next-token distributions), rows accept
different counts, end tokens and the fallback to plain decoding behave, a draft equal to the target keeps every
proposal. The extension it verifies with is checked against the forward pass in test_decode.py."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from hourglass_jax.model import build_model, decode
from hourglass_jax.model.decode import drafts, sampling
from hourglass_jax.model.decode.drafts.ngram import continuation
from hourglass_jax.model.decode.filters import filter_logits
from tests.helpers import small_config
from tests.test_decode import (BOTTOMUP, DYNAMIC_GEN, GEN_CFG, LENGTH, MULTI_LEVEL, NESTED_CASES, RETINA, TOKENS,
                               TOPDOWN, VOCAB, model_and_params, multiscale_config)

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
  """The n-gram draft, and a draft that is right but at its own positions in each row, at K=3 on 13 rows: the
  tokens of plain greedy decoding; with the second, rows keep different counts and passes reject proposals."""
  cfg = KINDS[kind]
  _, params = model_and_params(cfg)
  plain = greedy(cfg, params)
  np.testing.assert_array_equal(greedy(cfg, params, draft="ngram", draft_tokens=3), plain)
  tokens, spec = greedy(cfg, params, draft=Oracle(), draft_params={"tokens": plain}, draft_tokens=3,
                        fallback_below=0, return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  kept_B = np.asarray(spec.kept_B)
  assert len(set(kept_B.tolist())) > 1 and 0 < kept_B.min() and kept_B.max() < 3 * int(spec.passes)


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


def test_end_tokens_and_the_fallback_to_plain_decoding_keep_the_plain_tokens():
  cfg = KINDS["hourglass"]
  _, params = model_and_params(cfg)
  plain = np.asarray(greedy(cfg, params))
  end = int(plain[0, 2])
  with_end = greedy(cfg, params, end_token=end)
  np.testing.assert_array_equal(greedy(cfg, params, end_token=end, draft="ngram", draft_tokens=3), with_end)
  # Asking for more tokens per pass than a pass can give: plain decoding after the warm-up passes.
  tokens, spec = greedy(cfg, params, draft="ngram", draft_tokens=3, fallback_below=4.0, return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  assert int(spec.fell_back_at) == sampling.FALLBACK_WARMUP or int(spec.passes) < sampling.FALLBACK_WARMUP


def test_by_default_a_batch_of_one_speculates_and_larger_batches_on_a_cpu_decode_plainly():
  """generate's default fallback_below: speculation at batch 1; for batches > 1 on a CPU, where a pass costs more
  plain steps than it can give tokens, plain decoding from the start, which the stats say (no pass, fell back at 0)."""
  cfg = KINDS["hourglass"]
  _, params = model_and_params(cfg)
  plain = np.asarray(greedy(cfg, params))
  tokens, spec = greedy(cfg, params, draft="ngram", fallback_below=None, return_stats=True)
  np.testing.assert_array_equal(tokens, plain)
  off = jax.default_backend() == "cpu"
  assert sampling.speculation_pays(len(plain)) is not off and sampling.speculation_pays(1)
  assert (int(spec.passes) == 0 and int(spec.fell_back_at) == 0) is off and spec.tokens_per_pass >= 1
  np.testing.assert_array_equal(spec.generated_B, LENGTH - PROMPT)
  one, spec = sampling.generate(params, cfg, TOKENS[:1, :PROMPT], max_new_tokens=LENGTH - PROMPT, rng=0,
                                temperature=0.0, draft="ngram", return_stats=True)
  np.testing.assert_array_equal(one, plain[:1])
  assert 0 < int(spec.passes) < LENGTH - PROMPT


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
])
def test_speculative_samples_follow_the_target_distribution(draft_name, filters):
  """4000 rows of one prompt, 3 new tokens, the 2nd and 3rd from one speculative pass: a chi-square test of the
  2nd token in the rows of each of the 3 commonest 1st tokens against its exact conditional distribution, and of
  the 3rd token against its exact marginal. The draft is deterministic (n-gram: one proposal per 1st token) or a
  random model; a draft kept more often than min(1, p/q), or a rejection drawn from p instead of max(0, p - q),
  fails it."""
  cfg = VANILLA
  _, params = model_and_params(cfg)
  draft, draft_params = (draft_name, None) if draft_name == "ngram" else draft_of(cfg)
  sample = lambda seed: np.asarray(sampling.generate(
      params, cfg, np.tile(PATTERN, (ROWS, 1)), max_new_tokens=3, rng=seed, draft=draft, draft_params=draft_params,
      draft_tokens=2, fallback_below=0, **filters))
  tokens = sample(11)
  np.testing.assert_array_equal(tokens, sample(11))  # a fixed seed gives a fixed sample
  first_V, second_VxV, third_V = exact_distributions(cfg, params, filters)
  checks = [(f"token 2 after {t}", tokens[tokens[:, 0] == t, 1], second_VxV[t]) for t in np.argsort(-first_V)[:3]]
  for what, drawn, exact in checks + [("token 3", tokens[:, 2], third_V)]:
    counts = np.bincount(drawn, minlength=VOCAB)
    assert counts[exact == 0].sum() == 0, f"{what}: drawn where the filters leave no mass"
    assert chi_square_p(counts, exact) > 1e-4, f"{what} does not follow the target ({draft_name}, {len(drawn)} rows)"
