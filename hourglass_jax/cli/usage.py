"""What `--help` shows for each command: its purpose, an example and its own flags, one line each (absl key flags of
the main module); `--helpfull` keeps every flag, absl's and jax's included. `quiet_logs`: every command's log level."""

import logging
import sys

from absl import flags
from absl import logging as absl_logging

_CONFIG_OVERRIDES = "Any config field is a flag too: --config.SECTION.FIELD=VALUE (docs/training.md)."

TRAIN = f"""hourglass-train: trains the model of a config file, resuming from the workdir's newest checkpoint.

Example:
  .venv/bin/hourglass-train --config=configs/default.py --workdir=workdirs/default --config.train.steps=2000

{_CONFIG_OVERRIDES}"""

EVAL = f"""hourglass-eval: scores the workdir's newest checkpoint on a split (bits per byte).

Example:
  .venv/bin/hourglass-eval --config=configs/default.py --workdir=workdirs/default --split=test

{_CONFIG_OVERRIDES}"""

SAMPLE = f"""hourglass-sample: generates from the workdir's newest checkpoint with the KV cache (text, or PNG grids).

Example:
  .venv/bin/hourglass-sample --config=configs/default.py --workdir=workdirs/default --prompt='def ' --temperature=0.7
  .venv/bin/hourglass-sample ... --draft=ngram --temperature=0    (speculative: the same samples, faster)

{_CONFIG_OVERRIDES}"""

DATA = """hourglass-data: builds a dataset once, to read offline afterwards.

Usage: hourglass-data prepare NAME [--manual_dir=DIR] [--data_dir=DIR]   (the datasets: docs/data.md)

Example:
  .venv/bin/hourglass-data prepare text_files --manual_dir=my_texts/ --data_dir=data/my_texts"""

EXPORT = """hourglass-export: writes a checkpoint's parameters as safetensors with a JSON model card.

Example:
  .venv/bin/hourglass-export --workdir=workdirs/default --output=exported/default --dtype=bfloat16"""

BOUNDARIES = """hourglass-boundaries: shows where a learned-shortening model cuts a text ('|' after each boundary).

Example:
  .venv/bin/hourglass-boundaries --weights=exported/dynamic --text='The ship sailed at dawn.'"""

_DISTRIBUTED = ("distributed", "coordinator_address", "num_processes", "process_id")
_RUNTIME = ("compilation_cache", "host_malloc")
TRAIN_FLAGS = ("config", "workdir", *_RUNTIME, *_DISTRIBUTED)
EVAL_FLAGS = ("config", "workdir", "split", *_RUNTIME, *_DISTRIBUTED)
SAMPLE_FLAGS = ("config", "workdir", "split", "prompt", "prompt_file", "num_samples", "max_new_tokens", "temperature",
                "top_k", "top_p", "seed", "end_byte", "prompt_rows", "max_len", "output", "draft", "draft_tokens",
                *_RUNTIME, *_DISTRIBUTED)
DATA_FLAGS = ("data_dir", "manual_dir")
EXPORT_FLAGS = ("workdir", "output", "step", "dtype", *_RUNTIME)
BOUNDARIES_FLAGS = ("weights", "text", "gumbel_evaluation")


def declare(text: str, names) -> None:
  """Makes `--help` print `text` and the flags `names`, however the command was started (console script, -m, -c)."""
  sys.modules["__main__"].__doc__ = text + "\n"
  for name in names:
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])


def quiet_logs(level=absl_logging.WARNING) -> None:
  """Logs from `level` up unless --verbosity is given (Orbax logs every file it writes at INFO), and never jax's
  INFO list of the accelerator backends it looks for ("no TPU found" on CPU/GPU hosts)."""
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
  if not flags.FLAGS["verbosity"].present:
    absl_logging.set_verbosity(level)
