"""When to speculate: on measured time where generate runs eagerly, else on each backend's measured pass cost.

Measured (`generate` called eagerly, `hourglass-sample`): the loop runs in windows, each timed on the host. A window
of speculative passes and one of plain steps give each mode's seconds per generated token; the faster one runs on
in longer windows, and while plain decoding runs, a short window of passes re-checks the draft from time to time,
so a draft that starts to pay (text turning repetitive) comes back. A re-check comes once the plain decoding since
the last one took RECHECK_SHARE⁻¹ times what that one lost (its time over what plain steps would have taken for its
tokens), and after RECHECK plain steps at the soonest: a draft that does not pay costs about RECHECK_SHARE of the
time besides the first window.

Estimated (generate under your own jit, where nothing can be timed; or a given `fallback_below`): a pass is worth
`pass_cost` plain steps, so speculation pays above that many tokens per pass. After each WINDOW passes the tokens per
pass are judged; below the threshold the loop decodes plainly for RECHECK steps (doubling each time the draft falls
back again, up to RECHECK_MAX), then tries the draft again.
"""

import bisect
import dataclasses
import math
import time

import jax

WINDOW = 8  # passes judged together
RECHECK, RECHECK_MAX = 32, 256  # plain steps before the draft is tried again
PROBE_STEPS = 8  # the first measured window of plain steps
RECHECK_SHARE = 0.03  # the share of the plain decoding time that re-checking a slower draft may lose
GROW_MAX = 128  # the longest measured window

# What a pass proposing 4 tokens (K = 4) costs in plain steps, by backend and batch. CPU: a self-draft pass of
# configs/default.py:self_draft's model on 2 CPU cores (benchmarks/speculative.py's pass-cost rows,
# --pass_cost_batches). GPU: the offline compile's roofline estimate for an H100 of the device battery's model
# (configs/gpu.py, 5@1 24@3 5@1: a pass runs the shortened level, which a step runs once in 3; benchmarks/results/
# speculative_gpu.json, benchmarks/speculative.py --gpu_estimate). TPUs are taken as GPUs (not measured).
PASS_COSTS = {"cpu": {1: 3.4, 16: 3.8, 128: 2.7},
              "gpu": {1: 1.8, 16: 2.2, 128: 3.0}}


def pass_cost(batch: int, num: int, backend: str | None = None) -> float:
  """The estimated cost of a pass proposing `num` tokens at `batch` rows, in plain steps: PASS_COSTS interpolated in
  log(batch) (held at the ends), its part above one step scaled by num / 4."""
  table = PASS_COSTS.get(backend or jax.default_backend(), PASS_COSTS["gpu"])
  batches = sorted(table)
  i = bisect.bisect_left(batches, batch)
  if i == 0 or i == len(batches):
    cost = table[batches[min(i, len(batches) - 1)]]
  else:
    low, high = batches[i - 1], batches[i]
    share = (math.log(batch) - math.log(low)) / (math.log(high) - math.log(low))
    cost = table[low] + share * (table[high] - table[low])
  return 1.0 + (cost - 1.0) * num / 4


@dataclasses.dataclass
class Clock:
  """Seconds and progress of each mode over the measured windows (host side)."""
  seconds: dict = dataclasses.field(default_factory=lambda: {True: 0.0, False: 0.0})
  iterations: dict = dataclasses.field(default_factory=lambda: {True: 0, False: 0})
  rate: dict = dataclasses.field(default_factory=dict)  # mode -> seconds per token of a row, latest windows

  def record(self, speculating: bool, seconds: float, iterations: int, tokens: float) -> None:
    self.seconds[speculating] += seconds
    self.iterations[speculating] += iterations
    if tokens > 0:
      new = seconds / tokens
      old = self.rate.get(speculating)
      self.rate[speculating] = new if old is None else (old + new) / 2

  @property
  def measured_pass_cost(self) -> float | None:
    """A pass's measured seconds over a plain step's (None until both ran)."""
    if not (self.iterations[True] and self.iterations[False]):
      return None
    return (self.seconds[True] / self.iterations[True]) / (self.seconds[False] / self.iterations[False])

  @property
  def seconds_per_step(self) -> float:
    return self.seconds[False] / self.iterations[False] if self.iterations[False] else 0.0


def measured(advance, state, progress, now=time.perf_counter):
  """Runs the decode loop to the end in timed windows (module docstring). `advance(state, speculating, iterations)`
  runs a window; `progress(state)` -> (done, the tokens generated so far over all rows, the rows still generating,
  the loop's iterations so far), a host read; `now()` reads the clock in seconds. Returns (state, Clock, the
  iterations at which it switched to plain decoding, those at which it switched back to speculation)."""
  clock, to_plain, to_draft = Clock(), [], []
  done, tokens, active, iterations = progress(state)
  plan = [(True, WINDOW), (False, PROBE_STEPS)]  # both modes measured first
  size, mode = PROBE_STEPS, True
  plain_since, last = 0.0, (0.0, 0.0)  # plain seconds since the draft last ran; its last window's seconds, tokens
  while not done:
    lost = max(last[0] - last[1] * clock.rate.get(False, 0.0), 0.0)  # ... over plain steps for those tokens
    due = max(lost / RECHECK_SHARE, RECHECK * clock.seconds_per_step) - plain_since  # seconds to the re-check
    if plan:
      speculating, count = plan.pop(0)
    elif clock.rate.get(True, math.inf) < clock.rate.get(False, math.inf):
      speculating, count = True, size
    elif due <= 0:  # plain is faster: try the draft again now and then
      speculating, count = True, WINDOW
    else:
      speculating, count = False, max(1, min(size, math.ceil(due / max(clock.seconds_per_step, 1e-9))))
    if speculating != mode:
      (to_draft if speculating else to_plain).append(iterations)
      mode = speculating
    begin = now()
    state = advance(state, speculating, count)
    seconds = now() - begin
    now_done, now_tokens, now_active, now_iterations = progress(state)
    ran = now_iterations - iterations
    # A plain step's steady rate is a token per row: rows a pass left ahead wait for the others in the first plain
    # steps, which is not what plain decoding costs.
    gained = (now_tokens - tokens) / max(active, 1) if speculating else ran
    clock.record(speculating, seconds, ran, gained)
    if speculating:
      plain_since, last = 0.0, (seconds, gained)
    else:
      plain_since += seconds
    size = size if plan else min(2 * size, GROW_MAX)
    done, tokens, active, iterations = now_done, now_tokens, now_active, now_iterations
  return state, clock, to_plain, to_draft
