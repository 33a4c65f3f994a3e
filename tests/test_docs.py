"""The docs run as written: every ```python block of README.md and docs/*.md is executed, the blocks of a page in
order in one namespace (after the page's hidden prelude, if it declares one), in an empty folder; and every command
output a page shows is what benchmarks/results/cli_output.md recorded for that command (scripts/cli_output.py).
The conventions are in docs/testing.md ("The docs test")."""

import importlib.util
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CLI_OUTPUT = REPO / "benchmarks" / "results" / "cli_output.md"
PRELUDE = re.compile(r"^<!-- docs-test prelude\n(.*?)^-->", re.M | re.S)
PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
SHOWN = re.compile(r"^<!-- cli_output: (\w+) -->\n```\n(.*?)^```", re.M | re.S)


def _snippets(page: pathlib.Path) -> list[tuple[int, str]]:
  """(line number, code) of the page's prelude (if any) and python blocks, in the order they run."""
  text = page.read_text()
  line = lambda match: text.count("\n", 0, match.start()) + 2
  return [(line(m), m.group(1)) for m in PRELUDE.finditer(text)] + [(line(m), m.group(1))
                                                                    for m in PYTHON.finditer(text)]


RUNNABLE = [page for page in PAGES if PYTHON.search(page.read_text())]


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the files a snippet writes or its prelude prepares (workdirs/, exported/) go here
  namespace = {"__name__": f"docs_{page.stem}"}
  for line, code in _snippets(page):
    try:
      exec(compile(code, f"{page.relative_to(REPO)}:{line}", "exec"), namespace)  # pylint: disable=exec-used
    except Exception as error:
      raise AssertionError(f"{page.relative_to(REPO)} line {line}: the snippet fails when pasted: "
                           f"{type(error).__name__}: {error}") from error


def _script():
  spec = importlib.util.spec_from_file_location("cli_output", REPO / "scripts" / "cli_output.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _recorded() -> dict[str, tuple[str, list[str]]]:
  """{section: (command, printed lines)} of cli_output.md, as scripts/cli_output.py reads it."""
  return _script().read_sections(CLI_OUTPUT)


def shown_in(shown: list[str], printed: list[str]) -> str | None:
  """None when every shown line is a printed line, in order (a subsequence: the docs may leave lines out), where
  `...` in a shown line stands for any text and a line of `...` alone for lines left out; else the first shown
  line that is not there."""
  position = 0
  for line in shown:
    if line.strip() == "...":
      continue
    pattern = re.compile(".*".join(map(re.escape, line.rstrip().split("..."))) + "$")
    while position < len(printed) and not pattern.match(printed[position].rstrip()):
      position += 1
    if position == len(printed):
      return line
    position += 1
  return None


def _commands(text: str) -> str:
  """The page's shell commands as one line each (backslash continuations joined, runs of spaces as one)."""
  return " ".join(text.replace("\\\n", " ").split())


@pytest.mark.parametrize("page", [page for page in PAGES if SHOWN.search(page.read_text())],
                         ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_output_the_page_shows_is_the_recorded_output_of_its_command(page):
  text, recorded = page.read_text(), _recorded()
  for match in SHOWN.finditer(text):
    title, shown = match.group(1), match.group(2).splitlines()
    assert title in recorded, f"{page.name}: no section {title!r} in {CLI_OUTPUT.name}"
    command, printed = recorded[title]
    missing = shown_in(shown, printed)
    assert missing is None, f"{page.name} shows {missing!r} as output of `{command}`; {CLI_OUTPUT.name} has not it"
    shown_command = command.removeprefix(".venv/bin/")
    assert shown_command in _commands(text), (
        f"{page.name} shows the output of `{command}` ({title}) but not that command")


def test_the_output_check_tells_a_different_output_apart():
  printed = ["step 100: valid bits/byte 4.7972 (loss 3.3251 nats)", "speed: 9,111 tokens/s", "done"]
  assert shown_in(["step 100: valid bits/byte 4.7972 (...)", "...", "done"], printed) is None
  assert shown_in(["speed: ... tokens/s"], printed) is None
  assert shown_in(["step 100: valid bits/byte 4.7973 (...)"], printed) == "step 100: valid bits/byte 4.7973 (...)"
  assert shown_in(["done", "speed: ... tokens/s"], printed) == "speed: ... tokens/s"  # the order counts


def test_the_recorded_output_leaves_out_only_what_depends_on_the_machine():
  printed = ("compile: 13.1 s (persistent cache miss; cached in ~/.cache/hourglass_jax/xla)\n"
             "train:   0%|          | 0/30 [00:00<?]\n"
             "step 30: valid bits/byte 5.8670 (loss 4.0667 nats; partial: first 8 of 1,285 batches (1%))\n"
             "W1128 01:53:33.447012 140035805088640 checkpoint_manager.py:1466] Waiting for previous save to complete "
             "took 1.102745 seconds. If this number is high, consider checkpointing less frequently.\n"
             "train: 100%|##########| 30/30 [00:03<00:00, loss 3.812, bits/byte 5.499, 9,1 tok/s]\n"
             "train: 100%|##########| 30/30 [00:03<00:00, loss 3.812, bits/byte 5.499]\n"
             "speed over 30 timed steps: 8,252 tokens/s, 23 ms/step, MFU 2.95% (vs ...)\n")
  assert _script().masked(printed) == [
      "compile: ... s (...)",
      "step 30: valid bits/byte 5.8670 (loss 4.0667 nats; partial: first 8 of 1,285 batches (1%))",
      "train: 100%|##########| 30/30 [...<00:00, loss 3.812, bits/byte 5.499]",
      "speed over 30 timed steps: ... tokens/s, ... ms/step, MFU ...% (vs ...)"]
