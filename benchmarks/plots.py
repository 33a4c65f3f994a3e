"""Matplotlib figures of the benchmark results (PNG, headless). matplotlib comes with the `bench` extra and is
imported only when a figure is drawn."""

import pathlib

STYLE = {"vanilla": "C0", "hourglass": "C1", "topdown": "C2", "hourglass_enwik8": "C3", "vanilla_enwik8": "C4"}


def cost_curves(rows: list[dict], path: pathlib.Path) -> pathlib.Path:
  """Per training step versus sequence length: XLA FLOPs, compiled memory and measured step time (log-log)."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  panels = (("xla_flops", 1e9, "XLA GFLOP / step"), ("memory_bytes", 2**30, "compiled memory / step (GiB)"),
            ("step_s", 1.0, "measured step time (s)"))
  for ax, (key, scale, label) in zip(axes, panels):
    for (preset, dtype), series in _series(rows, key).items():
      xs, ys = zip(*series)
      ax.plot(xs, [y / scale for y in ys], marker="o", color=STYLE.get(preset, "k"),
              linestyle="-" if dtype == "float32" else "--", label=f"{preset} {dtype}")
    ax.set(yscale="log", xlabel="sequence length (tokens, batch 1)", ylabel=label)
    ax.set_xscale("log", base=2)
    lengths = sorted({r["seq_len"] for r in rows if not r["preset"].endswith("enwik8")})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.xaxis.set_minor_locator(plt.NullLocator())
    ax.grid(True, which="major", alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.suptitle("Training-step cost versus sequence length (loss + grad + AdamW, CPU)")
  return _save(fig, path)


def _series(rows: list[dict], key: str) -> dict:
  out = {}
  for r in sorted(rows, key=lambda r: r["seq_len"]):
    if r.get(key) is not None and not r["preset"].endswith("enwik8"):
      out.setdefault((r["preset"], r["dtype"]), []).append((r["seq_len"], r[key]))
  return out


def loss_curves(runs: list[dict], path: pathlib.Path) -> pathlib.Path:
  """Training loss (bits/byte) against cumulative training FLOPs, one line per model and seed, with the final
  validation bits/byte as markers."""
  fig, ax = _pyplot().subplots(figsize=(8, 5))
  for run in runs:
    color = STYLE.get(run["preset"], "k")
    steps = sorted(run["losses"], key=int)
    flops = [int(s) * run["flops_per_step"] for s in steps]
    ax.plot(flops, [run["losses"][s] for s in steps], color=color, alpha=0.55, linewidth=1,
            linestyle="-" if run["seed"] == 0 else ":", label=f"{run['preset']} seed {run['seed']} (train)")
    ax.scatter([flops[-1]], [run["valid_bits"]], color=color, marker="*", s=120, zorder=3,
               label=f"{run['preset']} seed {run['seed']} valid {run['valid_bits']:.3f}")
  finals = [run["valid_bits"] for run in runs]
  ax.set(xlabel="training FLOPs (analytic, cumulative)", ylabel="bits per byte (training loss; stars: validation)",
         title="Learning efficiency at equal compute", ylim=(min(finals) - 0.3, max(finals) + 1.5))
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7)
  return _save(fig, path)


def ratio_bars(labels: list[str], values: list[float], target: float, ylabel: str, path: pathlib.Path):
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.bar(labels, values, color="C1")
  ax.axhline(target, color="k", linestyle="--", label=f"target {target}")
  ax.set(ylabel=ylabel)
  ax.legend()
  plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
  return _save(fig, path)


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  _pyplot().close(fig)
  return path


def bits_against_flops(runs: list[dict], models: list[str], path: pathlib.Path) -> pathlib.Path:
  """The shortening study: validation bits per byte against training FLOPs, one panel per corpus, one line per
  model (the mean over seeds of `runs`, each model's runs at its chosen rate) and each seed's run as a dot."""
  plt = _pyplot()
  corpora = list(dict.fromkeys(r["corpus_id"] for r in runs))
  fig, axes = plt.subplots(1, len(corpora), figsize=(7 * len(corpora), 4.8), squeeze=False)
  for ax, corpus_id in zip(axes[0], corpora):
    for i, model in enumerate(models):
      grid = [r for r in runs if r["corpus_id"] == corpus_id and r["model"] == model
              and r.get("valid_bits") is not None]
      if not grid:
        continue
      color, style = f"C{i % 10}", "--" if model.startswith("fixed") or model == "vanilla" else "-"
      budgets = sorted({r["budget_tflop"] for r in grid})
      means = [sum(r["valid_bits"] for r in grid if r["budget_tflop"] == b)
               / sum(1 for r in grid if r["budget_tflop"] == b) for b in budgets]
      ax.plot(budgets, means, color=color, linestyle=style, marker="o", label=model)
      ax.scatter([r["budget_tflop"] for r in grid], [r["valid_bits"] for r in grid], color=color, s=10, alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="training FLOPs (analytic, TFLOP)", ylabel="validation bits per byte",
           title=next(r["corpus"] for r in runs if r["corpus_id"] == corpus_id).split(" (")[0])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
  fig.suptitle("Compute-matched shortening study (lines: mean over seeds; dots: each seed)")
  return _save(fig, path)
