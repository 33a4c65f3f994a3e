"""hourglass-plot: learning curves of several runs from their metrics.jsonl into one PNG, and one error line for a
workdir without metrics or a missing matplotlib; a full disk while writing metrics.jsonl is reported as one. A real
run's metrics.jsonl is checked and drawn in tests/test_train_resume.py."""

import builtins
import errno

import pytest

from hourglass_jax.train.checks import DiskFullError
from hourglass_jax.train.reporting import curves, run_files
from tests.helpers import run_plot


def _logged_run(workdir, rate: float) -> None:
  """A run's metrics.jsonl as the trainer writes it (MetricsLog): train lines every 10 steps, a partial
  evaluation at step 20 and a whole-split one at step 40."""
  workdir.mkdir()
  log = run_files.MetricsLog(workdir, 0, enabled=True)
  for step in range(10, 50, 10):
    log.write(dict(step=step, split="train", loss=5.0 - rate * step, bits_per_byte=(5.0 - rate * step) / 0.693,
                   tokens_seen=log.tokens_seen(step, 64), learning_rate=1e-3))
  for step, whole in ((20, False), (40, True)):
    log.write(dict(step=step, split="valid", bits_per_byte=7.0 - rate * step, tokens_seen=log.tokens_seen(step, 64),
                   whole_split=whole))
  log.close()


def test_two_runs_in_one_picture(tmp_path, capsys):
  _logged_run(tmp_path / "a", 0.05)
  _logged_run(tmp_path / "b", 0.02)
  output = tmp_path / "out" / "curves.png"
  assert run_plot(tmp_path / "a", tmp_path / "b", f"--output={output}", "--x=tokens") in (0, None)
  assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'out' / 'curves.png'}"
  png = (tmp_path / "out" / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_hourglass_evals_recorded_scores_join_the_trainers(tmp_path):
  """The evaluation panel draws the trainer's evaluations and hourglass-eval's whole-split scores (at the tokens
  seen by their step); a recorded score of a step the trainer already scored whole is drawn once."""
  _logged_run(tmp_path / "run", 0.05)
  for split, step in (("test", 40), ("valid", 20), ("valid", 40)):
    run_files.record_evaluation(tmp_path / "run", step, split, dict(bits=1.0 + step / 100, whole_split=True))
  points = curves.evaluation_points(tmp_path / "run", run_files.read_metrics(tmp_path / "run"), "bits_per_byte")
  assert sorted((p["step"], p["split"], p["whole_split"], p["tokens_seen"]) for p in points) == [
      (20, "valid", False, 20 * 64), (20, "valid", True, 20 * 64), (40, "test", True, 40 * 64),
      (40, "valid", True, 40 * 64)]
  assert {p["bits_per_byte"] for p in points if p["split"] == "test"} == {1.4}


def test_a_workdir_without_metrics_and_a_missing_matplotlib_end_in_one_line(tmp_path, monkeypatch):
  message = run_plot(tmp_path, f"--output={tmp_path / 'c.png'}")
  assert message == (f"error: {tmp_path} holds no metrics.jsonl (or an empty one): pass the --workdir of a "
                     "hourglass-train run that has logged at least one step.")
  _logged_run(tmp_path / "run", 0.05)
  real_import = builtins.__import__

  def no_matplotlib(name, *args, **kwargs):
    if name.startswith("matplotlib"):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_matplotlib)
  message = run_plot(tmp_path / "run", f"--output={tmp_path / 'c.png'}")
  assert message == ("error: hourglass-plot needs matplotlib, which is not installed: pip install "
                     "'hourglass-jax[plot]' (or pip install matplotlib).")
  assert not (tmp_path / "c.png").exists()
  with pytest.raises(ValueError, match="--x='bytes': choose one of step, tokens"):
    curves.plot_runs([tmp_path / "run"], tmp_path / "c.png", x="bytes")


def test_a_full_disk_while_logging_metrics_is_named_as_one(tmp_path):
  log = run_files.MetricsLog(tmp_path, 0, enabled=True)

  class Full:
    def write(self, _):
      raise OSError(errno.ENOSPC, "No space left on device")

  log._file = Full()  # pylint: disable=protected-access
  with pytest.raises(DiskFullError, match=f"disk full: writing {tmp_path}/metrics.jsonl failed .*rerun the same "
                                          "command to resume from the newest checkpoint"):
    log.write(dict(step=1, split="train", loss=1.0))
