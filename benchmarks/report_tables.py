"""The tables of BENCHMARKS.md (benchmarks/report.py), each built from one results file's records."""

import ast
import importlib
import json
import pathlib
import re
import statistics


def _compile_time_depths() -> tuple[str, str]:
  """compile_time.py's (DEEP, SHALLOW) hierarchies, read from its source (it imports its siblings as a script)."""
  tree = ast.parse((pathlib.Path(__file__).parent / "compile_time.py").read_text())
  return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
              and ast.unparse(node.targets[0]) == "(DEEP, SHALLOW)")


DEEP, SHALLOW = _compile_time_depths()

_SILENT = {"quick": False, "no_plot": False, "results": "", "results_dir": None}


def machine(entry: dict) -> str:
  """'NVIDIA H100 80GB HBM3' or 'AMD EPYC, 2 cores, load 1.5' (the 1-minute load average when it ran)."""
  facts = entry.get("machine", {})
  if facts.get("backend") == "gpu":
    return facts.get("device", "GPU")
  load = facts.get("loadavg") or entry.get("load_start") or entry.get("loads") or [None]
  load_text = f", load {load[0]:.1f}" if load[0] is not None else ""
  return f"{facts.get('cpu', 'CPU').split(' @ ')[0]}, {facts.get('cores', 2)} cores{load_text}"


def date(entry: dict) -> str:
  return entry["time"][:10]


def source(how: str, results_file: str, where: str, when: str) -> str:
  """The one-row table that opens a section: the command, its results file, the machine and the date."""
  return (f"| command | results file | machine | date |\n|---|---|---|---|\n| `{how}` | "
          f"`benchmarks/results/{results_file}` | {where} | {when} |\n")


def command(script: str, args: dict) -> str:
  """The command line that made a record: the script with every recorded argument other than its default."""
  defaults = {}
  module = importlib.import_module(f"benchmarks.{script}")
  if hasattr(module, "parse_args"):
    defaults = vars(module.parse_args([]))
  flags = []
  for key, value in args.items():
    if key in defaults and defaults[key] == value or _SILENT.get(key, object()) == value:
      continue
    if key == "name" and value == script:
      continue
    flags.append(f"--{key}" if value is True else f"--{key} {value}")
  return " ".join([f".venv/bin/python benchmarks/{script}.py", *flags])


SCRIPTS = {"gpu_throughput": "throughput", "enwik8_mfu": "throughput", "throughput_4096": "throughput",
           "throughput": "throughput", "peer_compare_wide": "peer_compare", "learning": "learning"}


def headline_row(figure: str, value: str, entry: dict, results_file: str) -> str:
  stem = results_file.removesuffix(".json")
  if "args" in entry and stem in SCRIPTS:
    how = command(SCRIPTS[stem], entry["args"])
  else:
    how = COMMANDS[stem]
  return f"| {figure} | **{value}** | {machine(entry)} | {date(entry)} | `{how}` | `{results_file}` |"


COMMANDS = {
    "shortening_study": ".venv/bin/python benchmarks/shortening_study.py --budgets_tflop 1,4,16,64 "
                        "[--corpus tinyshakespeare.txt]",
    "compile_time": ".venv/bin/python benchmarks/compile_time.py",
}


def newest_rows(entries: list[dict]) -> list[tuple[dict, dict]]:
  """(row, its record) of each case (preset, length, dtype, batch, model and train overrides), newest first."""
  seen, out = set(), []
  for entry in reversed(entries):
    for row in entry["rows"]:
      key = (row["preset"], row["seq_len"], row["dtype"], row["batch"], entry["args"].get("model", ""),
             entry["args"].get("train", ""))
      if key not in seen:
        seen.add(key)
        out.append((row, entry))
  return out


def _step_table(pairs) -> list[str]:
  lines = ["| model | length | dtype | batch | overrides | memory | step | tokens/s | MFU (f32 peak) | "
           "MFU (own dtype's peak) | date |", "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---|"]
  for row, entry in sorted(pairs, key=lambda p: (p[0]["preset"], p[0]["seq_len"], p[0]["dtype"])):
    overrides = ", ".join(filter(None, (entry["args"].get("model"), entry["args"].get("train")))) or "-"
    step = f"{row['step_s'] * 1e3:,.0f} ms" if row.get("step_s") else "not run"
    speed = (f"{row['tokens_per_s']:,.0f} | {row['mfu_vs_f32']:.1%} | {row['mfu_vs_dtype_peak']:.1%}"
             if row.get("step_s") else " | | ")
    lines.append(f"| {row['preset']} | {row['seq_len']} | {row['dtype']} | {row['batch']} | {overrides} | "
                 f"{row['memory_bytes'] / 2**30:.2f} GiB | {step} | {speed} | {date(entry)} |")
  return lines


def throughput_section(results: pathlib.Path) -> str:
  parts = ["## Training speed\n",
           "The real train step (`Trainer.compile_train_step`, synthetic bytes, no evaluation or checkpoints). MFU = "
           "analytic model FLOPs (3x the forward matmuls, attention as the full square) / step time / the matmul "
           "peak measured in the same run. The presets are in `benchmarks/models.py`: `hourglass_enwik8` is "
           "configs/enwik8.py's model (113.75M parameters; `vanilla_enwik8` 31.79M), `vanilla` / `hourglass` / `topdown` "
           "have configs/default.py's widths (d 128), vanilla `8@1`, Hourglass `2@1 4@3 2@1` with attention "
           "resampling.\n"]
  for name, title in (("gpu_throughput", "One GPU"), ("enwik8_mfu", "The enwik8 model on 2 CPU cores"),
                      ("throughput_4096", "Hourglass against vanilla at 4096 bytes, 2 CPU cores"),
                      ("throughput", "Every length, 2 CPU cores")):
    entries = json.loads((results / f"{name}.json").read_text())
    pairs = newest_rows(entries)
    newest = max((e for _, e in pairs), key=date)
    parts.append(f"### {title}\n")
    parts.append(source(command("throughput", newest["args"]), f"{name}.json", machine(newest), date(newest)))
    if name != "throughput":  # the every-length sweep: its ratios below
      parts.append("The newest run of each case:\n")
      parts.extend(_step_table(pairs))
    ups = newest.get("speedups") or []
    if ups:
      parts.append("\n| Hourglass / vanilla | length | dtype | FLOP-predicted speed-up | measured | of predicted | "
                   "memory ratio |\n|---|---:|---|---:|---:|---:|---:|")
      parts.extend(f"| {u['preset']} | {u['seq_len']} | {u['dtype']} | {u['flop_speedup']:.2f}x | "
                   + (f"{u['step_speedup']:.2f}x | {u['fraction_of_predicted']:.0%}" if "step_speedup" in u
                      else "not run | ") + f" | {u['memory_ratio']:.2f} |" for u in ups)
    parts.append("")
  return "\n".join(parts)


class Study:
  """A compute-matched study's runs (benchmarks/shortening_study.py) as its own table reads them."""

  def __init__(self, results: pathlib.Path, name: str):
    from benchmarks import shortening_study as study  # imports jax: only when the page is made

    self.lib, self.name = study, name
    layers = "2,8,2" if name.endswith("2_8_2") else study.LAYERS
    self.args = study.parse_args(["--name", name, "--layers", layers])
    self.runs = study.recorded_runs(self.args, results / f"{name}.json")
    self.corpora = list(dict.fromkeys(r["corpus_id"] for r in self.runs))
    self.budgets = sorted({r["budget_tflop"] for r in self.runs})
    self.newest = max(self.runs, key=lambda r: r["time"])

  def short_name(self, corpus: str) -> str:
    text = next(r["corpus"] for r in self.runs if r["corpus_id"] == corpus)
    return "Python code (the embedded corpus)" if "stdlib" in text else text.split(" (")[0]

  def means(self, corpus: str, budget: float) -> dict:
    runs = self.lib.chosen_runs(self.runs, corpus, self.budgets)
    models = {r["model"] for r in runs}
    return {m: statistics.mean(self.lib.score(r) for r in runs if r["model"] == m and r["budget_tflop"] == budget)
            for m in models if any(r["model"] == m and r["budget_tflop"] == budget for r in runs)}

  def table(self, corpus: str) -> str:
    models = [m for m in self.args.models.split(",") if any(r["model"] == m for r in self.runs
                                                             if r["corpus_id"] == corpus)]
    return self.lib.table(self.runs, corpus, self.budgets, models, 0, len(self.lib.floats(self.args.learning_rates)),
                          gaps=False)


def study_section(study: Study, deep: Study) -> str:
  parts = ["## Learning at equal compute: Hourglass, vanilla and learned shortening\n",
           source(COMMANDS["shortening_study"], "shortening_study.json", machine(study.newest), date(study.newest)),
           f"{len(study.runs)} runs: validation bits per byte (the whole split) "
           f"after the same analytic training FLOPs. Widths {study.args.model}, batch {study.args.batch} x "
           f"{study.args.seq_len} bytes, no dropout, AdamW with 5% warmup and cosine decay, each model's learning rate "
           f"the best of {study.args.learning_rates} at the middle budget. Shortened models `2@1 4@4 2@1`, vanilla "
           "`8@1`; the learned ones (`dynamic_*`, `shorten='dynamic'`) at segment capacity 1.0, so a learned level "
           "costs what a fixed one does. `fixed_attention` is the paper's attention resampling, `fixed_avg` "
           "avg/repeat. Without `--corpus` the study trains on the embedded corpus; tinyshakespeare.txt is "
           f"karpathy's char-rnn copy. {study.lib.TABLE_NOTE}\n"]
  for corpus in study.corpora:
    parts.append(f"### {study.short_name(corpus)}\n\n{study.table(corpus)}\n")
  parts.append("### Most layers in the shortened level: `2@1 8@4 2@1` against vanilla `12@1`\n")
  parts.append(source(".venv/bin/python benchmarks/shortening_study.py --layers 2,8,2 --name shortening_study_2_8_2",
                      "shortening_study_2_8_2.json", machine(deep.newest), date(deep.newest)))
  for corpus in deep.corpora:
    parts.append(f"{deep.short_name(corpus)}:\n\n{deep.table(corpus)}\n")
  return "\n".join(parts)


def learning_section(entry: dict) -> str:
  by = {}
  for run in entry["runs"]:
    by.setdefault((run["preset"], run["hierarchy"]), []).append(run)
  lines = ["## Learning at equal compute: the quick check\n",
           source(command("learning", entry["args"]), "learning.json", machine(entry), date(entry)),
           f"{entry['args']['budget_tflop']} TFLOP per run, widths {entry['args']['model']}, "
           f"batch {entry['args']['batch']} x {entry['args']['seq_len']}.\n",
           "| model | steps | valid bits/byte per seed | mean |", "|---|---:|---|---:|"]
  for (preset, hierarchy), runs in by.items():
    bits = [r["valid_bits"] for r in runs]
    lines.append(f"| {preset} `{hierarchy}` | {runs[0]['steps']} | {', '.join(f'{b:.3f}' for b in bits)} | "
                 f"{statistics.mean(bits):.3f} |")
  return "\n".join(lines) + "\n"


def dynamic_section(results: pathlib.Path) -> str:
  step = json.loads((results / "dynamic_step.json").read_text())[-1]
  decode = json.loads((results / "dynamic_decode.json").read_text())[-1]
  lines = ["## Learned shortening: what a learned level costs\n",
           source(".venv/bin/python benchmarks/dynamic_step.py", "dynamic_step.json", machine(step), date(step)),
           f"Train step of `configs/dynamic.py`'s model (batch {step['args']['batch']} x {step['args']['seq_len']}) "
           f"against fixed avg at factor 4, median of {step['args']['rounds']} interleaved rounds:\n",
           "| model | model GFLOP/step | step | time / fixed |", "|---|---:|---:|---:|"]
  for name, row in step["rows"].items():
    lines.append(f"| {name} | {row['model_flops'] / 1e9:.1f} | {row['median_step_s'] * 1e3:.0f} ms | "
                 f"{row['vs_fixed']:.2f} |")
  lines += ["", source(".venv/bin/python benchmarks/dynamic_decode.py --text tinyshakespeare.txt",
                      "dynamic_decode.json", machine(decode), date(decode)),
            f"Cached decoding of {decode['args']['steps']} bytes after a {decode['args']['prompt']}-byte prompt:\n",
            "| model | batch | boundary rate | tokens/s | time / fixed |", "|---|---:|---:|---:|---:|"]
  for name, row in decode["rows"].items():
    lines.append(f"| {name.rsplit('_batch', 1)[0]} | {row['batch']} | {row['boundary_rate']:.3f} | "
                 f"{row['tokens_per_s']:,.0f} | {row['time_vs_fixed']:.2f} |")
  return "\n".join(lines) + "\n"


def peer_rows(entries: list[dict]) -> list[dict]:
  """The newest record of each setting (threads, pin, our allocator, the peer's) that names its allocators."""
  seen, out = set(), []
  for entry in reversed(entries):
    args = entry["args"]
    key = (args.get("threads"), args.get("pin"), args.get("host_malloc"), args.get("peer_malloc"))
    if "host_malloc" in args and key not in seen:
      seen.add(key)
      out.append(entry)
  return out


def peer_section(entries: list[dict]) -> str:
  first = entries[0]
  lines = ["## Against lucidrains' `hourglass-transformer-pytorch`\n",
           f"`.venv/bin/python benchmarks/peer_compare.py --shape wide --seq_len 1024` (after "
           f"`bash benchmarks/peer/setup_peer.sh`; `benchmarks/results/peer_compare_wide.json`): ours "
           f"`{first['ours']['config']}`, {first['ours']['params']:,} params; the peer `{first['peer']['config']}`, "
           f"{first['peer']['params']:,} params, torch {first['peer']['torch']}. Batch {first['args']['batch']} x "
           f"{first['args']['seq_len']}, forward + loss + backward + Adam, the two alternating; ratio = median of "
           "the per-round ratios. `host_malloc auto` is what `hourglass-train` does on CPU; `keep` gives the peer "
           "the same allocator setting.\n",
           "| torch threads | pinned to core | our malloc | peer malloc | ours tokens/s | peer tokens/s | ours / peer "
           "| "
           "machine | date |", "|---:|---|---|---|---:|---:|---:|---|---|"]
  for e in entries:
    a = e["args"]
    lines.append(f"| {a['threads'] or 'default'} | {a['pin'] or '-'} | {a['host_malloc']} | {a['peer_malloc']} | "
                 f"{e['tokens_per_s']['ours']:,.0f} | {e['tokens_per_s']['peer']:,.0f} | "
                 f"**{e['speed_ratio_median']:.2f}x** | {machine(e)} | {date(e)} |")
  return "\n".join(lines) + "\n"


def compile_section(entry: dict) -> str:
  lines = ["## Compile time\n",
           source(COMMANDS["compile_time"], "compile_time.json", machine(entry), date(entry)),
           f"The train step at batch {entry['batch']} x {entry['seq_len']}, shallow = `{SHALLOW}`, deep = `{DEEP}` "
           "(configs/enwik8.py's depth); scanned = `nn.scan` over identical blocks (the library's layout), unrolled = "
           "one block each.\n",
           "| case | compile | compiled memory |", "|---|---:|---:|"]
  for name, case in entry["cases"].items():
    lines.append(f"| {name.replace('_', ', ')} | {case['compile_s']:.1f} s | {case['memory_gib']:.2f} GiB |")
  cache = entry["cache"]
  lines.append(f"\nThe persistent compilation cache: a second compile of the same step took {cache['second_s']:.1f} s "
               f"against {cache['first_s']:.1f} s ({cache['second_over_first']:.0%}). Scanned steps run "
               f"{entry['step']['scanned_over_unrolled']:.2f}x the unrolled step time.\n")
  return "\n".join(lines)


def checkpoint_section(entry: dict) -> str:
  s = entry["seconds"]
  return ("## Checkpoints\n\n"
          + source(".venv/bin/python benchmarks/checkpoint_integrity.py", "checkpoint_integrity.json",
                   machine(entry), date(entry))
          + f"\nThe {entry['model']} train state ({entry['state_mib']:,} MiB), median of {entry['rounds']} rounds.\n\n"
          f"| operation | plain | with fingerprints | ratio |\n|---|---:|---:|---:|\n"
          f"| save | {s['save']:.2f} s | {s['save+fingerprints']:.2f} s | {entry['ratios']['save']:.2f} |\n"
          f"| restore | {s['restore']:.2f} s | {s['restore+verify']:.2f} s | {entry['ratios']['restore']:.2f} |\n")


_DATE = re.compile(r",? ?\b\d{4}-\d{2}-\d{2}(T[\d:+]+)?")


def markdown_section(title: str, path: pathlib.Path, how: str, where: str, when: str, drop: str | tuple = "",
                     drop_blocks: tuple[str, ...] = ()) -> str:
  """A results file its script writes as Markdown, under its own heading (its title line dropped; the date goes to
  the source table; rows starting with `drop`, and paragraphs or tables starting with one of `drop_blocks`, left to
  the file)."""
  lines = [line for line in path.read_text().strip().splitlines() if not drop or not line.startswith(drop)]
  blocks = "\n".join(lines[1:] if lines[0].startswith("# ") else lines).strip().split("\n\n")
  body = "\n\n".join(block for block in blocks if not block.startswith(drop_blocks))
  body = _DATE.sub("", body.replace("\n## ", "\n### "))
  return f"## {title}\n\n{source(how, path.name, where, when)}\n{body}\n"
