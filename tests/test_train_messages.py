"""What a run tells its user: a warmup that outlasts the run, one labelled speed figure per quantity at the end,
what to run next, and TensorBoard text that keeps its layout."""

import io
import shlex
import sys

import pytest

from hourglass_jax.cli import main
from hourglass_jax.train.checks import warmup_warning
from hourglass_jax.train.compiled.optimizer import make_schedule
from hourglass_jax.train.loop import progress
from hourglass_jax.train.loop.loop import train_and_evaluate
from hourglass_jax.train.reporting.metrics import preformatted, scalars_of
from hourglass_jax.train.reporting.report import example_prompt, next_steps
from tests.helpers import tiny_config


def test_a_warmup_as_long_as_the_run_is_named_with_its_fix():
  """The rate it names is the schedule's at the last step (index steps - 1), never rounded up to the peak."""
  cfg = tiny_config(steps=100, train=dict(warmup_steps=100, learning_rate=1e-3))
  assert warmup_warning(cfg.train) == (
      "train.warmup_steps=100 >= train.steps=100: the learning rate never reaches train.learning_rate=0.001 (the "
      "last step's is 0.00099, 99.0% of it); set --config.train.warmup_steps=10 or raise --config.train.steps.")
  cfg.train.steps = 50
  assert "(the last step's is 0.00049, 49.0% of it)" in warmup_warning(cfg.train)
  cfg.train.update(steps=10_000, warmup_steps=10_000)
  assert "(the last step's is 0.0009999, 99.99% of it)" in warmup_warning(cfg.train)
  assert float(make_schedule(cfg.train)(cfg.train.steps - 1)) == pytest.approx(0.0009999)
  cfg.train.update(steps=50, warmup_steps=49)
  assert warmup_warning(cfg.train) is None
  assert float(make_schedule(cfg.train)(cfg.train.steps - 1)) == pytest.approx(1e-3)  # reached at the last step


def test_a_run_warns_of_its_warmup_and_ends_with_one_speed_per_quantity(tmp_path):
  messages = []
  summary = train_and_evaluate(tiny_config(steps=2, train=dict(warmup_steps=5, log_every=1)), tmp_path,
                               log=messages.append)
  assert summary["prompt"] == "the "  # what next_steps suggests sampling with: the eval split's commonest word
  warnings = [m for m in messages if m.startswith("warning: train.warmup_steps=5 >= train.steps=2")]
  assert len(warnings) == 1, messages
  speeds = [m for m in messages if "tokens/s" in m or "ms/step" in m]
  assert len(speeds) == 1 and speeds[0].startswith("speed over 2 timed steps"), messages
  assert speeds[0].count("tokens/s") == speeds[0].count("ms/step") == speeds[0].count("MFU") == 1


def test_next_steps_name_the_files_and_the_commands_of_this_run():
  text = next_steps("configs/tiny.py", "workdirs/my run", ["--config.model.d_model=64"], prompt="def ",
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
  image = next_steps("configs/digits.py", "w", prompt=None)
  assert "--prompt" not in image and image.splitlines()[3].split()[0] == "hourglass-sample"


@pytest.mark.parametrize("text, prompt", [
    (b"The ship sailed at dawn; the crew, the sea and the wind slept.", "the "),  # English: 'the', not 'def '
    (b"def f(x):\n  return x\n\ndef g(x):\n  return f(x)\n", "def "), (b"x = 1 + 2\n", "x"),
    (b"\xc3\xa9t\xc3\xa9 \xc3\xa9t\xc3\xa9 hiver", "\u00e9t\u00e9 "), (b"  \n", None)])
def test_the_suggested_prompt_is_in_the_style_of_the_data(text, prompt):
  assert example_prompt(text) == prompt


def test_the_sample_and_eval_hints_leave_out_the_training_settings(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["hourglass-train", "--config=c.py", "--workdir=w", "--config.train.steps=300",
                                    "--config.model.d_model=64", "--config.data.seq_len=128", "--config.mesh.data=2"])
  assert main._overrides() == ["--config.model.d_model=64", "--config.data.seq_len=128", "--config.mesh.data=2"]


def test_tensorboard_draws_the_numbers_of_the_metrics_record_and_leaves_the_bookkeeping_out():
  train = dict(step=5, split="train", loss=2.0, bits_per_byte=2.9, tokens_seen=640, tokens_per_second=9.0, mfu=0.1,
               grad_norm=0.5, **{"body/shorten/boundary_rate": 0.3})
  assert scalars_of(train, "train") == {"train/loss": 2.0, "train/bits_per_byte": 2.9, "perf/tokens_per_second": 9.0,
                                        "perf/mfu": 0.1, "train/grad_norm": 0.5,
                                        "train/body/shorten/boundary_rate": 0.3}
  valid = dict(step=5, split="valid", loss=2.1, tokens_seen=640, whole_split=False, batches=2, total_batches=9)
  assert scalars_of(valid, "eval_partial") == {"eval_partial/loss": 2.1}


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
  log = io.StringIO()  # a bar a terminal erases at its end (leave=False) ends on its last frame in a log
  bar = progress.progress_bar(log, total=3, desc="eval", leave=False, bar_format="{desc}: {n_fmt}/{total_fmt}")
  bar.update(3)
  bar.close()
  assert log.getvalue().splitlines() == ["eval: 0/3", "eval: 3/3"]
  terminal = _Terminal()
  bar = progress.progress_bar(terminal, total=3, desc="train", mininterval=0, bar_format="{desc}: {n_fmt}/{total_fmt}")
  bar.update(3)
  bar.close()
  assert terminal.getvalue().count("\r") >= 2 and terminal.getvalue().count("\n") == 1
