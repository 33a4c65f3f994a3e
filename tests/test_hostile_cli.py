"""Hostile command lines (issue 45): hourglass-boundaries ends every bad input in one line, and hourglass-sample
refuses options its kind of data would ignore, a prompt that is not UTF-8 and an --output it cannot write, before
restoring or compiling anything, and (issue 55) a seed or a number of samples that would overflow, and a prompt
file longer than the context. Issue 64: hourglass-plot names a damaged metrics.jsonl and an --output it cannot
write, and hourglass-train refuses train.eps=0 before compiling. The commands run in-process (main() with
sys.argv patched) but the last."""

import sys
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from absl import flags

from hourglass_jax.cli import boundaries
from hourglass_jax.cli.sample import SampleOptions, check_kind_options, prompt_bytes
from hourglass_jax.model import build_model
from hourglass_jax.model.decode import unbox_params
from hourglass_jax.weights import save_params
from tests.helpers import run_plot, small_config, tiny_run


def _boundaries(*args) -> str:
  """hourglass-boundaries in this process; returns what it exits with (the error line)."""
  flags.FLAGS.unparse_flags()
  with mock.patch.object(sys, "argv", ["hourglass-boundaries", *args]), pytest.raises(SystemExit) as exit_:
    boundaries.main()
  flags.FLAGS.unparse_flags()
  return exit_.value.code


@pytest.fixture(scope="module")
def fixed_export(tmp_path_factory):
  cfg = small_config(vocab_size=256)
  params = unbox_params(build_model(cfg).init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32)))
  folder = tmp_path_factory.mktemp("fixed")
  save_params(params, cfg, folder)
  return folder


@pytest.mark.parametrize("case", ["fixed model", "missing folder", "training workdir", "empty text", "not utf-8"])
def test_boundaries_cli_ends_bad_input_in_one_line(fixed_export, tmp_path, case):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  weights, text, expected = {
      "fixed model": (fixed_export, "hello", "shorten='attention_avg'; boundaries come from a model trained with"),
      "missing folder": (tmp_path / "missing", "hello", "does not exist: pass the folder hourglass-export wrote"),
      "training workdir": (workdir, "hello", f"no readable checkpoint under {workdir}/checkpoints"),  # read as one
      "empty text": (fixed_export, "", "--text is empty"),
      "not utf-8": (fixed_export, "caf\udce9", "--text holds bytes that are not UTF-8"),
  }[case]
  message = _boundaries(f"--weights={weights}", f"--text={text}")
  assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message, message
  assert expected in message


def test_sample_refuses_a_prompt_that_is_not_utf8():
  assert prompt_bytes("héllo") == "héllo".encode()
  with pytest.raises(ValueError, match="--prompt holds bytes that are not UTF-8.*--prompt_file"):
    prompt_bytes("caf\udce9")


@pytest.mark.parametrize("options, images, message", [
    (SampleOptions(prompt=b"hello"), True, "--prompt / --prompt_file are for text configs.*--prompt_rows"),
    (SampleOptions(prompt_rows=2), False, "--prompt_rows is for image configs"),
    (SampleOptions(output="grid.png"), False, "--output writes image grids"),
])
def test_sample_refuses_options_its_data_would_ignore(options, images, message):
  with pytest.raises(ValueError, match=message):
    check_kind_options(options, images, "digits" if images else "stdlib_text")


def test_sample_refuses_an_output_it_cannot_write_before_sampling(tmp_path):
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(ValueError, match="cannot be written .*a_file is a file"):
    check_kind_options(SampleOptions(output=str(tmp_path / "a_file" / "grid.png")), True, "digits")
  with pytest.raises(ValueError, match="is a folder"):
    check_kind_options(SampleOptions(output=str(tmp_path)), True, "digits")
  check_kind_options(SampleOptions(output=str(tmp_path / "new" / "grid.png")), True, "digits")


@pytest.mark.parametrize("options, message", [
    (SampleOptions(prompt=b"Hi", seed=10**20), r"seed=100000000000000000000 must be a 64-bit integer, in \[-2\*\*63, "
                                               r"2\*\*63\)"),
    (SampleOptions(prompt=b"Hi", num_samples=10**8), r"num_samples=100,000,000 needs about [0-9,.]+ GiB for its "
                                                     r"decoding caches alone .*lower --num_samples to at most "
                                                     r"[0-9,]+ \(and sample again for more\)"),
], ids=["seed", "num_samples"])
def test_sample_refuses_what_would_overflow_before_restoring(tmp_path, options, message):
  """Issue 55: --seed=1e20 (an OverflowError) and --num_samples=100000000 (out of memory after 13 s) end at once,
  naming the limit: the workdir is not even read."""
  from hourglass_jax.cli.sample import sample

  with pytest.raises(ValueError, match=message):
    sample(tiny_run(), tmp_path / "never_read", options)


def test_a_prompt_file_is_read_no_further_than_the_context(tmp_path):
  """Issue 55: --prompt_file=/dev/zero read until the kernel killed the process; now at most max_len + 1 bytes."""
  from hourglass_jax.cli import sample as sample_cli

  with pytest.raises(ValueError, match=r"--prompt_file=/dev/zero holds more than 48 bytes, more than a context of "
                                       r"max_len=48 tokens holds .*raise --max_len"):
    sample_cli.read_prompt_file("/dev/zero", 48)
  with pytest.raises(ValueError, match=r"holds more than 67,108,864 bytes, the most a prompt file may hold"):
    sample_cli.read_prompt_file("/dev/zero", 10**12)
  (tmp_path / "prompt").write_bytes(b"def f(x):\n")
  assert sample_cli.read_prompt_file(str(tmp_path / "prompt"), 48) == b"def f(x):\n"


def test_a_vocabulary_beyond_int32_token_ids_is_refused():
  with pytest.raises(ValueError, match=r"model.vocab_size=100,000,000,000 is more than int32 token ids can name"):
    small_config(vocab_size=10**11)


def test_plot_ends_a_damaged_log_and_an_output_it_cannot_write_in_one_line(tmp_path):
  """Issue 64: hourglass-plot with random bytes in metrics.jsonl said "'utf-8' codec can't decode" naming no file;
  --output=FILE/x.png with FILE a file said "[Errno 17] File exists". Each names the path and the fix; a link at
  the output's name is replaced, never written through."""
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "metrics.jsonl").write_bytes(b'{"step": 1, "split": "train", "loss": 1.0}\n\xff\xfe\n')
  assert run_plot(tmp_path / "bad", f"--output={tmp_path / 'c.png'}") == (
      f"error: {tmp_path}/bad/metrics.jsonl line 2 is not UTF-8 text (byte 1 of the line): the file is damaged; "
      "restore or delete that line (or move the file aside: a run then starts a new one), then rerun.")
  (tmp_path / "good").mkdir()
  (tmp_path / "good" / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0, "bits_per_byte": 1.4}\n')
  (tmp_path / "FILE").write_text("not a folder")
  assert run_plot(tmp_path / "good", f"--output={tmp_path / 'FILE' / 'x.png'}") == (
      f"error: {tmp_path}/FILE is a file, not a folder; move it aside or choose another path, then rerun.")
  assert run_plot(tmp_path / "good", f"--output={tmp_path / 'good'}") == (
      f"error: {tmp_path}/good is a folder, not a file; move it aside (or pass another path) and rerun.")
  assert (tmp_path / "FILE").read_text() == "not a folder"


def test_out_of_range_eps_ends_the_command_before_compiling(tmp_path):
  """Issue 64: --config.train.eps=0 was accepted and the run "diverged" 78 s later, blaming the learning rate."""
  from tests.helpers import run, train_command

  bad = run(train_command(tmp_path / "run", "--config.train.eps=0"), devices=1)
  errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
  assert bad.returncode == 1 and "Traceback" not in bad.stderr and "compile:" not in bad.stdout, bad.stderr[-3000:]
  assert errors == ["error: train.eps=0.0 must be > 0, and at least 1.2e-38 (float32's smallest normal number): Adam "
                    "divides by sqrt(v) + eps, and v is 0 for a parameter whose gradients have all been 0 so far, so "
                    "the update would be NaN. 1e-8 or 1e-9 is usual."]
  assert not (tmp_path / "run").exists()  # nothing left behind
