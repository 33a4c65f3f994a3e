"""Command-line entry points (absl flags + ml_collections config files): hourglass-train, hourglass-eval,
hourglass-data, hourglass-sample, hourglass-export."""

import os
import sys
import traceback

from absl import app, flags
from absl import logging as absl_logging

from hourglass_jax.cli import usage
from hourglass_jax.config.flag import ConfigFileError, define_config_flag, one_line
from hourglass_jax.runtime import files, host_memory, paths

_CONFIG = define_config_flag("config", "A configs/*.py file, optionally with :preset (configs/dynamic.py:whitespace).")
_HELP_CONFIG = flags.DEFINE_bool(usage.HELP_CONFIG, False, "List every --config.SECTION.FIELD setting with its value "
                                 "in --config's file (without --config: the defaults) and what it means, then exit.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and TensorBoard logs of this run.")
_SPLIT = flags.DEFINE_string("split", None, "Split to read (default data.eval_split); each command's --help says "
                             "what it reads it for.")
_BATCHES = flags.DEFINE_integer("batches", 0, usage.EVAL_BATCHES_HELP)
_DISTRIBUTED = flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                                 "Call jax.distributed.initialize (auto: when a coordinator or a cluster is found).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for manual launches.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes, for manual launches.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index, for manual launches.")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "XLA compilation cache folder (local or gs://) or 'off'; default "
    "~/.cache/hourglass_jax/xla. Its programs run as native code: name only a cache you trust (docs/weights.md).")
_HOST_MALLOC = flags.DEFINE_enum(
    "host_malloc", "auto", host_memory.MODES,
    "CPU backend: keep = malloc keeps freed memory (faster steps), system = malloc's defaults, auto = keep on CPU.")


def _parse_flags(argv):
  """absl's parser; a bad --config override (unknown key, wrong type) ends with config_flags' message, and --help
  (which absl ends with status 1) with status 0."""
  try:
    return usage.parse_flags(argv)
  except ConfigFileError as error:
    sys.exit(f"error: {error}")
  except (AttributeError, KeyError, TypeError, ValueError) as error:
    sys.exit(f"error: bad --config override: {one_line(error)}")


def _setup(level):
  usage.quiet_logs(level)
  from hourglass_jax.runtime import distributed

  host_memory.configure(_HOST_MALLOC.value)  # before any backend starts: threads bind malloc arenas at start

  distributed.initialize(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  from hourglass_jax.runtime import compile_cache

  compile_cache.enable(_COMPILATION_CACHE.value or compile_cache.default_location(_WORKDIR.value))


def _check_locations(run, create: bool = True) -> None:
  """A workdir that is a file, cannot be created (`create`: training makes it) or is a URL this install cannot open
  or reach, or a bucket data dir of the RunConfig `run`, fails here, before devices or data are touched."""
  paths.check_local_data_dir(run.data.data_dir, "--config.data.data_dir")
  files.check_writable_location(_WORKDIR.value, "--workdir", create)


def _run(fn):
  """Runs fn(); configuration and training faults end the program with their message instead of a traceback
  (pass --verbosity=0 or higher to see the traceback too)."""
  from hourglass_jax.train.checks import DiskFullError, TrainError

  try:
    return fn()
  except DiskFullError as error:
    from hourglass_jax.train.loop import preemption

    _exit_now(f"error: {error}", preemption.EXIT_DISK_FULL)
  except (ValueError, TrainError, OSError) as error:
    if flags.FLAGS["verbosity"].present:
      raise
    sys.exit(f"error: {error}")


def _exit_now(line: str, code: int) -> None:
  """Ends the process after a failed or interrupted save with `code`: the one-line message (after the traceback
  with --verbosity), flushed, then os._exit. Such a save leaves TensorStore writes and coroutines of Orbax's closed
  event loop behind, with nothing to wait on; a normal interpreter shutdown runs them into the finalizing
  interpreter, which printed tracebacks by the dozen and could crash (exit 139). The workdir lock is released, the
  checkpoints closed and the summaries flushed before this is reached."""
  if flags.FLAGS["verbosity"].present:
    traceback.print_exc()
  print(line, file=sys.stderr)
  absl_logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _run_reader(fn, what: str):
  """`_run` for commands that write nothing a later run needs (eval, sample, export, data): Ctrl-C ends them with
  one line and exit status 130 instead of a traceback."""
  try:
    return _run(fn)
  except KeyboardInterrupt:
    from hourglass_jax.train.loop import preemption

    print(f"error: {what} interrupted (Ctrl-C); nothing was lost: rerun the same command to start it again.",
          file=sys.stderr)
    sys.exit(preemption.EXIT_INTERRUPTED)


def _start(command, text: str, names, required=("config", "workdir"), level=absl_logging.ERROR, helps=None,
           export_needs_config: bool = True) -> None:
  """Runs `command()` after `_setup(level)`, as a program without positional arguments whose --help shows `text` and
  the flags `names` (`helps`: this command's own help of a shared flag; the default level suits the readers).
  `--help_config` lists the config's settings instead; `export_needs_config` False: a --workdir that is an export
  folder needs no --config (its card gives the model)."""
  usage.declare(text, names, helps)
  if usage.asked(sys.argv, usage.HELP_CONFIG):
    required = ()
  elif not export_needs_config and "config" in required:
    required = tuple(name for name in required if name != "config")  # checked in main, once --workdir is known
  flags.mark_flags_as_required(list(required))

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _HELP_CONFIG.value:
      _print_config_help()
      return
    if not export_needs_config and _CONFIG.value is None and not _model_source().is_export(_WORKDIR.value):
      sys.exit("error: --config is required with a training workdir (the config file the run was trained with); an "
               "export folder (hourglass-export's) needs none.")
    _setup(level)
    command()

  app.run(main, flags_parser=_parse_flags)


def _print_config_help() -> None:
  from hourglass_jax.config.base import base_config
  from hourglass_jax.config.help import listing

  if _CONFIG.value is None:
    print(listing(base_config(), "the defaults every config file starts from (no --config given)"), end="")
  else:
    print(listing(_CONFIG.value, f"--config={flags.FLAGS['config'].config_filename}"), end="")


def _model_source():
  from hourglass_jax.train.checkpointing import model_source

  return model_source


def _run_config():
  """The RunConfig of --config and its overrides, made once here: every setting checked, before any work."""
  from hourglass_jax.config.run import run_config

  return run_config(_CONFIG.value)


def _reader_config():
  """The RunConfig of a command that reads a model: with an export folder as --workdir, its model section is the
  export card's, the command line's --config.model.* values on top; else --config's as given."""
  source = _model_source()
  if not source.is_export(_WORKDIR.value):
    return _run_config()
  from hourglass_jax.config.run import run_config

  given = {arg[len("--config.model."):].split("=")[0] for arg in sys.argv[1:] if arg.startswith("--config.model.")}
  overrides = {name: _CONFIG.value.model[name] for name in given} if _CONFIG.value is not None else {}
  return run_config(source.export_config(_WORKDIR.value, _CONFIG.value, overrides))


def _overrides() -> list[str]:
  """This run's --config.* arguments that sampling and evaluating it need: all but the train section's."""
  return [arg for arg in sys.argv[1:] if arg.startswith("--config.") and not arg.startswith("--config.train.")]


def _train():
  from hourglass_jax.train.loop.loop import train_and_evaluate

  created = [None]  # the outermost folder the run makes: removed again if it fails before writing a file into it

  def train():
    created[0] = paths.first_missing(_WORKDIR.value)
    run = _run_config()
    _check_locations(run)
    files.make_folder(_WORKDIR.value)
    return train_and_evaluate(run, _WORKDIR.value)

  from hourglass_jax.train.loop import preemption

  try:
    summary = _run(train)
    stopped = summary["stopped"]  # a stop after saving is not "finished": schedulers requeue on its code
  except KeyboardInterrupt:  # a second Ctrl-C, perhaps during a save
    paths.remove_empty_folders(created[0])
    _exit_now("error: aborted by a second Ctrl-C; the steps since the last checkpoint are lost. Rerun the same "
              "command to resume from it.", preemption.EXIT_INTERRUPTED)
  except BaseException:
    paths.remove_empty_folders(created[0])
    raise
  if stopped == "done" and summary["step"] > summary["start_step"]:
    _print_next_steps(summary.get("prompt"))
  sys.exit({"preempted": preemption.EXIT_PREEMPTED, "interrupted": preemption.EXIT_INTERRUPTED}.get(stopped, 0))


def _print_next_steps(prompt: str | None) -> None:
  """Process 0: where the run's files are and the commands that use them, with this run's config arguments
  (`prompt`: one in the style of the data, for a text model)."""
  import jax

  from hourglass_jax.train.reporting.report import next_steps

  if jax.process_index() != 0:
    return
  bin_dir = os.path.dirname(sys.executable)
  if not os.path.exists(os.path.join(bin_dir, "hourglass-sample")):
    bin_dir = ""  # not a virtual environment's python: the commands are on PATH
  elif not os.path.relpath(bin_dir).startswith(".."):
    bin_dir = os.path.relpath(bin_dir)
  print(next_steps(flags.FLAGS["config"].config_filename, _WORKDIR.value, _overrides(), prompt, bin_dir), flush=True)


def _eval():
  from hourglass_jax.train.loop.evaluate import evaluate_checkpoint

  def evaluate():
    run = _reader_config()
    _check_locations(run, create=False)
    return evaluate_checkpoint(run, _WORKDIR.value, _SPLIT.value, max_batches=_BATCHES.value, progress=True,
                               record=True)

  _run_reader(evaluate, "hourglass-eval")


def train_entry():
  _start(_train, usage.TRAIN, usage.TRAIN_FLAGS, level=absl_logging.WARNING)


def eval_entry():
  _start(_eval, usage.EVAL, usage.EVAL_FLAGS, helps=dict(split=usage.EVAL_SPLIT_HELP))


_DATA_DIR = flags.DEFINE_string("data_dir", None, "hourglass-data: TFDS data directory (default $TFDS_DATA_DIR, "
                                "else ~/tensorflow_datasets).")
_MANUAL_DIR = flags.DEFINE_string("manual_dir", None, "hourglass-data: folder of manually downloaded files "
                                  "(text_files: the text file or folder itself).")


def _data(argv):
  if len(argv) != 3 or argv[1] != "prepare":
    from hourglass_jax.data.catalog import DATASETS

    raise app.UsageError(f"usage: hourglass-data prepare NAME [--manual_dir=DIR] [--data_dir=DIR]; NAME is one of "
                         f"{', '.join(DATASETS)}.")
  usage.quiet_logs()
  from hourglass_jax.data.io.prepare import prepare_command

  _run_reader(lambda: paths.check_local_data_dir(_DATA_DIR.value or "", "--data_dir")
              or prepare_command(argv[2], _DATA_DIR.value, _MANUAL_DIR.value), "hourglass-data prepare")


def data_entry():
  usage.declare(usage.DATA, usage.DATA_FLAGS)
  app.run(_data, flags_parser=_parse_flags)


def _sample():
  from hourglass_jax.cli import sample_flags

  def sample():
    run = _reader_config()
    _check_locations(run, create=False)
    return sample_flags.run(run, _WORKDIR.value, _SPLIT.value)

  _run_reader(sample, "hourglass-sample")


def sample_entry():
  from hourglass_jax.cli import sample_flags  # noqa: F401  defines the sampling flags, for hourglass-sample only

  _start(_sample, usage.SAMPLE, usage.SAMPLE_FLAGS, helps=dict(split=usage.SAMPLE_SPLIT_HELP),
         export_needs_config=False)


def _export():
  from hourglass_jax.cli import export_flags

  _run_reader(lambda: files.check_writable_location(_WORKDIR.value, "--workdir", create=False)
              or export_flags.run(_WORKDIR.value), "hourglass-export")


def export_entry():
  """hourglass-export --workdir=DIR --output=DIR [--step=N] [--dtype=bfloat16]: a checkpoint's parameters as
  safetensors with a JSON model card (docs/weights.md)."""
  from hourglass_jax.cli import export_flags  # noqa: F401  defines --output, --step, --dtype, for hourglass-export only

  _start(_export, usage.EXPORT, usage.EXPORT_FLAGS, required=("workdir", "output"))


if __name__ == "__main__":
  train_entry()
