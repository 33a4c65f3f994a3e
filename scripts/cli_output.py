"""Runs the commands whose output README.md and docs/*.md show, from the repository root in the order a newcomer
runs them, and writes what each printed to benchmarks/results/cli_output.md, speeds and times left out (`...`):
they depend on the machine and its load; bits per byte, parameter counts, compiled memory and samples do not, but
for the CPU's vector instructions (the file's header says which; see `write`). tests/test_docs.py checks every
output the docs show against that file. The pictures the docs show from these runs are copied into docs/ (COPIES).

    .venv/bin/python scripts/cli_output.py [--only tiny,default,...] [--fresh]

Sections (each a list of commands; --only reruns those and keeps the others' recorded output):
  tiny          the README's run: train configs/tiny.py for 300 steps, sample it, score its test split
  default       `make train` (configs/default.py), then score its valid and test splits, sample it
                (docs/generation.md)
  default_export  export the default run, show the export's cards, sample and score the export (docs/weights.md)
  default_draft configs/draft.py's draft for configs/default.py, and speculative sampling with it
                (docs/generation.md)
  default_1000  configs/default.py for 1,000 steps (5% warmup), scored on the valid split (docs/choosing.md)
  default_1000_other_settings  the same with learning rate 1e-3, dropout 0.1 and training windows every 64
                bytes, for comparison (docs/choosing.md)
  dynamic_1000  configs/dynamic.py:whitespace for 1,000 steps, scored on the valid split, its cuts of a sentence
                (docs/choosing.md)
  digits        configs/digits.py (its 300 steps), scored on the valid split, images drawn from scratch and
                completed (docs/choosing.md, docs/generation.md)
  plot          hourglass-plot of the tiny and default runs (the README's picture)
  help_config   hourglass-train --help_config of configs/tiny.py (docs/training.md)
  data          hourglass-data prepare of the embedded corpus into a data dir of its own (docs/data.md)
  launch        launch/slurm.sh --dry-run (docs/running.md)

The runs write into workdirs/ (the folders the docs name); a section whose workdir exists is refused unless
--fresh, which deletes those workdirs first. Each command runs as its console script does (the same entry point,
with this checkout's python), so the printed paths are the docs' `.venv/bin/...`; `cat` shows a file.
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
           "hourglass-export": "hourglass_jax.cli.main import export_entry as entry",
           "hourglass-data": "hourglass_jax.cli.main import data_entry as entry",
           "hourglass-boundaries": "hourglass_jax.cli.boundaries import main as entry",
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
        ("default_eval_test", f"hourglass-eval {DEFAULT} --split=test"),
        ("default_sample", f"hourglass-sample {DEFAULT} --prompt='import ' --num_samples=4 --max_new_tokens=80 "
                           "--temperature=0.6 --seed=1 --end_byte=10")]),
    "default_export": (["workdirs/default_export"], [
        ("default_export", "hourglass-export --workdir=workdirs/default --output=workdirs/default_export"),
        ("default_export_readme", "cat workdirs/default_export/README.md"),
        ("default_export_card", "cat workdirs/default_export/config.json"),
        ("default_export_sample", "hourglass-sample --workdir=workdirs/default_export --prompt='import ' "
                                  "--num_samples=1 --max_new_tokens=60 --temperature=0.6 --seed=1"),
        ("default_export_eval", "hourglass-eval --config=configs/default.py --workdir=workdirs/default_export "
                                "--split=test")]),
    "default_draft": (["workdirs/default_draft"], [
        ("default_draft_train", "hourglass-train --config=configs/draft.py:configs/default.py "
                                "--workdir=workdirs/default_draft"),
        ("default_draft_sample", f"hourglass-sample {DEFAULT} --prompt='import ' --num_samples=1 --temperature=0 "
                                 "--draft=workdirs/default_draft")]),
    "default_1000": (["workdirs/default_1000"], [
        ("default_1000_train", f"hourglass-train {DEFAULT_1000}"),
        ("default_1000_eval", f"hourglass-eval {DEFAULT_1000} --split=valid")]),
    "default_1000_other_settings": (["workdirs/default_1000_previous"], [
        ("default_1000_other_settings_train", f"hourglass-train {OTHER_1000}"),
        ("default_1000_other_settings_eval", f"hourglass-eval {OTHER_1000} --split=valid")]),
    "dynamic_1000": (["workdirs/dynamic_1000"], [
        ("dynamic_1000_train", f"hourglass-train {DYNAMIC_1000}"),
        ("dynamic_1000_eval", f"hourglass-eval {DYNAMIC_1000} --split=valid"),
        ("dynamic_1000_boundaries", "hourglass-boundaries --workdir=workdirs/dynamic_1000 "
                                    "--text='The ship sailed at dawn, and the harbour was empty by noon.'")]),
    "digits": (["workdirs/digits"], [
        ("digits_train", f"hourglass-train {DIGITS}"),
        ("digits_eval", f"hourglass-eval {DIGITS} --split=valid"),
        ("digits_sample", f"hourglass-sample {DIGITS} --num_samples=8"),
        ("digits_sample_rows", f"hourglass-sample {DIGITS} --num_samples=8 --prompt_rows=4 --split=test "
                               "--output=workdirs/digits/rows.png")]),
    "plot": (["workdirs/learning_curves.png"], [
        ("plot", "hourglass-plot workdirs/tiny workdirs/default --output=workdirs/learning_curves.png")]),
    "help_config": ([], [("help_config", "hourglass-train --help_config --config=configs/tiny.py")]),
    "data": (["workdirs/data/tfds"], [
        ("data_prepare", "hourglass-data prepare stdlib_text --data_dir=workdirs/data/tfds")]),
    "launch": ([], [("slurm_dry_run", "launch/slurm.sh --nodes=2 --gpus-per-node=8 --config=configs/enwik8.py:pod "
                                      "--workdir=/shared/runs/enwik8 --dry-run")]),
}
# The pictures the docs show, each copied from where its section's command wrote it.
COPIES = {"plot": {"workdirs/learning_curves.png": "docs/learning_curves.png"},
          "digits": {"workdirs/digits/samples/images_step300.png": "docs/generation_digits_scratch.png",
                     "workdirs/digits/rows.png": "docs/generation_digits_rows.png"}}
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
    (re.compile(r"^built (\S+) in [\d.]+ s$"), r"built \1 in ... s"),
    # speculation switches between passes and plain steps on measured time, so its counts vary with the machine too
    (re.compile(r"^(speculative decoding \(.*?\)): .*\((measured|estimated)\)$"),
     r"\1: ... passes of ... tokens, ... plain steps; a pass costs ... plain steps (\2): ...x plain decoding (\2)"),
]
PROGRESS = re.compile(r"^(train|eval \w+): +\d+%\|")  # a progress line
SLOW_SAVE = re.compile(r"^W\d{4} .*Waiting for previous save to complete took")  # Orbax, when the disk is busy


def masked(output: str) -> list[str]:
  """The printed lines, as printed (trailing and whitespace-only lines kept: a sample may hold them), with the
  machine's figures as '...'; of the training bar only its last line, finished, which a terminal leaves in place of
  the others, and no evaluation bar (a terminal erases it when it ends). Orbax's warning that a save waited for the
  one before (it depends on the disk's load) is left out."""
  lines = output.split("\n")
  lines = lines[:-1] if lines and not lines[-1] else lines
  last = {PROGRESS.match(line).group(1): i for i, line in enumerate(lines) if PROGRESS.match(line)}
  kept = []
  for i, line in enumerate(lines):
    bar = PROGRESS.match(line)
    if (bar and (last[bar.group(1)] != i or "100%|" not in line or bar.group(1) != "train")) or SLOW_SAVE.match(line):
      continue
    for pattern, replacement in MASKS:
      line = pattern.sub(replacement, line)
    kept.append(line)
  return kept


def run(command: str) -> str:
  """Runs `command` (a console script and its arguments, or `cat FILE`) from the repository root; returns what it
  printed, stdout and stderr in the order a terminal shows them."""
  name, *args = shlex.split(command)
  if name == "cat":
    return (REPO / args[0]).read_text()
  if name.endswith(".sh"):  # a launch script (its --dry-run prints what it would run)
    done = subprocess.run(["bash", str(REPO / name), *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode:
      raise SystemExit(f"cli_output: `{command}` failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return done.stdout
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
  found = re.findall(r"^## (\w+)\n\n`([^\n]*)`\n\n````\n(.*?)^````$", path.read_text(), re.M | re.S)
  return {title: (command, body.split("\n")[:-1]) for title, command, body in found}


def _cpu() -> tuple[str, str]:
  """(the CPU's model name, the vector instructions XLA:CPU compiles for here)."""
  info = pathlib.Path("/proc/cpuinfo").read_text() if os.path.exists("/proc/cpuinfo") else ""
  name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
              platform.processor())
  flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
  isa = [name for name, flag in (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("FMA", "fma")) if flag in flags]
  return name, " + ".join(isa) or platform.machine()


def write(sections: dict) -> None:
  cpu, isa = _cpu()
  text = ["# Output of the documented commands", "",
          f"What the commands of README.md and docs/*.md printed on {os.cpu_count()} CPU cores ({cpu}; vector "
          f"instructions {isa}), run from the repository root by `scripts/cli_output.py` in this order. Speeds and "
          "times are left out (`...`): they depend on the machine and its load. Bits per byte, parameter counts, "
          "compiled memory and samples do not, except through the CPU's vector instructions: XLA compiles for the "
          "host's, and another set rounds float sums in another order, which can move a score in its 4th decimal "
          "and change a sample (configs/digits.py's step-200 score is 1.9080 here and 1.9075 with "
          "`XLA_FLAGS=--xla_cpu_max_isa=AVX`, no AVX2 or FMA).", ""]
  order = [title for _, commands in SECTIONS.values() for title, _ in commands]
  for title in order:
    if title in sections:
      command, lines = sections[title]
      text += [f"## {title}", "", f"`{command}`", "", "````", *lines, "````", ""]
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
        if (REPO / workdir).is_dir():
          shutil.rmtree(REPO / workdir)
        else:
          (REPO / workdir).unlink()
  sections = read_sections()
  for name in SECTIONS:
    if name not in chosen:
      continue
    for title, command in SECTIONS[name][1]:
      print(f"running {title}: {command}", file=sys.stderr, flush=True)
      shown = f".venv/bin/{command}" if command.split()[0] in ENTRIES else command
      sections[title] = (shown, masked(run(command)))
      write(sections)
    for source, target in COPIES.get(name, {}).items():
      shutil.copyfile(REPO / source, REPO / target)


if __name__ == "__main__":
  main()
