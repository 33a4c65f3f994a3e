"""The docs run as written: every ```python block of README.md and docs/*.md is executed on its own, in a fresh
namespace (after the page's hidden prelude, if it declares one), in an empty folder, unless its first line names the
block it continues; every command output a page shows is what benchmarks/results/cli_output.md recorded for that
command (scripts/cli_output.py), whitespace included, and a block without a language is such an output; and every
folder the docs' commands write into is one git ignores. The conventions are in docs/testing.md ("The docs test")."""

import importlib.util
import pathlib
import re
import shlex

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CLI_OUTPUT = REPO / "benchmarks" / "results" / "cli_output.md"
PRELUDE = re.compile(r"^<!-- docs-test prelude\n(.*?)^-->", re.M | re.S)
PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
SHOWN = re.compile(r"^<!-- cli_output: (\w+) -->\n```\n(.*?)^```", re.M | re.S)
FENCE = re.compile(r"^(<!-- cli_output: \w+ -->\n)?```(\w*)\n(.*?)^```", re.M | re.S)
# A block whose first line is one of these runs where that block left off; any other runs in a fresh namespace.
CONTINUES = {"# continues the block above": "above", "# continues the first block": "first"}
WRITES = re.compile(r"--(?:workdir|output|data_dir)=(\S+)")  # the folders and files the docs' commands write


def _name(page: pathlib.Path) -> str:
  return page.relative_to(REPO).as_posix() if page.is_relative_to(REPO) else page.name


def _prelude(text: str) -> tuple[int, str] | None:
  match = PRELUDE.search(text)
  return (text.count("\n", 0, match.start()) + 2, match.group(1)) if match else None


def _blocks(text: str) -> list[tuple[int, str]]:
  """(line number, code) of the page's python blocks, in order."""
  return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in PYTHON.finditer(text)]


def _exec(code: str, where: str, namespace: dict) -> None:
  try:
    exec(compile(code, where, "exec"), namespace)  # pylint: disable=exec-used
  except Exception as error:
    raise AssertionError(f"{where}: the snippet fails when pasted: {type(error).__name__}: {error}") from error


def run_page(page: pathlib.Path) -> None:
  """Runs the prelude in a namespace of its own (it prepares files), then each block in a fresh namespace, or in the
  one of the block it continues (`CONTINUES`), as a reader who pastes just that block (and the one it names)."""
  text, name = page.read_text(), _name(page)
  if prelude := _prelude(text):
    _exec(prelude[1], f"{name}:{prelude[0]} (prelude)", {"__name__": f"docs_{page.stem}_prelude"})
  namespaces: list[dict] = []
  for line, code in _blocks(text):
    where = next((w for marker, w in CONTINUES.items() if code.startswith(marker)), None)
    assert where is None or namespaces, f"{name}:{line} continues a block, but it is the page's first"
    namespace = {"__name__": f"docs_{page.stem}"} if where is None else namespaces[-1 if where == "above" else 0]
    _exec(code, f"{name}:{line}", namespace)
    namespaces.append(namespace)


RUNNABLE = [page for page in PAGES if PYTHON.search(page.read_text())]


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_every_python_block_runs_when_pasted_alone(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the files a snippet writes or its prelude prepares (workdirs/) go here
  run_page(page)


def test_a_block_that_needs_another_fails_unless_it_names_it(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  page = tmp_path / "page.md"
  page.write_text("```python\nx = 1\n```\n\n```python\ny = x + 1\n```\n")
  with pytest.raises(AssertionError, match="page.md:6: the snippet fails when pasted: NameError"):
    run_page(page)
  page.write_text("```python\nx = 1\n```\n\n```python\nz = 2\n```\n\n```python\n# continues the first block\n"
                  "assert x == 1 and 'z' not in dir()\n```\n")
  run_page(page)


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
  line that is not there. Whitespace counts: a line of spaces matches only the same spaces."""
  position = 0
  for line in shown:
    if line.strip() == "...":
      continue
    pattern = re.compile(".*".join(map(re.escape, line.split("..."))) + r"\Z")
    while position < len(printed) and not pattern.match(printed[position]):
      position += 1
    if position == len(printed):
      return line
    position += 1
  return None


def _commands(text: str) -> str:
  """The page's shell commands as one line each (backslash continuations joined, runs of spaces as one)."""
  return " ".join(text.replace("\\\n", " ").split())


@pytest.mark.parametrize("page", [page for page in PAGES if SHOWN.search(page.read_text())], ids=_name)
def test_every_output_the_page_shows_is_the_recorded_output_of_its_command(page):
  text, recorded = page.read_text(), _recorded()
  for match in SHOWN.finditer(text):
    title, shown = match.group(1), match.group(2).split("\n")[:-1]
    assert title in recorded, f"{page.name}: no section {title!r} in {CLI_OUTPUT.name}"
    command, printed = recorded[title]
    missing = shown_in(shown, printed)
    assert missing is None, f"{page.name} shows {missing!r} as output of `{command}`; {CLI_OUTPUT.name} has not it"
    shown_command = command.removeprefix(".venv/bin/")
    assert shown_command in _commands(text), (
        f"{page.name} shows the output of `{command}` ({title}) but not that command")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_block_without_a_language_is_a_checked_output(page):
  """Shown output is marked for the check above; code, file trees and listings name their language (bash, python,
  text...), so no unchecked output can hide in a page."""
  text = page.read_text()
  unmarked = [text.count("\n", 0, m.start()) + 1 for m in FENCE.finditer(text) if not m.group(1) and not m.group(2)]
  assert not unmarked, (f"{page.name} lines {unmarked}: a ``` block without a language and without "
                        "<!-- cli_output: SECTION -->; mark the output it shows, or name the block's language")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_commands_of_the_page_write_only_into_folders_git_ignores(page):
  """A --workdir, --output or --data_dir in a page's bash blocks lies in a folder .gitignore lists (workdirs/): a
  reader's walk through the docs leaves the clone's tracked files alone."""
  ignored = {line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text().splitlines()
             if line.strip().endswith("/") and not line.startswith("#")}
  commands = " ".join(m.group(3) for m in FENCE.finditer(page.read_text()) if m.group(2) == "bash")
  for path in WRITES.findall(commands):
    path = shlex.split(path)[0] if path[:1] in "'\"" else path
    if "://" in path or path.startswith(("$", "/", "~")) or path.isupper() or "DIR" in path or path == ".":
      continue  # a bucket, a placeholder or the reader's own choice
    assert path.split("/")[0] in ignored, f"{page.name}: a command writes {path}, in no folder .gitignore lists"


def test_the_output_check_tells_a_different_output_apart():
  printed = ["step 100: valid bits/byte 4.7972 (loss 3.3251 nats)", "speed: 9,111 tokens/s", "   ", "done"]
  assert shown_in(["step 100: valid bits/byte 4.7972 (...)", "...", "done"], printed) is None
  assert shown_in(["speed: ... tokens/s"], printed) is None
  assert shown_in(["step 100: valid bits/byte 4.7973 (...)"], printed) == "step 100: valid bits/byte 4.7973 (...)"
  assert shown_in(["done", "speed: ... tokens/s"], printed) == "speed: ... tokens/s"  # the order counts
  assert shown_in(["   ", "done"], printed) is None and shown_in(["", "done"], printed) == ""  # spaces count


def test_the_recorded_output_leaves_out_only_what_depends_on_the_machine():
  printed = ("compile: 13.1 s (persistent cache miss; cached in ~/.cache/hourglass_jax/xla)\n"
             "train:   0%|          | 0/30 [00:00<?]\n"
             "step 30: valid bits/byte 5.8670 (loss 4.0667 nats; partial: first 8 of 1,285 batches (1%))\n"
             "W1128 01:53:33.447012 140035805088640 checkpoint_manager.py:1466] Waiting for previous save to complete "
             "took 1.102745 seconds. If this number is high, consider checkpointing less frequently.\n"
             "train: 100%|##########| 30/30 [00:03<00:00, loss 3.812, bits/byte 5.499, 9,1 tok/s]\n"
             "train: 100%|##########| 30/30 [00:03<00:00, loss 3.812, bits/byte 5.499]\n"
             "eval test:   0%|          | 0/9 [00:00<?, ?batch/s]\n"
             "eval test: 100%|##########| 9/9 [00:01<00:00, 8.12batch/s]\n"
             "speed over 30 timed steps: 8,252 tokens/s, 23 ms/step, MFU 2.95% (vs ...)\n"
             "    \n"
             "a sample line with trailing spaces  \n"
             "speculative decoding (ngram, 4 proposals per pass): 30 passes of 2.10 tokens, 5 plain steps (plain "
             "decoding from pass 8, the draft back 1 time); a pass costs 1.62 plain steps (measured): 1.21x plain "
             "decoding (measured)\n")
  assert _script().masked(printed) == [
      "compile: ... s (...)",
      "step 30: valid bits/byte 5.8670 (loss 4.0667 nats; partial: first 8 of 1,285 batches (1%))",
      "train: 100%|##########| 30/30 [...<00:00, loss 3.812, bits/byte 5.499]",
      "speed over 30 timed steps: ... tokens/s, ... ms/step, MFU ...% (vs ...)",
      "    ", "a sample line with trailing spaces  ",
      "speculative decoding (ngram, 4 proposals per pass): ... passes of ... tokens, ... plain steps; a pass costs ... "
      "plain steps (measured): ...x plain decoding (measured)"]
