"""`--help` of every command prints what it does, an example and its own flags, not only "Try --helpfull"; every
script under benchmarks/, scripts/ and examples/ prints its whole description."""

import importlib.util
import pathlib
import sys

import pytest

from hourglass_jax.cli import main, usage
from tests.helpers import run

ENTRIES = {"train_entry": usage.TRAIN_FLAGS, "eval_entry": usage.EVAL_FLAGS, "data_entry": usage.DATA_FLAGS,
           "sample_entry": usage.SAMPLE_FLAGS}
ABSL_AND_JAX = ("--verbosity", "--jax_platforms", "--only_check_args")
REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for folder in ("benchmarks", "scripts", "examples") for path in (REPO / folder).glob("*.py")
                 if "ArgumentParser(" in path.read_text())


def _assert_lists_own_flags(text: str, names, command: str) -> None:
  assert text.startswith(command + ":") and "Example:" in text and f".venv/bin/{command} " in text, text
  for name in names:
    assert f"  --{name}:" in text, (name, text)
  for other in ABSL_AND_JAX:
    assert other not in text, (other, text)


def _keep_flags_optional(monkeypatch) -> None:
  """--help needs no required flag, and absl cannot unmark one: a mark left in this process would fail the next
  in-process command that does not define the flag (tests/test_hostile_cli.py runs hourglass-boundaries so)."""
  monkeypatch.setattr(main.flags, "mark_flags_as_required", lambda names: None)


@pytest.mark.parametrize("entry", ENTRIES)
def test_help_lists_the_commands_own_flags(entry, monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", [f"hourglass-{entry.split('_')[0]}", "--help"])
  monkeypatch.setattr(sys.modules["__main__"], "__doc__", None)
  _keep_flags_optional(monkeypatch)
  with pytest.raises(SystemExit):
    getattr(main, entry)()
  _assert_lists_own_flags(capsys.readouterr().out, ENTRIES[entry], f"hourglass-{entry.split('_')[0]}")


@pytest.mark.parametrize("command, names", [("hourglass_jax.cli.main import export_entry as entry", usage.EXPORT_FLAGS),
                                            ("hourglass_jax.cli.boundaries import main as entry",
                                             usage.BOUNDARIES_FLAGS)])
def test_help_of_the_commands_with_flags_of_their_own(command, names):
  """Each defines flags the others do not have (--output is also hourglass-sample's): one process each."""
  done = run([sys.executable, "-c", f"from {command}; entry()", "--help"],
             timeout=120, devices=1)
  name = "hourglass-export" if "export" in command else "hourglass-boundaries"
  _assert_lists_own_flags(done.stdout, names, name)
  assert "Try --helpfull" in done.stdout


def test_helpfull_keeps_every_flag(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["hourglass-train", "--helpfull"])
  _keep_flags_optional(monkeypatch)
  with pytest.raises(SystemExit):
    main.train_entry()
  text = capsys.readouterr().out
  assert "--verbosity" in text and "--workdir" in text


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_scripts_help_prints_its_whole_description(path, monkeypatch, capsys):
  """The module docstring (what the script does, how to run it, what it writes), not its first line cut short."""
  monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/x.py` runs it: some import `common`
  spec = importlib.util.spec_from_file_location(f"help_of_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  monkeypatch.setattr(sys, "argv", [str(path), "--help"])
  with pytest.raises(SystemExit) as exited:
    module.main()
  assert exited.value.code == 0
  printed = " ".join(capsys.readouterr().out.split())
  assert " ".join(module.__doc__.split()) in printed, printed
