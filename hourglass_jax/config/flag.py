"""The --config flag: config_flags' file loader, with a one-line error for a file that cannot be loaded."""

import os

from absl import flags
from ml_collections import config_flags


class ConfigFileError(Exception):
  """A --config file that cannot be loaded. Not a ValueError, which absl prints with a traceback inside."""


def one_line(error: BaseException) -> str:
  """An error's message on one line, without the quotes and escapes of a repr'd KeyError."""
  return " ".join(str(error).replace("\\n", " ").replace("\\'", "").strip("'\"").split())


class _Parser(flags.ArgumentParser):
  """Wraps config_flags' parser: missing, unreadable or broken files and unknown presets raise ConfigFileError."""

  def __init__(self, loader: flags.ArgumentParser):
    self.loader = loader

  def flag_type(self) -> str:
    return self.loader.flag_type()

  def parse(self, path):
    file, _, preset = path.partition(":")
    if os.path.isdir(file):
      raise ConfigFileError(f"--config={path}: {file} is a folder; name a config file in it, e.g. "
                            f"--config={os.path.join(file, 'enwik8.py')}.")
    try:
      open(file, "rb").close()  # config_flags would defer this error to the config's first use
    except OSError as error:
      raise ConfigFileError(f"--config={path}: cannot read {file} ({error.strerror}); name a config file such as "
                            "configs/enwik8.py (optionally :preset).") from None
    try:
      return self.loader.parse(path)
    except SyntaxError as error:
      raise ConfigFileError(f"--config={path}: {error.msg} at {error.filename} line {error.lineno}; fix the "
                            "file.") from None
    except (TypeError, ValueError) as error:  # config_flags re-raises get_config's error with its traceback
      cause = error.__context__ or error
      if preset and isinstance(cause, TypeError) and "get_config()" in str(cause):
        raise ConfigFileError(f"--config={path}: {file} has no presets; drop ':{preset}'.") from None
      raise ConfigFileError(f"--config={path}: {one_line(cause)}") from None
    except Exception as error:  # pylint: disable=broad-except  (a NameError, an ImportError... in the file)
      raise ConfigFileError(f"--config={path}: loading it raised {type(error).__name__}: {one_line(error)}; fix "
                            "the file.") from None


def define_config_flag(name: str, help_string: str) -> flags.FlagHolder:
  """config_flags.DEFINE_config_file (locked, no default) with the parser above."""
  holder = config_flags.DEFINE_config_file(name, None, help_string, lock_config=True)
  flags.FLAGS[name].parser = _Parser(flags.FLAGS[name].parser)
  return holder
