"""hourglass-sample: a trained checkpoint restored read-only and sampled with the KV cache (text and images),
reproducible for a seed, with clear errors for bad input."""

import importlib.util
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from hourglass_jax.cli.sample import SampleOptions, check_options, load_draft, sample
from hourglass_jax.config import run_config
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model import ModelConfig
from hourglass_jax.train.checkpointing import model_source
from hourglass_jax.train.checkpointing.checkpoint import check_same_function
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.loop.loop import train_and_evaluate
from hourglass_jax.train.reporting.export import export_params
from tests.helpers import command_env, quiet, tiny_config, tiny_run, train_command

# The shared one-layer config (tiny_config = helpers.FLAGS), so the command line and in-process calls agree.
TEXT = dict(prompt=b"def ", num_samples=3, max_new_tokens=24, temperature=0.8, top_k=40, seed=3)


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("text_run")
  train_and_evaluate(tiny_config(steps=2), workdir, log=quiet)
  return workdir


def sample_command(workdir, *flags):
  """`hourglass-sample` on the shared config; stdout as bytes (samples need not be valid UTF-8)."""
  return subprocess.run(train_command(workdir, *flags, entry="sample_entry"), capture_output=True, timeout=300,
                        env=command_env())


def test_sample_command_prints_the_samples_the_library_draws_for_the_seed(text_run):
  out = sample_command(text_run, "--prompt=def ", "--num_samples=3", "--max_new_tokens=24", "--temperature=0.8",
                       "--top_k=40", "--seed=3")
  assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
  assert b"step 2: 3 samples x 24 tokens" in out.stdout and b"tokens/s" in out.stdout
  printed = [chunk.split(b" ---\n", 1)[1][:-1] for chunk in out.stdout.split(b"--- sample ")[1:]]

  first = sample(tiny_run(), text_run, SampleOptions(**TEXT), log=quiet)
  assert first["step"] == 2 and first["tokens"].shape == (3, 24)
  assert printed == first["texts"]  # the same draws in another process
  assert all(text.startswith(b"def ") and len(text) == 4 + 24 for text in first["texts"])
  assert len(set(first["texts"])) == 3  # the rows are independent draws

  again = sample(tiny_run(), text_run, SampleOptions(**TEXT), log=quiet)
  np.testing.assert_array_equal(again["tokens"], first["tokens"])
  other = sample(tiny_run(), text_run, SampleOptions(**dict(TEXT, seed=4)), log=quiet)
  assert not np.array_equal(other["tokens"], first["tokens"])


def test_an_export_samples_as_its_checkpoint_with_no_config(text_run, tmp_path):
  """The export folder as --workdir: its card gives the model and the length, so the command needs no --config,
  and the draws are the checkpoint's; a training workdir without --config is refused in one line."""
  export = tmp_path / "export"
  export_params(text_run, export, log=quiet)
  expected = sample(run_config(tiny_config()), text_run, SampleOptions(**TEXT), log=quiet)
  from_export = sample(run_config(model_source.export_config(export)), str(export), SampleOptions(**TEXT), log=quiet)
  np.testing.assert_array_equal(from_export["tokens"], expected["tokens"])
  assert from_export["step"] == 2
  entry = [sys.executable, "-c", "from hourglass_jax.cli.main import sample_entry; sample_entry()"]
  out = subprocess.run([*entry, f"--workdir={export}", "--prompt=def ", "--num_samples=3", "--max_new_tokens=24",
                        "--temperature=0.8", "--top_k=40", "--seed=3"], capture_output=True, timeout=300,
                       env=command_env())
  assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
  assert [chunk.split(b" ---\n", 1)[1][:-1] for chunk in out.stdout.split(b"--- sample ")[1:]] == expected["texts"]
  refused = subprocess.run([*entry, f"--workdir={text_run}", "--prompt=def "], capture_output=True, text=True,
                           timeout=300, env=command_env())
  assert refused.returncode == 1 and refused.stderr.strip() == (
      "error: --config is required with a training workdir (the config file the run was trained with); an export "
      "folder (hourglass-export's) needs none."), refused.stderr


def test_end_byte_cuts_each_text_after_it(text_run):
  end = 32
  result = sample(tiny_run(), text_run, SampleOptions(**dict(TEXT, end_byte=end)), log=quiet)
  for text, row in zip(result["texts"], result["tokens"]):
    hits = np.flatnonzero(row == end)
    if hits.size:
      assert text == b"def " + bytes(row[:hits[0] + 1].tolist()) and np.all(row[hits[0]:] == end)
    else:
      assert len(text) == 4 + 24


@pytest.mark.parametrize("options, error, match", [
    (dict(prompt=b""), ValueError, r"the prompt is empty, but text models have no start \(BOS\) token"),
    (dict(prompt=b"x" * 60), ValueError, r"the prompt has 60 tokens but the cache holds max_len=48"),
    (dict(prompt=b"x" * 40, max_new_tokens=20), ValueError, r"lower --max_new_tokens to 9 or raise --max_len"),
    (dict(num_samples=0), ValueError, r"num_samples=0 must be >= 1"),
])
def test_bad_input_is_refused_before_anything_compiles(text_run, options, error, match):
  with pytest.raises(error, match=match):
    sample(tiny_run(), text_run, SampleOptions(**dict(dict(prompt=b"ab"), **options)), log=quiet)


def test_workdir_without_a_checkpoint_and_a_mismatched_config_are_refused(text_run, tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no checkpoint under .*train first with hourglass-train"):
    sample(tiny_run(), tmp_path, SampleOptions(prompt=b"ab"), log=quiet)
  with pytest.raises(TrainError, match=r"different model shape \(model.d_model: checkpoint 32, config 64\)"):
    sample(tiny_run(model=dict(d_model=64)), text_run, SampleOptions(prompt=b"ab"), log=quiet)
  # Settings that leave every shape alone but change the function are caught from the checkpoint's metadata.
  saved = dict(tiny_config(model=dict(kind="hourglass", hierarchy="1@1 1@2 1@1")).model)
  with pytest.raises(ValueError, match=r"model.hierarchy: checkpoint '1@1 1@2 1@1', config '1@1 1@3 1@1'"):
    check_same_function(saved, dict(saved, hierarchy="1@1 1@3 1@1"), "checkpoints step 2")
  vanilla = dict(tiny_config().model)
  check_same_function(vanilla, dict(vanilla, dropout=0.3, shorten="linear"), "checkpoints step 2")  # no effect


@pytest.mark.parametrize("options, match", [
    (dict(num_samples=-2), r"num_samples=-2 must be >= 1"),
    (dict(max_new_tokens=0), r"max_new_tokens=0 must be >= 1 \(leave it unset"),
    (dict(max_len=0), r"max_len=0 must be >= 1 \(leave it unset for data.seq_len\)"),
    (dict(temperature=-0.5), r"temperature=-0.5 must be a finite number >= 0 \(0 = greedy\)"),
    (dict(temperature=float("nan")), r"temperature=nan must be a finite number"),
    (dict(top_k=-1), r"top_k=-1 must be >= 0 \(0 = all tokens\)"),
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(end_byte=256), r"end_byte=256 is outside the vocabulary 0..255"),
])
def test_sampling_options_out_of_range_are_named(options, match):
  check_options(SampleOptions(), 256)  # the defaults are fine
  with pytest.raises(ValueError, match=match):
    check_options(SampleOptions(**options), 256)


@pytest.mark.parametrize("flag, message", [("--top_k=-1", "error: top_k=-1 must be >= 0"),
                                           ("--max_len=0", "error: max_len=0 must be >= 1")])
def test_sample_command_refuses_out_of_range_options_before_restoring(tmp_path, flag, message):
  out = sample_command(tmp_path, "--prompt=ab", flag)  # no checkpoint there: the options are checked first
  errors = [line for line in out.stderr.decode().splitlines() if line.startswith("error:")]
  assert out.returncode != 0 and b"Traceback" not in out.stderr and len(errors) == 1 and message in errors[0]


def test_sample_command_reports_bad_input_without_a_traceback(text_run):
  out = sample_command(text_run, "--prompt=")
  assert out.returncode != 0
  assert b"error: the prompt is empty" in out.stderr and b"Traceback" not in out.stderr


def test_speculative_sampling_gives_the_plain_samples_with_any_draft(text_run, tmp_path):
  """--draft=ngram and --draft=a workdir (here the run itself, whose proposals are always kept) give greedy decoding's
  tokens; the run reports its passes and tokens per pass; an export drafts as its workdir does. By default 2
  samples speculate too (the fallback on measured time), and the report says what it did."""
  greedy = dict(TEXT, temperature=0.0, num_samples=2)
  plain = sample(tiny_run(), text_run, SampleOptions(**greedy), log=quiet)
  lines = []
  for draft in ("ngram", str(text_run)):
    result = sample(tiny_run(), text_run, SampleOptions(**greedy, draft=draft, draft_tokens=3, fallback_below=0),
                    log=lines.append)
    np.testing.assert_array_equal(result["tokens"], plain["tokens"], err_msg=draft)
  # The run drafting for itself keeps all 3 proposals of every pass: 23 tokens after the prefill's in 6 passes.
  assert "6 passes of 3.83 tokens, 0 plain steps" in lines[-1], lines[-1]
  export_params(text_run, tmp_path / "export", log=quiet)
  exported = sample(tiny_run(), text_run, SampleOptions(**greedy, draft=str(tmp_path / "export"), fallback_below=0),
                    log=quiet)
  np.testing.assert_array_equal(exported["tokens"], plain["tokens"])
  default = sample(tiny_run(), text_run, SampleOptions(**greedy, draft="ngram"), log=lines.append)
  np.testing.assert_array_equal(default["tokens"], plain["tokens"])
  assert re.search(r"\(ngram, 4 proposals per pass\): [1-9][0-9,]* passes of [0-9.]+ tokens, [0-9,]+ plain steps.*"
                   r"a pass costs [0-9.]+ plain steps \((measured|estimated)\): [0-9.]+x plain decoding", lines[-1]), \
      lines[-1]


@pytest.mark.parametrize("options, match", [
    (dict(draft="nowhere"), r"--draft=nowhere is neither a draft name \(ngram, self\) nor an export folder"),
    (dict(draft="self"), r"draft='self' drafts with the model's draft heads, and this model has none"),
    (dict(draft="ngram", draft_tokens=0), r"draft_tokens=0 must be in 1..64"),
    (dict(draft="ngram", draft_tokens=10 ** 6), r"draft_tokens=1000000 must be in 1..64"),
    (dict(draft="ngram", fallback_below=9.0), r"fallback_below=9.0 must be in \[0, draft_tokens \+ 1 = 5\]"),
    (dict(fallback_below=1.0), r"fallback_below=1.0 applies to speculative decoding only; pass --draft"),
])
def test_bad_drafts_are_refused_before_anything_compiles(text_run, options, match):
  with pytest.raises(ValueError, match=match):
    sample(tiny_run(), text_run, SampleOptions(prompt=b"ab", **options), log=quiet)


def test_a_draft_workdir_without_checkpoints_or_of_another_vocabulary_is_refused(text_run, tmp_path):
  (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
  with pytest.raises(ValueError, match=r"--draft=.*empty: no checkpoint under"):
    sample(tiny_run(), text_run, SampleOptions(prompt=b"ab", draft=str(tmp_path / "empty")), log=quiet)
  with pytest.raises(ValueError, match=r"the draft model's vocab_size=256 differs from the target's 300"):
    load_draft(str(text_run), ModelConfig(**dict(tiny_config().model, vocab_size=300)))


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="the digits ship with scikit-learn")
def test_image_models_complete_images_from_scratch_and_from_real_top_rows(tmp_path):
  cfg = tiny_config(steps=2, data=dict(name="digits", seq_len=64, data_dir=str(tmp_path / "data")))
  train_and_evaluate(cfg, tmp_path / "run", log=quiet)
  scratch = sample(run_config(cfg), tmp_path / "run", SampleOptions(num_samples=3), log=quiet)
  assert scratch["images"].shape == (3, 8, 8, 1) and scratch["images"].dtype == np.uint8
  assert scratch["png"].endswith("samples/images_step2.png")
  assert np.asarray(Image.open(scratch["png"])).shape == (8 * (2 * 9 + 1), 8 * (2 * 9 + 1))  # 2x2 grid, scale 8

  rows = 3
  completed = sample(run_config(cfg), tmp_path / "run", SampleOptions(num_samples=2, prompt_rows=rows, split="test",
                                                          output=str(tmp_path / "grid.png")), log=quiet)
  assert completed["tokens"].shape == (2, 64 - rows * 8)
  from hourglass_jax.data.batches import sources
  test_images = sources.make_source(DataSettings.of(cfg.data), "test", 256, 0)
  for i, image in enumerate(completed["images"]):
    np.testing.assert_array_equal(image[:rows], test_images.image(i)[:rows])
  assert np.asarray(Image.open(tmp_path / "grid.png")).shape == (8 * (2 * 9 + 1), 8 * (2 * 9 + 1))  # + originals
  with pytest.raises(ValueError, match=r"completing the image after 3 given rows takes 40 tokens"):
    sample(run_config(cfg), tmp_path / "run", SampleOptions(prompt_rows=3, max_new_tokens=10), log=quiet)
