"""`--help` of every command prints what it does, an example and its own flags, not only "Try --helpfull"."""

import sys

import pytest

from hourglass_jax.cli import main, usage
from tests.helpers import run

ENTRIES = {"train_entry": usage.TRAIN_FLAGS, "eval_entry": usage.EVAL_FLAGS, "data_entry": usage.DATA_FLAGS,
           "sample_entry": usage.SAMPLE_FLAGS}
ABSL_AND_JAX = ("--verbosity", "--jax_platforms", "--only_check_args")


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
