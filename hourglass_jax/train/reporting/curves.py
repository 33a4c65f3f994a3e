"""Learning curves of one or more runs, drawn from their workdirs' metrics.jsonl and hourglass-eval's recorded scores
(run_files.py) with matplotlib: training bits per byte (or dim) on the left, the evaluations on the right, one colour
per run, against steps or tokens seen. A partial evaluation (the first batches of the split) is drawn hollow and
dashed, a whole-split one filled, so the two are never taken for each other; each split has its own marker."""

import pathlib

from hourglass_jax.runtime import files, paths
from hourglass_jax.train.reporting import run_files

X_AXES = {"step": "step", "tokens": "tokens_seen"}


def _matplotlib():
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError("hourglass-plot needs matplotlib, which is not installed: pip install 'hourglass-jax[plot]' "
                     "(or pip install matplotlib).") from None
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def _label(workdir) -> str:
  return pathlib.PurePath(str(workdir).rstrip("/")).name or str(workdir)


def evaluation_points(workdir, records: list[dict], bits: str) -> list[dict]:
  """The evaluations of a run: the trainer's (`records`, its metrics.jsonl), and hourglass-eval's recorded
  whole-split scores where the trainer has none of that step and split; each with the tokens seen at its step."""
  tokens = {r["step"]: r["tokens_seen"] for r in records if "tokens_seen" in r}
  logged = [r for r in records if r.get("split") != "train" and bits in r]
  whole = {(r["step"], r["split"]) for r in logged if r.get("whole_split")}
  scored = [dict(r, **{bits: r["bits"], "whole_split": True}) for r in run_files.recorded_evaluations(workdir)
            if "bits" in r and (r["step"], r["split"]) not in whole]
  return [dict(r, tokens_seen=tokens.get(r["step"])) for r in logged + scored]


def _series(evals: list[dict]) -> list[tuple[tuple[str, bool], str]]:
  """((split, whole split), marker) of each evaluation series: a marker per split."""
  splits = sorted({r["split"] for r in evals})
  return [((split, whole), "os^dv"[splits.index(split) % 5]) for split in splits for whole in (True, False)
          if any((r["split"], bool(r.get("whole_split"))) == (split, whole) for r in evals)]


def plot_runs(workdirs, output, x: str = "step") -> str:
  """Draws the runs of `workdirs` into the PNG `output` (its folder is created); returns its path. Raises
  ValueError naming a workdir without metrics, or an unknown `x` ('step' or 'tokens')."""
  if x not in X_AXES:
    raise ValueError(f"--x={x!r}: choose one of {', '.join(X_AXES)}.")
  if not workdirs:
    raise ValueError("name at least one workdir: hourglass-plot WORKDIR [WORKDIR...] --output=FILE.png")
  runs = {}
  for workdir in workdirs:
    records = run_files.read_metrics(workdir)
    if not records:
      raise ValueError(f"{workdir} holds no {run_files.METRICS_FILE} (or an empty one): pass the --workdir of a "
                       "hourglass-train run that has logged at least one step.")
    runs[workdir] = records
  plt = _matplotlib()
  figure, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
  key = X_AXES[x]
  unit = "byte"
  for color, (workdir, records) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * len(runs), runs.items()):
    unit = "dim" if any("bits_per_dim" in r for r in records) else "byte"
    bits = f"bits_per_{unit}"
    train = [r for r in records if r.get("split") == "train" and bits in r and key in r]
    train_ax.plot([r[key] for r in train], [r[bits] for r in train], color=color, label=_label(workdir))
    evals = evaluation_points(workdir, records, bits)
    for (split, whole), marker in _series(evals):
      points = sorted((r for r in evals if (r["split"], bool(r.get("whole_split"))) == (split, whole)
                       and r.get(key) is not None), key=lambda r: r["step"])
      eval_ax.plot([r[key] for r in points], [r[bits] for r in points], marker=marker, color=color,
                   linestyle="-" if whole else "--", markerfacecolor=color if whole else "none",
                   label=f"{_label(workdir)}: {split}{'' if whole else ' (partial)'}")
  for ax, title in ((train_ax, f"training bits/{unit} (mean over each logged window)"),
                    (eval_ax, f"evaluation bits/{unit}")):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("tokens seen" if x == "tokens" else "step")
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=8)
  train_ax.set_ylabel(f"bits per {unit}")
  figure.tight_layout()
  path = paths.as_path(output)
  try:
    files.make_folder(path.parent)
    with files.atomic_file(path) as f:
      figure.savefig(f, format="png", dpi=110)
  finally:
    plt.close(figure)
  return str(path)
