"""hourglass-boundaries: the marked text follows the model's own boundary decisions, from exported weights or a
training run's newest checkpoint."""

import logging
import subprocess
import sys

import jax
import numpy as np
import pytest

from hourglass_jax.cli.boundaries import marked, show
from hourglass_jax.config import run_config
from hourglass_jax.model import ModelConfig, build_model, decode
from hourglass_jax.model.hourglass import WHITESPACE_BYTES
from hourglass_jax.runtime import sharding
from hourglass_jax.testing import random_variables
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.weights import save_params
from tests.helpers import SMALL, centered_gumbel_levels, quiet, tiny_config

DYNAMIC = dict(SMALL, vocab_size=256, kind="hourglass", hierarchy="1@1 2@3 1@1", shorten="dynamic",
               upsample="repeat")
TEXT = b"First Citizen: Before we proceed any further, hear me speak."


def exported(tmp_path, **fields):
  cfg = ModelConfig(**dict(DYNAMIC, **fields))
  params = decode.unbox_params(random_variables(build_model(cfg), np.zeros((1, 8), np.int32)))
  save_params(params, cfg, tmp_path)
  return tmp_path


def test_marks_follow_the_whitespace_predictor(tmp_path):
  text, cuts = show(None, TEXT, workdir=exported(tmp_path, boundaries="whitespace"))  # an export, as --workdir
  np.testing.assert_array_equal(cuts, [byte in WHITESPACE_BYTES for byte in TEXT])
  assert text.splitlines()[0].startswith("First |Citizen:| |Before |we ")
  assert f"{int(cuts.sum())} boundaries in {len(TEXT)} bytes" in text and "'whitespace'" in text


def test_a_training_workdir_is_read_directly_and_quietly(tmp_path, caplog):
  """--workdir reads the newest checkpoint (its params and recorded model), no export needed, without Orbax's
  warnings that the reader opened it read-only; either flag takes either kind of folder."""
  cfg = tiny_config(model=dict(DYNAMIC, boundaries="whitespace", dropout=0.0))
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh), Checkpoints(tmp_path / "checkpoints", log=quiet) as checkpoints:
    checkpoints.save(3, trainer.init_state(), {"next_index": 0}, config_record(run_config(cfg)), force=True)
  caplog.set_level(logging.WARNING)
  text, cuts = show(None, TEXT, workdir=tmp_path)
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
  np.testing.assert_array_equal(cuts, [byte in WHITESPACE_BYTES for byte in TEXT])
  assert text.splitlines()[0].startswith("First |Citizen:| |Before |we ")
  assert show(tmp_path, TEXT)[0] == text  # --weights=WORKDIR reads it too
  with pytest.raises(ValueError, match="pass --workdir=TRAINING_RUN_OR_EXPORT"):
    show(None, TEXT)


def test_marked_text_shows_every_byte_once():
  cuts = np.array([False, True, False, True])
  assert marked(b"a\nbc", cuts) == "a⏎|bc|"


def test_a_fixed_model_is_refused(tmp_path):
  with pytest.raises(ValueError, match="shorten='dynamic'"):
    show(exported(tmp_path, shorten="avg"), TEXT)


def test_gumbel_marks_follow_the_chosen_evaluation(tmp_path):
  """An unsure predictor (every probability 1/4): the threshold never cuts, training's draw cuts about a quarter."""
  cfg = ModelConfig(**dict(DYNAMIC, boundaries="gumbel"))
  params = decode.unbox_params(random_variables(build_model(cfg), np.zeros((1, 8), np.int32)))
  logit = params["body"]["shorten"]["predictor"]["logit"]
  logit["kernel"], logit["bias"] = np.zeros_like(logit["kernel"]), np.full_like(logit["bias"], np.log(1 / 3))
  save_params(params, cfg, tmp_path)
  text = TEXT * 4
  assert not show(tmp_path, text)[1].any()
  summary, cuts = show(tmp_path, text, gumbel_evaluation="sample")
  assert 0.15 < cuts.mean() < 0.35 and "evaluation 'sample'" in summary


@pytest.mark.slow
def test_the_command_prints_the_marked_text_of_an_export(tmp_path):
  weights = exported(tmp_path, boundaries="gumbel")
  done = subprocess.run([sys.executable, "-m", "hourglass_jax.cli.boundaries", f"--workdir={weights}",
                         f"--text={TEXT.decode()}", "--gumbel_evaluation=sample"], capture_output=True, text=True,
                        check=True)
  out = done.stdout
  assert out.splitlines()[0].replace("|", "") == TEXT.decode() and "'gumbel', evaluation 'sample'" in out
  assert "INFO" not in done.stderr and not [line for line in done.stderr.splitlines() if line[:1] == "I"], done.stderr


def test_a_nested_level_marks_the_bytes_that_close_its_segments(tmp_path):
  """Words at the first level ('whitespace'); the second level cuts after some words: '||' on the bytes that closed
  them, and its summary counts the words."""
  cfg = ModelConfig(**dict(DYNAMIC, hierarchy="1@1 1@2 1@4 1@2 1@1", boundaries="whitespace,gumbel"))
  model, tokens = build_model(cfg), np.frombuffer(TEXT, np.uint8).astype(np.int32)[None]
  save_params(decode.unbox_params(centered_gumbel_levels(model, random_variables(model, tokens), tokens)), cfg,
              tmp_path)
  text, cuts = show(tmp_path, TEXT)
  marks, first, second = text.splitlines()
  assert marks.replace("|", "") == TEXT.decode() and marks.replace("||", "|").split("|")[:3] == ["First ",
                                                                                                 "Citizen:", " "]
  assert first.startswith(f"level 1 (|): {int(cuts.sum())} boundaries in {len(TEXT)} bytes")
  words, closed = int(cuts[:-1].sum()) + 1, marks.count("||")
  assert 0 < closed < words and second.startswith(f"level 2 (||): {closed} boundaries in {words} level-1 segments")
