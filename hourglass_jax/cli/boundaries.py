"""`hourglass-boundaries`: where a learned-shortening model cuts a text, the bytes with a '|' after each segment
boundary ('||' where a nested dynamic level's segment closes too).

Reads the newest checkpoint of a training run's workdir, or weights exported with `hourglass-export` (--workdir
takes either, as hourglass-sample's does; --weights too), of a model trained with `shorten='dynamic'`
(configs/dynamic.py), runs the forward pass in evaluation mode and marks the boundary decisions the dynamic level
sows into 'intermediates' (a boundary after byte t closes the segment that holds t).

  hourglass-boundaries --workdir=workdirs/dynamic --text="First Citizen: Before we proceed any further"
  hourglass-export --workdir=workdirs/dynamic --output=workdirs/dynamic_export
  hourglass-boundaries --workdir=workdirs/dynamic_export --text="First Citizen: Before we proceed any further"

A 'gumbel' model marks where sigmoid(logit) > 1/2 unless `--gumbel_evaluation=sample` asks for training's draw
(model.gumbel_evaluation; after short training the threshold cuts far less often than training did).
"""

import dataclasses
import os
import sys

import jax.numpy as jnp
import numpy as np

from hourglass_jax.model import build_model
from hourglass_jax.train.checks import TrainError
from hourglass_jax.weights import load_params


def level_boundaries(model, params, text: bytes) -> list[np.ndarray]:
  """Per dynamic level, outermost first: (bool [len(text)] whether that level's segment closes at each byte, bool
  [segments of the level above] its own decisions), in evaluation mode. A nested level cuts between segments of the
  level above, so its cut falls on the byte that closed the segment it cuts after."""
  if not model.cfg.dynamic:
    raise ValueError(f"the model has shorten={model.cfg.shorten!r}; boundaries come from a model trained with "
                     "shorten='dynamic' (e.g. configs/dynamic.py).")
  tokens = jnp.asarray(np.frombuffer(text, np.uint8).astype(np.int32))[None]
  _, sown = model.apply({"params": params}, tokens, mutable=["intermediates"])
  level, levels = sown["intermediates"]["body"], []
  slot_T, closes_T = np.arange(len(text)), np.ones(len(text), bool)  # each byte's position in the level's stream
  while "shorten" in level:
    cuts = np.asarray(level["shorten"]["boundaries"][0])[0]
    closes_T = closes_T & cuts[slot_T]
    filled = int(slot_T[-1]) + 1 if len(text) else 0
    levels.append((closes_T, cuts[:filled]))
    slot_T = (np.cumsum(cuts) - cuts)[slot_T]  # the segment of the byte's slot: the next level's position
    level = level.get("inner", {})
  return levels


def marked(text: bytes, depth) -> str:
  """The text with '|' after every byte that closes a segment, '||' where a nested level's segment closes too, and
  so on (`depth`: the levels closing after each byte, or bool; bytes shown as Latin-1, newlines as '⏎')."""
  return "".join(chr(byte).replace("\n", "⏎") + "|" * int(levels) for byte, levels in zip(text, depth))


def load(weights=None, workdir=None):
  """(model, params) of an export folder (or .safetensors file) or of the newest checkpoint of a training run's
  workdir (read-only, verified as hourglass-eval reads it), whichever `workdir` or `weights` names (one of them:
  either flag takes either)."""
  if (weights is None) == (workdir is None):
    raise ValueError("pass --workdir=TRAINING_RUN_OR_EXPORT (or --weights=EXPORTED_FOLDER): one of the two.")
  path = weights if weights is not None else workdir
  if not os.path.isdir(os.path.join(os.path.expanduser(os.fspath(path)), "checkpoints")):
    return load_params(path)
  from hourglass_jax.train.checkpointing.checkpoint import read_params  # pylint: disable=import-outside-toplevel

  params, _, record = read_params(path, None, log=lambda message: print(message, file=sys.stderr))
  if "model" not in record:
    raise ValueError(f"the newest checkpoint under {path} records no model settings; export it with "
                     "hourglass-export --step=N of another step, or retrain.")
  return build_model(record["model"]), params


def show(weights, text: bytes, gumbel_evaluation: str | None = None, workdir=None) -> tuple[str, np.ndarray]:
  """(the marked text and a summary line per level, the outermost level's boundaries) of the model exported to
  `weights` (or trained in `workdir`) on `text`; `gumbel_evaluation` overrides the model's (model.gumbel_evaluation)
  when given."""
  if not text:
    raise ValueError("--text is empty; give at least one byte to cut into segments.")
  model, params = load(weights, workdir)
  if gumbel_evaluation:
    model = build_model(dataclasses.replace(model.cfg, gumbel_evaluation=gumbel_evaluation))
  cfg, levels = model.cfg, level_boundaries(model, params, text)
  lines = [marked(text, sum(closes.astype(int) for closes, _ in levels))]
  for level, ((_, cuts), predictor) in enumerate(zip(levels, cfg.level_predictors)):
    unit = "bytes" if level == 0 else f"level-{level} segments"
    prefix = "" if len(levels) == 1 else f"level {level + 1} ({'|' * (level + 1)}): "
    lines.append(f"{prefix}{int(cuts.sum())} boundaries in {len(cuts)} {unit}: one per "
                 f"{len(cuts) / max(int(cuts.sum()), 1):.2f} {unit.split()[-1]} (target "
                 f"{cfg.parsed_hierarchy.relative_factor(level)}, predictor '{predictor.key}'"
                 f"{predictor.describe(cfg)})")
  return "\n".join(lines), levels[0][0]


def main():
  """hourglass-boundaries --workdir=RUN_OR_EXPORT --text=TEXT"""
  from absl import app, flags  # the flags are this command's only: defined when it runs

  if "weights" not in flags.FLAGS:  # defined once per process (main may run again in the same one)
    flags.DEFINE_string("weights", None, "A folder (or .safetensors file) hourglass-export wrote (--workdir takes it "
                        "too).")
    flags.DEFINE_string("text", None, "The text to cut (UTF-8; required).")  # checked in run: a flag validator
    # would outlive this command in its process and refuse any other absl command run there after it
    flags.DEFINE_enum("gumbel_evaluation", None, ["threshold", "sample"],
                      "'gumbel' only: how evaluation decides (default: the model's own setting).")
  if "workdir" not in flags.FLAGS:  # hourglass_jax.cli.main defines it too, where it was imported
    flags.DEFINE_string("workdir", None, WORKDIR_HELP)
  weights, workdir, text, evaluation = (flags.FLAGS[name] for name in ("weights", "workdir", "text",
                                                                        "gumbel_evaluation"))
  from hourglass_jax.cli import usage

  usage.declare(usage.BOUNDARIES, usage.BOUNDARIES_FLAGS, helps=dict(workdir=WORKDIR_HELP))

  def run(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    usage.quiet_logs()
    if text.value is None:
      raise app.UsageError("--text is required: the text to cut.")
    try:
      data = text.value.encode("utf-8")
    except UnicodeEncodeError:
      sys.exit("error: --text holds bytes that are not UTF-8 text (the shell passed them through undecoded); pass "
               "the text as UTF-8.")
    try:
      print(show(weights.value, data, evaluation.value, workdir.value)[0])
    except (ValueError, OSError, TrainError) as error:  # bad weights, run or text: one line naming them
      sys.exit(f"error: {error}")

  app.run(run, flags_parser=usage.parse_flags)


WORKDIR_HELP = ("A hourglass-train workdir (its newest checkpoint is read) or a folder hourglass-export wrote.")


if __name__ == "__main__":
  main()
