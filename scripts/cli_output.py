"""Runs the commands whose output README.md, docs/training.md and docs/choosing.md show, from the repository root in
the order a newcomer runs them, and writes what each printed to benchmarks/results/cli_output.md, speeds and times
left out (`...`): they depend on the machine and its load; bits per byte, parameter counts, compiled memory and
samples do not. tests/test_docs.py checks every output the docs show against that file.

    .venv/bin/python scripts/cli_output.py [--only tiny,default,...] [--fresh]

Sections (each a list of commands; --only reruns those and keeps the others' recorded output):
  tiny          the README's run: train configs/tiny.py for 300 steps, sample it, score its test split
  default       `make train` (configs/default.py), then score its valid and test splits
  default_1000  configs/default.py for 1,000 steps (5% warmup), scored on the valid split (docs/choosing.md)
  default_1000_other_settings  the same with learning rate 1e-3, dropout 0.1 and training windows every 64
                bytes, for comparison (docs/choosing.md)
  dynamic_1000  configs/dynamic.py:whitespace for 1,000 steps, scored on the valid split (docs/choosing.md)
  digits        configs/digits.py (its 300 steps), scored on the valid split (docs/choosing.md)
  plot          hourglass-plot of the tiny and default runs: docs/learning_curves.png (the README's picture)

The runs write into workdirs/ (the folders the docs name); a section whose workdir exists is refused unless
--fresh, which deletes those workdirs first. Each command runs as its console script does (the same entry point,
with this checkout's python), so the printed paths are the docs' `.venv/bin/...`.
"""

import argparse
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "cli_output.md"
ENTRIES = {"hourglass-train": "hourglass_jax.cli.main import train_entry as entry",
           "hourglass-eval": "hourglass_jax.cli.main import eval_entry as entry",
           "hourglass-sample": "hourglass_jax.cli.main import sample_entry as entry",
           "hourglass-plot": "hourglass_jax.cli.plot import main as entry"}
TINY = "--config=configs/tiny.py --workdir=workdirs/tiny"
DEFAULT = "--config=configs/default.py --workdir=workdirs/default"
DEFAULT_1000 = ("--config=configs/default.py --workdir=workdirs/default_1000 --config.train.steps=1000 "
                "--config.train.warmup_steps=50")
# other training settings, for comparison (docs/choosing.md)
OTHER_1000 = ("--config=configs/default.py --workdir=workdirs/default_1000_previous --config.train.steps=1000 "
              "--config.train.warmup_steps=16 --config.train.learning_rate=1e-3 --config.model.dropout=0.1 "
              "--config.data.train_stride=64")
DYNAMIC_1000 = "--config=configs/dynamic.py:whitespace --workdir=workdirs/dynamic_1000 --config.train.steps=1000"
DIGITS = "--config=configs/digits.py --workdir=workdirs/digits"
SECTIONS = {  # name: (workdirs it writes, [(title, command)])
    "tiny": (["workdirs/tiny"], [
        ("tiny_train", f"hourglass-train {TINY} --config.train.steps=300 --config.train.eval_every=100"),
        ("tiny_sample", f"hourglass-sample {TINY} --prompt='import ' --temperature=0.7"),
        ("tiny_eval", f"hourglass-eval {TINY} --split=test")]),
    "default": (["workdirs/default"], [
        ("default_train", f"hourglass-train {DEFAULT}"),
        ("default_eval_valid", f"hourglass-eval {DEFAULT} --split=valid"),
        ("default_eval_test", f"hourglass-eval {DEFAULT} --split=test")]),
    "default_1000": (["workdirs/default_1000"], [
        ("default_1000_train", f"hourglass-train {DEFAULT_1000}"),
        ("default_1000_eval", f"hourglass-eval {DEFAULT_1000} --split=valid")]),
    "default_1000_other_settings": (["workdirs/default_1000_previous"], [
        ("default_1000_other_settings_train", f"hourglass-train {OTHER_1000}"),
        ("default_1000_other_settings_eval", f"hourglass-eval {OTHER_1000} --split=valid")]),
    "dynamic_1000": (["workdirs/dynamic_1000"], [
        ("dynamic_1000_train", f"hourglass-train {DYNAMIC_1000}"),
        ("dynamic_1000_eval", f"hourglass-eval {DYNAMIC_1000} --split=valid")]),
    "digits": (["workdirs/digits"], [
        ("digits_train", f"hourglass-train {DIGITS}"),
        ("digits_eval", f"hourglass-eval {DIGITS} --split=valid")]),
    "plot": ([], [("plot", "hourglass-plot workdirs/tiny workdirs/default --output=docs/learning_curves.png")]),
}
# What depends on the machine and its load, each replaced by its pattern with the figures as '...'.
MASKS = [
    (re.compile(r"[\d,]+(\.\d+)? (tokens/s|tok/s)"), r"... \2"),
    (re.compile(r"[\d.]+ ms/step"), "... ms/step"),
    (re.compile(r"MFU [\d.]+%"), "MFU ...%"),
    (re.compile(r"MFU peak [\d.,]+ TFLOP/s"), "MFU peak ... TFLOP/s"),
    (re.compile(r"compile: [\d.]+ s \(.*\)$"), "compile: ... s (...)"),
    (re.compile(r"in [\d.]+s \((.*) tokens/s with the KV cache; compiled in [\d.]+s, .*\)$"),
     r"in ...s (... tokens/s with the KV cache; compiled in ...s, ...)"),
    (re.compile(r"\[[\d:]+<"), "[...<"),
]
PROGRESS = re.compile(r"^(train|eval \w+): +\d+%\|")  # a progress line: only a finished bar is kept
SLOW_SAVE = re.compile(r"^W\d{4} .*Waiting for previous save to complete took")  # Orbax, when the disk is busy


def masked(output: str) -> list[str]:
  """The printed lines with the machine's figures as '...', and of each progress bar only its last line, finished:
  a terminal shows that one, in place of the others. Orbax's warning that a save waited for the one before (it
  depends on the disk's load) is left out."""
  lines = [line.rstrip() for line in output.splitlines()]
  last = {PROGRESS.match(line).group(1): i for i, line in enumerate(lines) if PROGRESS.match(line)}
  kept = []
  for i, line in enumerate(lines):
    bar = PROGRESS.match(line)
    if (bar and (last[bar.group(1)] != i or "100%|" not in line)) or SLOW_SAVE.match(line):
      continue
    for pattern, replacement in MASKS:
      line = pattern.sub(replacement, line)
    kept.append(line)
  return kept


def run(command: str) -> str:
  """Runs `command` (a console script and its arguments) from the repository root; returns what it printed, stdout
  and stderr in the order a terminal shows them."""
  name, *args = shlex.split(command)
  argv = [str(REPO / ".venv" / "bin" / "python"), "-c", f"from {ENTRIES[name]}; entry()", *args]
  path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
  env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path)  # unbuffered: stdout and stderr stay in order
  done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if done.returncode:
    raise SystemExit(f"cli_output: `{command}` failed ({done.returncode}):\n{done.stdout[-3000:]}")
  return done.stdout


def read_sections(path=RESULTS) -> dict[str, tuple[str, list[str]]]:
  """{title: (command, printed lines)} of the recorded file (tests/test_docs.py reads it so too)."""
  if not path.exists():
    return {}
  found = re.findall(r"^## (\w+)\n\n`([^\n]*)`\n\n```\n(.*?)^```$", path.read_text(), re.M | re.S)
  return {title: (command, body.splitlines()) for title, command, body in found}


def write(sections: dict) -> None:
  cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
             platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
  text = ["# Output of the documented commands", "",
          f"What the commands of README.md, docs/training.md and docs/choosing.md printed on {os.cpu_count()} CPU "
          f"cores ({cpu}), run from the repository root by `scripts/cli_output.py` in this order. Speeds and times "
          "are left out (`...`): they depend on the machine and its load. Bits per byte, parameter counts, "
          "compiled memory and samples do not.", ""]
  order = [title for _, commands in SECTIONS.values() for title, _ in commands]
  for title in order:
    if title in sections:
      command, lines = sections[title]
      text += [f"## {title}", "", f"`{command}`", "", "```", *lines, "```", ""]
  RESULTS.write_text("\n".join(text))


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections to run")
  parser.add_argument("--fresh", action="store_true", help="delete the sections' workdirs first")
  args = parser.parse_args(argv)
  unknown = set(args.only.split(",")) - set(SECTIONS)
  if unknown:
    parser.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
  return args


def main(argv=None):
  args = parse_args(argv)
  chosen = args.only.split(",")
  for name in chosen:
    for workdir in SECTIONS[name][0]:
      if (REPO / workdir).exists():
        if not args.fresh:
          raise SystemExit(f"cli_output: {workdir} exists; pass --fresh to delete it and run {name} again.")
        shutil.rmtree(REPO / workdir)
  sections = read_sections()
  for name in SECTIONS:
    if name not in chosen:
      continue
    for title, command in SECTIONS[name][1]:
      print(f"running {title}: {command}", file=sys.stderr, flush=True)
      sections[title] = (f".venv/bin/{command}", masked(run(command)))
      write(sections)


if __name__ == "__main__":
  main()
