"""What `--help` shows for each command: its purpose, an example and its own flags, one line each (absl key flags of
the main module); `--helpfull` keeps every flag, absl's and jax's included. `quiet_logs`: every command's log level."""

import logging
import sys
import warnings

from absl import app, flags
from absl import logging as absl_logging

_CONFIG_OVERRIDES = ("Any config field is a flag too: --config.SECTION.FIELD=VALUE; --help_config lists them all, "
                     "with their values in --config's file and what each means.")

TRAIN = f"""hourglass-train: trains the model of a config file, resuming from the workdir's newest checkpoint.

Example:
  .venv/bin/hourglass-train --config=configs/default.py --workdir=workdirs/default --config.train.steps=2000

{_CONFIG_OVERRIDES}"""

EVAL = f"""hourglass-eval: scores the workdir's newest checkpoint, or an export folder, on a split (bits per byte), the
whole split unless --batches asks for a quick partial score (its line then says "partial" and how much it scored).
A workdir's whole-split score is also written to WORKDIR/evaluations/STEP_SPLIT.json, for the card hourglass-export
writes. With an export, --config's data section names the data to score (the export's card gives the model).

Example:
  .venv/bin/hourglass-eval --config=configs/default.py --workdir=workdirs/default --split=test
  .venv/bin/hourglass-eval --config=configs/default.py --workdir=workdirs/default_export --split=test

{_CONFIG_OVERRIDES}"""
EVAL_SPLIT_HELP = "The split to score: valid or test (default data.eval_split)."
EVAL_BATCHES_HELP = ("Score only the first N batches of the split, a quick partial score (0 = the whole split). "
                     "data.eval_batches sets the trainer's periodic evaluations only.")
SAMPLE_SPLIT_HELP = ("Images: the split whose first images --prompt_rows completes (default data.eval_split); text "
                     "configs do not read it.")

SAMPLE = f"""hourglass-sample: generates from the workdir's newest checkpoint, or an export folder, with the KV cache
(text, or PNG grids). An export needs no --config: its card gives the model and the training length.

Example:
  .venv/bin/hourglass-sample --config=configs/default.py --workdir=workdirs/default --prompt='def ' --temperature=0.7
  .venv/bin/hourglass-sample --workdir=workdirs/default_export --prompt='def ' --temperature=0.7
  .venv/bin/hourglass-sample ... --draft=ngram --temperature=0   (speculative: same tokens, faster on repetitive text)

{_CONFIG_OVERRIDES}"""

DATA = """hourglass-data: builds a dataset once, to read offline afterwards.

Usage: hourglass-data prepare NAME [--manual_dir=DIR] [--data_dir=DIR]   (the datasets: docs/data.md)

Example:
  .venv/bin/hourglass-data prepare text_files --manual_dir=my_texts/ --data_dir=workdirs/data/my_texts"""

EXPORT = """hourglass-export: writes a checkpoint's parameters as safetensors with a model card, as config.json and as
a Hugging Face Hub README.md (the model, the data set, steps and tokens seen, the recipe, the recorded bits per
byte, version, license and intended use).

Example:
  .venv/bin/hourglass-export --workdir=workdirs/default --output=workdirs/default_export --license=apache-2.0"""

BOUNDARIES = """hourglass-boundaries: shows where a learned-shortening model cuts a text ('|' after each boundary),
from a training run's newest checkpoint or an export folder (--workdir takes either).

Example:
  .venv/bin/hourglass-boundaries --workdir=workdirs/dynamic --text='The ship sailed at dawn.'
  .venv/bin/hourglass-boundaries --workdir=workdirs/dynamic_export --text='The ship sailed at dawn.'"""

PLOT = """hourglass-plot: draws the learning curves of one or more runs (their WORKDIR/metrics.jsonl) into a PNG.

Usage: hourglass-plot WORKDIR [WORKDIR...] --output=FILE.png   (needs matplotlib: pip install 'hourglass-jax[plot]')

Example:
  .venv/bin/hourglass-plot workdirs/tiny workdirs/default --output=workdirs/curves.png"""

_DISTRIBUTED = ("distributed", "coordinator_address", "num_processes", "process_id")
_RUNTIME = ("compilation_cache", "host_malloc")
TRAIN_FLAGS = ("config", "help_config", "workdir", *_RUNTIME, *_DISTRIBUTED)
EVAL_FLAGS = ("config", "help_config", "workdir", "split", "batches", *_RUNTIME, *_DISTRIBUTED)
SAMPLE_FLAGS = ("config", "help_config", "workdir", "split", "prompt", "prompt_file", "num_samples", "max_new_tokens",
                "temperature", "top_k", "top_p", "seed", "end_byte", "prompt_rows", "max_len", "output", "draft",
                "draft_tokens", "fallback_below", *_RUNTIME, *_DISTRIBUTED)
DATA_FLAGS = ("data_dir", "manual_dir")
EXPORT_FLAGS = ("workdir", "output", "step", "dtype", "overwrite", "license", *_RUNTIME)
BOUNDARIES_FLAGS = ("workdir", "weights", "text", "gumbel_evaluation")
PLOT_FLAGS = ("output", "x")
_HELP_FLAGS = ("help", "h", "?", "helpshort", "helpfull", "helpxml")
HELP_CONFIG = "help_config"


def declare(text: str, names, helps: dict | None = None) -> None:
  """Makes `--help` print `text` and the flags `names`, however the command was started (console script, -m, -c);
  `helps`: this command's own help text of flags it shares with others (--split)."""
  sys.modules["__main__"].__doc__ = text + "\n"
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  for name, help_text in (helps or {}).items():
    flags.FLAGS[name].help = help_text


def asked(argv, name: str) -> bool:
  """Whether `argv` holds the flag `name` (--name, -name, --name=...)."""
  return any(arg.lstrip("-").split("=")[0] == name for arg in argv[1:] if arg.startswith("-"))


def parse_flags(argv):
  """absl's parser (app.run's flags_parser), except that --help (--helpfull, -h, ...), which absl ends with status 1
  as if it had failed, ends with status 0."""
  try:
    return app.parse_flags_with_usage(argv)
  except SystemExit as exit_:
    asked = {arg.lstrip("-").split("=")[0] for arg in argv[1:] if arg.startswith("-")}
    if exit_.code == 1 and asked & set(_HELP_FLAGS):
      sys.exit(0)
    raise


def quiet_logs(level=absl_logging.WARNING) -> None:
  """Logs from `level` up unless --verbosity is given (Orbax logs every file it writes at INFO), never jax's INFO
  list of the accelerator backends it looks for ("no TPU found" on CPU/GPU hosts), and Python warnings as one line
  `warning: MESSAGE` (not the file, line and source line of the library call that raised it)."""
  warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
  if not flags.FLAGS["verbosity"].present:
    absl_logging.set_verbosity(level)
