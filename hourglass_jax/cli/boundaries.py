"""`hourglass-boundaries`: where a learned-shortening model cuts a text, the bytes with a '|' after each segment
boundary.

Reads weights exported with `hourglass-export` from a model trained with `shorten='dynamic'` (configs/dynamic.py),
runs the forward pass in evaluation mode and marks the boundary decisions the dynamic level sows into
'intermediates' (a boundary after byte t closes the segment that holds t).

  hourglass-export --workdir=/tmp/dynamic --output=exported/dynamic
  hourglass-boundaries --weights=exported/dynamic --text="First Citizen: Before we proceed any further"

A 'gumbel' model marks where sigmoid(logit) > 1/2 unless `--gumbel_evaluation=sample` asks for training's draw
(model.gumbel_evaluation; after short training the threshold cuts far less often than training did).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import build_model
from hourglass_jax.weights import load_params


def boundaries_of(model, params, text: bytes) -> np.ndarray:
  """bool [len(text)]: the dynamic level's boundary after each byte, in evaluation mode."""
  if not model.cfg.dynamic:
    raise ValueError(f"the model has shorten={model.cfg.shorten!r}; boundaries come from a model trained with "
                     "shorten='dynamic' (e.g. configs/dynamic.py).")
  tokens = jnp.asarray(np.frombuffer(text, np.uint8).astype(np.int32))[None]
  _, sown = model.apply({"params": params}, tokens, mutable=["intermediates"])
  return np.asarray(sown["intermediates"]["body"]["shorten"]["boundaries"][0])[0, :len(text)]


def marked(text: bytes, boundaries: np.ndarray) -> str:
  """The text with '|' after every byte that closes a segment (bytes shown as Latin-1, newlines as '⏎')."""
  return "".join(chr(byte).replace("\n", "⏎") + ("|" if cut else "") for byte, cut in zip(text, boundaries))


def show(weights, text: bytes, gumbel_evaluation: str | None = None) -> tuple[str, np.ndarray]:
  """(the marked text and a summary line, the boundaries) of the model exported to `weights` on `text`;
  `gumbel_evaluation` overrides the model's (model.gumbel_evaluation) when given."""
  model, params = load_params(weights)
  if gumbel_evaluation:
    model = build_model(dataclasses.replace(model.cfg, gumbel_evaluation=gumbel_evaluation))
  cuts = boundaries_of(model, params, text)
  evaluation = f", evaluation '{model.cfg.gumbel_evaluation}'" if model.cfg.boundaries == "gumbel" else ""
  summary = (f"{int(cuts.sum())} boundaries in {len(text)} bytes: one per {len(text) / max(int(cuts.sum()), 1):.2f} "
             f"bytes (target {model.cfg.parsed_hierarchy.relative_factor(0)}, predictor '{model.cfg.boundaries}'"
             f"{evaluation})")
  return f"{marked(text, cuts)}\n{summary}", cuts


def main():
  """hourglass-boundaries --weights=DIR --text=TEXT"""
  from absl import app, flags  # the flags are this command's only: defined when it runs

  weights = flags.DEFINE_string("weights", None, "A folder (or .safetensors file) hourglass-export wrote.",
                                required=True)
  text = flags.DEFINE_string("text", None, "The text to cut (UTF-8).", required=True)
  evaluation = flags.DEFINE_enum("gumbel_evaluation", None, ["threshold", "sample"],
                                 "'gumbel' only: how evaluation decides (default: the model's own setting).")
  app.run(lambda argv: print(show(weights.value, text.value.encode("utf-8"), evaluation.value)[0]))


if __name__ == "__main__":
  main()
