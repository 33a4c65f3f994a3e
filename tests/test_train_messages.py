"""What a run tells its user: a warmup that outlasts the run, one labelled speed figure per quantity at the end,
what to run next, and TensorBoard text that keeps its layout."""

import io
import shlex

from hourglass_jax.train import progress
from hourglass_jax.train.checks import warmup_warning
from hourglass_jax.train.loop import train_and_evaluate
from hourglass_jax.train.metrics import preformatted
from hourglass_jax.train.report import next_steps
from tests.helpers import tiny_config


def test_a_warmup_as_long_as_the_run_is_named_with_its_fix():
  cfg = tiny_config(steps=100, train=dict(warmup_steps=100, learning_rate=1e-3))
  assert warmup_warning(cfg.train) == (
      "train.warmup_steps=100 >= train.steps=100: the learning rate never reaches train.learning_rate=0.001 (it "
      "stops at 0.001); set --config.train.warmup_steps=10 or raise --config.train.steps.")
  cfg.train.steps = 50
  assert "(it stops at 0.0005)" in warmup_warning(cfg.train)
  cfg.train.warmup_steps = 49
  assert warmup_warning(cfg.train) is None


def test_a_run_warns_of_its_warmup_and_ends_with_one_speed_per_quantity(tmp_path):
  messages = []
  train_and_evaluate(tiny_config(steps=2, train=dict(warmup_steps=5, log_every=1)), tmp_path, log=messages.append)
  warnings = [m for m in messages if m.startswith("warning: train.warmup_steps=5 >= train.steps=2")]
  assert len(warnings) == 1, messages
  speeds = [m for m in messages if "tokens/s" in m or "ms/step" in m]
  assert len(speeds) == 1 and speeds[0].startswith("speed over 2 timed steps"), messages
  assert speeds[0].count("tokens/s") == speeds[0].count("ms/step") == speeds[0].count("MFU") == 1


def test_next_steps_name_the_files_and_the_commands_of_this_run():
  text = next_steps("configs/tiny.py", "workdirs/my run", ["--config.model.d_model=64"], text=True,
                    bin_dir=".venv/bin")
  lines = text.splitlines()
  assert lines[0].startswith("checkpoints: workdirs/my run/checkpoints")
  assert lines[1] == "metrics: workdirs/my run/metrics.jsonl (one JSON line per logged step) and TensorBoard logs in " \
                     "workdirs/my run"
  sample, evaluate, export, plot, board = (shlex.split(line, comments=True) for line in lines[3:])
  assert sample == [".venv/bin/hourglass-sample", "--config=configs/tiny.py", "--workdir=workdirs/my run",
                    "--config.model.d_model=64", "--prompt=def "]
  assert evaluate[0] == ".venv/bin/hourglass-eval" and evaluate[-1] == "--split=test"
  assert "the whole split" in lines[4]
  assert export == [".venv/bin/hourglass-export", "--workdir=workdirs/my run", "--output=workdirs/my run_export"]
  assert plot == [".venv/bin/hourglass-plot", "workdirs/my run", "--output=workdirs/my run/curves.png"]
  assert board[-1] == "--logdir=workdirs/my run" and board[0] == ".venv/bin/pip"
  image = next_steps("configs/digits.py", "w", text=False)
  assert "--prompt" not in image and image.splitlines()[3].split()[0] == "hourglass-sample"


def test_tensorboard_text_is_a_code_block():
  assert preformatted("def f():\n  return 1\n\n# done") == "    def f():\n      return 1\n    \n    # done"


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_a_redirected_log_gets_one_line_per_update(monkeypatch):
  """Written to a file, each refresh of a bar is a line of its own (no carriage returns), at most one every
  LOG_SECONDS; on a terminal the bar redraws in place."""
  monkeypatch.setattr(progress, "LOG_SECONDS", 0.0)
  log = io.StringIO()
  bar = progress.progress_bar(log, total=3, desc="train", mininterval=0, bar_format="{desc}: {n_fmt}/{total_fmt}")
  for _ in range(3):
    bar.update(1)
  bar.close()
  assert "\r" not in log.getvalue() and log.getvalue().splitlines() == [f"train: {n}/3" for n in range(4)]
  terminal = _Terminal()
  bar = progress.progress_bar(terminal, total=3, desc="train", mininterval=0, bar_format="{desc}: {n_fmt}/{total_fmt}")
  bar.update(3)
  bar.close()
  assert terminal.getvalue().count("\r") >= 2 and terminal.getvalue().count("\n") == 1
