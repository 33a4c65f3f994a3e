"""The fallback on measured time (model/decode/fallback.measured) against a simulated clock: a pass and a plain step
of known cost and yield, so what the rule decides, and what it loses, is exact."""

import dataclasses

import pytest

from hourglass_jax.model.decode import fallback


@dataclasses.dataclass
class Simulated:
  """A generation of `total` tokens in one row: a plain step takes 1 s for 1 token; a pass `pass_cost` s for
  `per_pass(iteration)` tokens."""
  total: int
  pass_cost: float
  per_pass: object
  time: float = 0.0
  tokens: int = 0
  iterations: int = 0
  passes: int = 0

  def advance(self, state, speculating, count):
    for _ in range(count):
      if self.tokens >= self.total:
        break
      gained = self.per_pass(self.iterations) if speculating else 1
      self.time += self.pass_cost if speculating else 1.0
      self.tokens, self.iterations = min(self.tokens + gained, self.total), self.iterations + 1
      self.passes += speculating
    return state

  def progress(self, state):
    return self.tokens >= self.total, self.tokens, int(self.tokens < self.total), self.iterations

  def run(self):
    return fallback.measured(self.advance, None, self.progress, now=lambda: self.time)


@pytest.mark.parametrize("total", [160, 4000])
def test_a_draft_that_does_not_pay_costs_little_more_than_its_first_window(total):
  """1.28 tokens for a pass of 1.6 steps: plain after the first window; the re-checks lose at most 3% of the time
  besides that window's loss, well inside the 0.95x floor of the defaults (the draft still re-checked)."""
  sim = Simulated(total=total, pass_cost=1.6, per_pass=lambda i: 1.2 if i % 5 else 1.6)
  _, clock, to_plain, to_draft = sim.run()
  first_window_loss = fallback.WINDOW * (1.6 - 1.28)
  assert to_plain[0] == fallback.WINDOW and len(to_draft) >= 1
  assert sim.time <= sim.total * 1.03 + first_window_loss
  assert clock.measured_pass_cost == pytest.approx(1.6)


def test_a_draft_that_pays_runs_on_after_the_plain_probe():
  sim = Simulated(total=2000, pass_cost=1.3, per_pass=lambda i: 3)
  _, _, to_plain, to_draft = sim.run()
  assert to_plain == [fallback.WINDOW] and to_draft == [fallback.WINDOW + fallback.PROBE_STEPS]
  assert sim.time <= sim.total / 3 * 1.3 + fallback.PROBE_STEPS * (1 - 1.3 / 3) + 1e-9


def test_a_draft_that_starts_to_pay_comes_back():
  """Text turning repetitive at iteration 600: a re-check finds it and the draft runs on to the end."""
  sim = Simulated(total=3000, pass_cost=1.6, per_pass=lambda i: 1 if i < 600 else 4)
  _, _, to_plain, to_draft = sim.run()
  assert to_plain[0] == fallback.WINDOW and to_draft and to_draft[-1] > 600
  assert len(to_plain) == len(to_draft) and sim.passes * 4 > sim.total / 2
