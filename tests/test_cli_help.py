"""`--help` of every command prints what it does, an example and every flag it reads, not only "Try --helpfull", and
exits with status 0; every script under benchmarks/, scripts/ and examples/ prints its whole description."""

import importlib.util
import inspect
import io
import pathlib
import re
import sys
import tokenize

import pytest

from hourglass_jax.cli import main, plot, usage
from hourglass_jax.config import help as config_help
from hourglass_jax.runtime import settings
from tests.helpers import load_config, run

ENTRIES = {"train_entry": usage.TRAIN_FLAGS, "eval_entry": usage.EVAL_FLAGS, "data_entry": usage.DATA_FLAGS,
           "sample_entry": usage.SAMPLE_FLAGS}
ABSL_AND_JAX = ("--verbosity", "--jax_platforms", "--only_check_args")
REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for folder in ("benchmarks", "scripts", "examples") for path in (REPO / folder).glob("*.py")
                 if "ArgumentParser(" in path.read_text())


def _assert_lists_own_flags(text: str, names, command: str) -> None:
  assert text.startswith(command + ":") and "Example:" in text and f".venv/bin/{command} " in text, text
  for name in names:  # a boolean flag shows as --[no]name
    assert f"  --{name}:" in text or f"  --[no]{name}:" in text, (name, text)
  for other in ABSL_AND_JAX:
    assert other not in text, (other, text)


def _keep_flags_optional(monkeypatch) -> None:
  """--help needs no required flag, and absl cannot unmark one: a mark left in this process would fail the next
  in-process command that does not define the flag (tests/test_hostile_cli.py runs hourglass-boundaries so)."""
  monkeypatch.setattr(main.flags, "mark_flags_as_required", lambda names: None)


@pytest.mark.parametrize("entry", ENTRIES)
def test_help_lists_the_commands_own_flags_and_exits_0(entry, monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", [f"hourglass-{entry.split('_')[0]}", "--help"])
  monkeypatch.setattr(sys.modules["__main__"], "__doc__", None)
  _keep_flags_optional(monkeypatch)
  with pytest.raises(SystemExit) as exited:
    getattr(main, entry)()
  assert exited.value.code == 0
  text = capsys.readouterr().out
  _assert_lists_own_flags(text, ENTRIES[entry], f"hourglass-{entry.split('_')[0]}")
  if entry == "eval_entry":  # how much it scores, and its own --split
    assert "the whole split" in " ".join(text.split()) and "--split: The split to score" in text, text
  if entry == "sample_entry":
    assert "--split: Images: the split whose first images --prompt_rows completes" in text, text


def test_plot_help_exits_0_and_lists_its_flags(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["hourglass-plot", "--help"])
  with pytest.raises(SystemExit) as exited:
    plot.main()
  assert exited.value.code == 0
  text = capsys.readouterr().out
  _assert_lists_own_flags(text, usage.PLOT_FLAGS, "hourglass-plot")
  assert "--output: The PNG file to write" in text


@pytest.mark.parametrize("command, names", [("hourglass_jax.cli.main import export_entry as entry", usage.EXPORT_FLAGS),
                                            ("hourglass_jax.cli.boundaries import main as entry",
                                             usage.BOUNDARIES_FLAGS)])
def test_help_of_the_commands_with_flags_of_their_own(command, names):
  """Each defines flags the others do not have (--output is also hourglass-sample's): one process each. --help and
  --helpfull succeed (absl's own exit status for them is 1)."""
  done = run([sys.executable, "-c", f"from {command}; entry()", "--help"],
             timeout=120, devices=1)
  assert done.returncode == 0, done.stderr[-2000:]
  name = "hourglass-export" if "export" in command else "hourglass-boundaries"
  _assert_lists_own_flags(done.stdout, names, name)
  assert "Try --helpfull" in done.stdout
  if name == "hourglass-export":
    assert "--[no]overwrite: Replace another export" in done.stdout


@pytest.mark.parametrize("module, names", [("sample_flags", usage.SAMPLE_FLAGS), ("export_flags", usage.EXPORT_FLAGS),
                                           ("boundaries", usage.BOUNDARIES_FLAGS), ("plot", usage.PLOT_FLAGS)])
def test_help_lists_every_flag_the_command_defines(module, names):
  """A flag added to a command's module (e.g. a new sampling option) must be added to what its --help lists."""
  source = (REPO / "hourglass_jax" / "cli" / f"{module}.py").read_text()
  defined = set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
  assert defined and defined <= set(names), sorted(defined - set(names))


def test_a_bad_flag_still_fails(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["hourglass-data", "--no_such_flag=1", "prepare", "stdlib_text"])
  with pytest.raises(SystemExit) as exited:
    main.data_entry()
  assert exited.value.code == 1 and "no_such_flag" in capsys.readouterr().err


def test_helpfull_keeps_every_flag(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", ["hourglass-train", "--helpfull"])
  _keep_flags_optional(monkeypatch)
  with pytest.raises(SystemExit) as exited:
    main.train_entry()
  assert exited.value.code == 0
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


def _config_help(monkeypatch, capsys, entry, *args) -> str:
  """What `entry --help_config ARGS` prints (it must exit 0 without the command's required flags)."""
  monkeypatch.setattr(sys, "argv", [f"hourglass-{entry.split('_')[0]}", "--help_config", *args])
  try:
    with pytest.raises(SystemExit) as exited:
      getattr(main, entry)()
  finally:
    main.flags.FLAGS.unparse_flags()  # later in-process commands parse afresh
  assert exited.value.code in (0, None)
  return capsys.readouterr().out


def _listed(text: str) -> dict[tuple[str, str], tuple[str, str]]:
  """{(section, field): (value, doc)} of a --help_config listing (a long flag has its doc on the next line)."""
  lines, listed = text.splitlines(), {}
  for i, line in enumerate(lines):
    if match := re.match(r"^  --config\.(\w+)\.(\w+)=(.*?)(?:\s{2,}(.*))?$", line):
      doc = match.group(4) or lines[i + 1].strip()
      listed[match.group(1), match.group(2)] = (match.group(3), doc)
  return listed


def test_help_config_lists_every_setting_with_its_value_and_its_declared_doc(monkeypatch, capsys):
  """Every field each section's settings class declares, none else; the config file's value with the command line's
  override; and as doc the comment on the field's own declaration (constants such as DTYPES spelt out)."""
  listed = _listed(_config_help(monkeypatch, capsys, "train_entry", f"--config={REPO / 'configs' / 'tiny.py'}",
                                "--config.model.d_model=64"))
  declared = {(section, name) for section in config_help.SECTIONS for name in config_help.documented_fields(section)}
  assert set(listed) == declared and ("model", "attention_dropout") in declared
  assert ("model", "remat_policy") in listed and ("data", "spec") not in listed  # a setting, not what data resolves
  tiny = load_config("tiny")
  assert listed["model", "d_model"][0] == "64" and listed["data", "seq_len"][0] == str(tiny.data.seq_len)
  assert listed["model", "hierarchy"][0] == f"'{tiny.model.hierarchy}'"
  assert listed["model", "dtype"][1].startswith("float32 | bfloat16 | float16: the compute dtype")
  for (section, name), (_, doc) in listed.items():
    owner, raw = settings.declarations(config_help.SECTIONS[section])[name]
    comments = " ".join(token.string.lstrip("#").strip() for token in tokenize.generate_tokens(
        io.StringIO(inspect.getsource(owner)).readline) if token.type == tokenize.COMMENT)
    assert raw and raw in comments, (section, name, raw)  # read from the declaration, not written twice
    assert doc == config_help.section_docs(section)[name]


def test_help_config_without_a_config_lists_the_defaults(monkeypatch, capsys):
  text = _config_help(monkeypatch, capsys, "eval_entry")
  assert "the defaults every config file starts from (no --config given)" in text.splitlines()[0]
  assert _listed(text)["train", "learning_rate"][0] == "0.001"
