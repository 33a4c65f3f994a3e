"""`hourglass-plot WORKDIR [WORKDIR...] --output=FILE.png`: the learning curves of one or more training runs, from
each workdir's metrics.jsonl (hourglass_jax/train/reporting/curves.py), to compare runs at a glance. Needs
matplotlib (the [plot] extra)."""

import sys

from hourglass_jax.cli import usage

OUTPUT_HELP = "The PNG file to write (its folder is created)."


def main():
  """hourglass-plot WORKDIR [WORKDIR...] --output=FILE.png [--x=tokens]"""
  from absl import app, flags  # the flags are this command's only: defined when it runs

  if "x" not in flags.FLAGS:  # defined once per process (main may run again in the same one)
    flags.DEFINE_enum("x", "step", ["step", "tokens"], "The horizontal axis: training steps or tokens seen.")
  if "output" not in flags.FLAGS:  # hourglass-sample and hourglass-export define it too, where imported
    flags.DEFINE_string("output", None, OUTPUT_HELP)
  output, x = flags.FLAGS["output"], flags.FLAGS["x"]
  usage.declare(usage.PLOT, usage.PLOT_FLAGS, helps=dict(output=OUTPUT_HELP))

  def run(argv):
    usage.quiet_logs()
    if len(argv) < 2 or not output.value:
      raise app.UsageError("usage: hourglass-plot WORKDIR [WORKDIR...] --output=FILE.png")
    from hourglass_jax.train.reporting.curves import plot_runs  # pylint: disable=import-outside-toplevel

    try:
      plot_runs(argv[1:], output.value, x.value)
      print(f"wrote {output.value}")
    except (ValueError, OSError) as error:  # a workdir without metrics, no matplotlib: one line naming it
      sys.exit(f"error: {error}")

  app.run(run, flags_parser=usage.parse_flags)


if __name__ == "__main__":
  main()
