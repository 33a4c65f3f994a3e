"""Hourglass hierarchy notation: '5@1 24@3 5@1' = N layers at cumulative shortening factor F; and the Hourglass
body's settings (`HourglassSettings`), which the body and its resampling modules read."""

import dataclasses
import re

from hourglass_jax.model.layer_config import setting

_TOKEN = re.compile(r"^(\d+)@(\d+)$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HourglassSettings:
  """The Hourglass body's settings (the paper's enwik8 model): `ModelConfig` inherits them, `Hourglass` takes them."""
  # the levels, N layers at cumulative shortening factor F each ("N@F ..."); vanilla and retina: one level, its depth
  hierarchy: str = setting("5@1 24@3 5@1", function_of=("hourglass",))
  shorten: str = setting("attention_avg", function_of=("hourglass",))  # SHORTEN_METHODS, or 'dynamic' (learned)
  upsample: str = setting("attention_repeat", function_of=("hourglass",))  # UPSAMPLE_METHODS


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Parsed hierarchy: `levels[i] = (num_layers, factor)` from the outer @1 level inward to the center.

  `post_layers[i]` is the layer count of level i on the way back up, for i < depth (asymmetric counts allowed).
  """
  levels: tuple[tuple[int, int], ...]
  post_layers: tuple[int, ...]

  @property
  def depth(self) -> int:
    """Number of shortening steps (0 for a vanilla stack)."""
    return len(self.levels) - 1

  @property
  def total_factor(self) -> int:
    return self.levels[-1][1]

  def relative_factor(self, level: int) -> int:
    """Shortening factor between `level` and `level + 1`."""
    return self.levels[level + 1][1] // self.levels[level][1]

  @property
  def num_layers(self) -> int:
    return sum(n for n, _ in self.levels) + sum(self.post_layers)

  def inner(self) -> "Hierarchy":
    """The levels inside the first shortening, with factors relative to it ('2@1 4@3 2@1' -> '4@1')."""
    k = self.relative_factor(0)
    return Hierarchy(levels=tuple((n, f // k) for n, f in self.levels[1:]), post_layers=self.post_layers[1:])

  def __str__(self) -> str:
    down = [f"{n}@{f}" for n, f in self.levels]
    up = [f"{n}@{f}" for n, (_, f) in zip(self.post_layers, self.levels)][::-1]
    return " ".join(down + up)


def _fail(value: str, problem: str) -> ValueError:
  return ValueError(
      f"model.hierarchy={value!r}: {problem}. Expected space-separated 'N@F' tokens (N layers at cumulative "
      "shortening factor F), starting and ending at @1, F rising then falling symmetrically, each F dividing the "
      "next inward, e.g. '5@1 24@3 5@1' or '2@1 2@3 4@9 2@3 2@1'; a vanilla stack is a single 'N@1'.")


def parse_hierarchy(value: str) -> Hierarchy:
  """Parses and validates a hierarchy string; raises ValueError naming the problem."""
  if not isinstance(value, str):
    raise _fail(value, f"it is a {type(value).__name__}, not a string")
  if not value.strip():
    raise _fail(value, "it is empty")
  tokens = value.split()
  pairs = []
  for token in tokens:
    match = _TOKEN.match(token)
    if not match:
      raise _fail(value, f"token {token!r} is not of the form N@F with non-negative integers N and F")
    pairs.append((int(match.group(1)), int(match.group(2))))
  if len(pairs) % 2 == 0:
    raise _fail(value, f"it has {len(pairs)} tokens; a hierarchy has an odd number (down, center, up)")
  factors = [f for _, f in pairs]
  if factors[0] != 1 or factors[-1] != 1:
    raise _fail(value, "it must start and end with a full-resolution @1 level")
  if factors != factors[::-1]:
    raise _fail(value, f"factors {factors} are not symmetric")
  center = len(pairs) // 2
  down = factors[:center + 1]
  for outer, inner in zip(down, down[1:]):
    if inner == outer:
      raise _fail(value, f"factor {inner} is repeated; each level must shorten (relative factor > 1)")
    if inner < outer:
      raise _fail(value, f"factor {inner} follows {outer}; factors must rise to the center")
    if inner % outer:
      raise _fail(value, f"factor {outer} does not divide {inner}")
  if pairs[center][0] < 1:
    raise _fail(value, "the center level needs at least one layer")
  return Hierarchy(levels=tuple(pairs[:center + 1]),
                   post_layers=tuple(n for n, _ in reversed(pairs[center + 1:])))
