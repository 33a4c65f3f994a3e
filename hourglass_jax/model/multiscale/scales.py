"""Multi-scale notation (Subramanian et al. 2020): scales, layers and heads per scale, retina windows.

`scales` are cumulative pooling factors listed coarse to fine and ending at 1, each an integer multiple of the next:
'64,16,4,1'. `layers_per_scale` and `heads_per_scale` list one count per scale in the same order. `retina_windows`
lists one 'a:b' window per scale nearest first ('0:8,8:256,256:512'), so it pairs with the scales finest first:
window a:b = the tokens a..b-1 back. Parsed, every tuple is aligned with `factors` (coarse to fine).
"""

import dataclasses
import re

from hourglass_jax.model.layer_config import setting

MULTISCALE_KINDS = ("topdown", "bottomup", "retina")
_WINDOW = re.compile(r"^(\d+):(\d+)$")
_SCALES_HELP = ("Expected comma-separated cumulative pooling factors listed coarse to fine and ending at 1, each an "
                "integer multiple of the next, e.g. '64,16,4,1' or '16,4,1'.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MultiScaleSettings:
  """The multi-scale settings (the paper's four-scale model): `ModelConfig` inherits them, the bodies take theirs."""
  scales: str = setting("64,16,4,1", function_of=MULTISCALE_KINDS)  # cumulative pooling factors, coarse to fine
  layers_per_scale: str = setting("2,4,8,12", function_of=("topdown", "bottomup"))  # one layer count per scale
  heads_per_scale: str = setting("", function_of=("bottomup", "retina"))  # heads reading each scale ('' = even)
  downsampler: str = setting("avg", function_of=MULTISCALE_KINDS)  # DOWNSAMPLERS: pooling to a coarser scale
  upsampler: str = setting("transposed_conv", function_of=("topdown",))  # UPSAMPLERS: top-down's way back
  retina_windows: str = setting("", function_of=("retina",))  # one 'a:b' window per scale, nearest first


@dataclasses.dataclass(frozen=True)
class MultiScale:
  """Parsed multi-scale fields; `layers`, `heads` and `windows` are empty where the kind does not use them."""
  factors: tuple[int, ...]
  layers: tuple[int, ...] = ()
  heads: tuple[int, ...] = ()
  windows: tuple[tuple[int, int], ...] = ()

  @property
  def coarsest(self) -> int:
    return self.factors[0]

  def relative_factor(self, i: int) -> int:
    """Pooling factor between scale i-1 (coarser) and scale i."""
    return self.factors[i - 1] // self.factors[i]


def _ints(field: str, value, help_text: str) -> tuple[int, ...]:
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"model.{field}={value!r} is empty. {help_text}")
  items = [item.strip() for item in value.split(",")]
  if not all(item.isdigit() for item in items):
    raise ValueError(f"model.{field}={value!r} is not a comma-separated list of non-negative integers. {help_text}")
  return tuple(int(item) for item in items)


def parse_scales(value: str) -> tuple[int, ...]:
  """'64,16,4,1' -> (64, 16, 4, 1); raises ValueError naming the problem."""
  factors = _ints("scales", value, _SCALES_HELP)
  if len(factors) < 2:
    raise ValueError(f"model.scales={value!r} has a single scale; a multi-scale model needs at least two. "
                     + _SCALES_HELP)
  if factors[-1] != 1:
    raise ValueError(f"model.scales={value!r} does not end at 1 (the token scale). " + _SCALES_HELP)
  for coarse, fine in zip(factors, factors[1:]):
    if coarse <= fine or coarse % fine:
      raise ValueError(f"model.scales={value!r}: {coarse} is not an integer multiple (> 1) of the next scale {fine}. "
                       + _SCALES_HELP)
  return factors


def parse_counts(field: str, value: str, factors: tuple[int, ...], minimum: int) -> tuple[int, ...]:
  """One count per scale, coarse to fine, each >= `minimum`."""
  example = ",".join([str(max(minimum, 2))] * len(factors))
  help_text = (f"Expected one integer >= {minimum} per scale of model.scales={','.join(map(str, factors))!r}, in the "
               f"same order (coarse to fine), e.g. {example!r}.")
  counts = _ints(field, value, help_text)
  if len(counts) != len(factors):
    raise ValueError(f"model.{field}={value!r} has {len(counts)} entries for {len(factors)} scales. {help_text}")
  if min(counts) < minimum:
    raise ValueError(f"model.{field}={value!r} has an entry below {minimum}. {help_text}")
  return counts


def parse_heads(value: str, num_heads: int, factors: tuple[int, ...]) -> tuple[int, ...]:
  """Head group sizes per scale; '' splits model.num_heads evenly."""
  if not value:
    if num_heads % len(factors):
      raise ValueError(f"model.heads_per_scale='' splits model.num_heads={num_heads} evenly over {len(factors)} "
                       f"scales, which is not possible; give one head count per scale summing to {num_heads}, "
                       f"e.g. {','.join(['1'] * (len(factors) - 1) + [str(num_heads - len(factors) + 1)])!r}.")
    return (num_heads // len(factors),) * len(factors)
  heads = parse_counts("heads_per_scale", value, factors, 1)
  if sum(heads) != num_heads:
    raise ValueError(f"model.heads_per_scale={value!r} sums to {sum(heads)}, but the head groups must divide the "
                     f"model.num_heads={num_heads} heads exactly: give counts summing to {num_heads}, or '' to split "
                     "evenly.")
  return heads


def parse_windows(value: str, factors: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """'0:8,8:256,256:512' (nearest first) -> windows aligned with `factors` (coarse to fine)."""
  fine_to_coarse = factors[::-1]
  help_text = (f"Expected one 'a:b' window per scale of model.scales={','.join(map(str, factors))!r}, nearest first "
               f"(paired with scales {','.join(map(str, fine_to_coarse))}), tiling the context from 0 without gaps "
               "or overlaps, each starting at least scale-1 tokens back, e.g. '0:8,8:256,256:512' for scales "
               "'16,4,1'.")
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"model.retina_windows={value!r} is empty. {help_text}")
  windows = []
  for item in value.split(","):
    match = _WINDOW.match(item.strip())
    if not match or int(match.group(1)) >= int(match.group(2)):
      raise ValueError(f"model.retina_windows={value!r}: {item.strip()!r} is not a window 'a:b' with integers "
                       f"0 <= a < b. {help_text}")
    windows.append((int(match.group(1)), int(match.group(2))))
  if len(windows) != len(factors):
    raise ValueError(f"model.retina_windows={value!r} has {len(windows)} windows for {len(factors)} scales. "
                     + help_text)
  previous_stop = 0
  for (start, stop), scale in zip(windows, fine_to_coarse):
    if start < previous_stop:
      raise ValueError(f"model.retina_windows={value!r}: window {start}:{stop} overlaps the previous one, which "
                       f"stops at {previous_stop}. {help_text}")
    if start > previous_stop:
      raise ValueError(f"model.retina_windows={value!r}: window {start}:{stop} leaves a gap (tokens {previous_stop}.."
                       f"{start - 1} back are seen by no head). {help_text}")
    if start < scale - 1:
      raise ValueError(f"model.retina_windows={value!r}: window {start}:{stop} of the scale-{scale} heads starts "
                       f"{start} tokens back, but a scale-{scale} key is complete only {scale - 1} tokens after the "
                       f"first token it summarises; start it at least {scale - 1} back. {help_text}")
    previous_stop = stop
  return tuple(windows[::-1])


def parse_multiscale(kind: str, scales: str, layers_per_scale: str, heads_per_scale: str, retina_windows: str,
                     num_heads: int) -> MultiScale:
  """Parses the fields `kind` uses: topdown (layers), bottomup (layers, heads), retina (heads, windows)."""
  factors = parse_scales(scales)
  layers = parse_counts("layers_per_scale", layers_per_scale, factors, 0) if kind in ("topdown", "bottomup") else ()
  heads = parse_heads(heads_per_scale, num_heads, factors) if kind in ("bottomup", "retina") else ()
  windows = parse_windows(retina_windows, factors) if kind == "retina" else ()
  return MultiScale(factors, layers, heads, windows)
