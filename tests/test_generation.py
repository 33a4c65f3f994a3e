"""One generation path: the trainer's end-of-run sample is model/decode/sampling.py's cached `generate` on the training mesh
(generation.py, hourglass-sample's path: both draw the same bytes), with no full forward pass per token, on one
process or two, and may run past data.seq_len; `generate` sizes its cache to fit retina windows."""

import jax
import numpy as np
import pytest

from hourglass_jax import generation
from hourglass_jax.cli.sample import SampleOptions, sample
from hourglass_jax.config import run_config
from hourglass_jax.model import HourglassLM, ModelConfig, build_model
from hourglass_jax.model import decode
from hourglass_jax.model.decode import sampling
from hourglass_jax.runtime import sharding
from hourglass_jax.testing import random_variables
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.loop import SAMPLE_TEMPERATURE, end_of_run_sample, train_and_evaluate
from tests.helpers import quiet, run_two_processes, tiny_config

SAMPLE_BYTES = 60  # data.seq_len is 48 and the prompt 12 bytes: one window held at most 36 sampled bytes


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
  """(cfg, workdir, summary, log lines, trainer, the final params as saved) of a 2-step run that samples at its
  end."""
  cfg = tiny_config(steps=2, train=dict(sample_bytes=SAMPLE_BYTES))
  workdir, lines = tmp_path_factory.mktemp("sampled_run"), []
  summary = train_and_evaluate(cfg, workdir, log=lines.append)
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh), Checkpoints(workdir / "checkpoints", read_only=True, log=lines.append) as saved:
    state, _, step = saved.restore_latest(trainer.abstract, config_record(run_config(cfg)))
  assert step == 2
  return cfg, workdir, summary, lines, trainer, state.params


def test_end_of_run_sample_is_the_cached_generation_of_its_prompt(sampled_run):
  cfg, workdir, summary, lines, trainer, params = sampled_run
  prompt = bytes(trainer.eval_source(cfg.data.eval_split)[0][:12].astype(np.uint8))
  assert summary["sample_prompt"] == prompt
  assert len(summary["sample"]) == SAMPLE_BYTES > cfg.data.seq_len - len(prompt)  # past one training window
  assert any(line.startswith(f"sample (12 prompt bytes from the {cfg.data.eval_split} split, then {SAMPLE_BYTES} "
                             "sampled bytes):") for line in lines)

  # `generate` itself, unsharded on one device, on the same rows the trainer feeds (its prompt on every
  # data-parallel device), seed and temperature: the trainer's sample is its first row.
  rows = sharding.batch_parallelism(trainer.mesh, trainer.rules)
  expected = sampling.generate(jax.device_get(params), ModelConfig.from_dict(cfg.model),
                               np.tile(np.frombuffer(prompt, np.uint8).astype(np.int32), (rows, 1)),
                               max_new_tokens=SAMPLE_BYTES, rng=cfg.train.seed, temperature=SAMPLE_TEMPERATURE)
  np.testing.assert_array_equal(np.frombuffer(summary["sample"], np.uint8), np.asarray(expected)[0])

  # hourglass-sample on the final checkpoint, with the trainer's prompt, seed and temperature: the same bytes.
  options = SampleOptions(prompt=prompt, num_samples=1, max_new_tokens=SAMPLE_BYTES, seed=cfg.train.seed,
                          temperature=SAMPLE_TEMPERATURE, max_len=len(prompt) + SAMPLE_BYTES)
  assert sample(run_config(cfg), workdir, options, log=quiet)["texts"] == [prompt + summary["sample"]]


def test_end_of_run_sample_runs_generate_and_no_full_forward(sampled_run, monkeypatch):
  cfg, _, summary, _, trainer, params = sampled_run
  calls = []

  def spy(*args, **kwargs):
    calls.append(kwargs["max_new_tokens"])
    return real(*args, **kwargs)

  def no_full_forward(*_, **__):
    raise AssertionError("the end-of-run sample ran the full forward pass")

  real = sampling.generate
  monkeypatch.setattr(sampling, "generate", spy)
  monkeypatch.setattr(HourglassLM, "__call__", no_full_forward)
  assert end_of_run_sample(trainer, params) == (summary["sample_prompt"], summary["sample"])
  assert calls == [SAMPLE_BYTES]  # one cached generation of every byte, traced once


_TWO_PROCESSES = """
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.loop import end_of_run_sample
from tests.helpers import tiny_config
cfg = tiny_config(train=dict(sample_bytes=int(sys.argv[3])))
trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
with jax.set_mesh(trainer.mesh):
  prompt, sample = end_of_run_sample(trainer, trainer.init_state().params)
print(json.dumps({"prompt": prompt.hex(), "sample": sample.hex()}))
"""


@pytest.mark.multiprocess
def test_two_processes_draw_the_same_end_of_run_sample_as_generate():
  """Each process feeds its own rows of the prompt batch (2 CPU devices each) and gets the whole sample back."""
  num_bytes = 16
  reports = run_two_processes(_TWO_PROCESSES, str(num_bytes))
  assert reports[0] == reports[1]

  cfg = tiny_config()
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh))
  with jax.set_mesh(trainer.mesh):
    params = jax.device_get(trainer.init_state().params)  # the same draws from train.seed on any mesh
  prompt = bytes.fromhex(reports[0]["prompt"])
  expected = sampling.generate(params, ModelConfig.from_dict(cfg.model),
                               np.tile(np.frombuffer(prompt, np.uint8).astype(np.int32), (4, 1)),
                               max_new_tokens=num_bytes, rng=cfg.train.seed, temperature=SAMPLE_TEMPERATURE)
  assert bytes.fromhex(reports[0]["sample"]) == bytes(np.asarray(expected)[0].astype(np.uint8))


def test_generation_on_a_mesh_pads_rows_and_cuts_texts():
  cfg = ModelConfig(vocab_size=256, d_model=32, num_heads=4, d_ff=64, kind="vanilla", hierarchy="1@1")
  params = random_variables(build_model(cfg), np.zeros((1, 8), np.int32))["params"]
  mesh = sharding.make_mesh(tiny_config().mesh)
  rules = sharding.logical_rules(tiny_config().mesh)
  shardings = jax.tree.map(lambda _: sharding.replicated(mesh), params)
  prompts = generation.byte_prompts(b"ab", 3, 256)  # 3 rows, padded to the 8 data-parallel devices
  out = generation.generate_on_mesh(params, shardings, cfg, prompts, mesh, rules, max_new_tokens=5, seed=1,
                                    temperature=0.0)
  greedy = sampling.generate(params, cfg, prompts, max_new_tokens=5, rng=1, temperature=0.0)
  np.testing.assert_array_equal(out.tokens, np.asarray(greedy))
  assert out.tokens.shape == (3, 5) and out.seconds > 0 and out.compile_seconds > 0

  row = np.asarray([[104, 10, 105, 300]])
  assert generation.texts(b"> ", row) == [b"> h\ni"]  # ids >= 256 dropped
  assert generation.texts(b"> ", row, end_byte=10) == [b"> h\n"]
  with pytest.raises(ValueError, match=r"the prompt is empty"):
    generation.byte_prompts(b"", 1, 256)
  with pytest.raises(ValueError, match=r"vocab_size=50 cannot hold byte prompts"):
    generation.byte_prompts(b"a", 1, 50)


def test_generate_sizes_its_cache_to_fit_retina_windows():
  """A sample shorter than the start of the widest window (64) used to be refused by init_cache; generate's cache
  now reaches into it, and greedy decoding still follows the full forward pass."""
  cfg = ModelConfig(vocab_size=50, d_model=32, num_heads=4, d_ff=64, kind="retina", hierarchy="1@1",
                    scales="16,4,1", heads_per_scale="1,1,2", retina_windows="0:8,8:64,64:128")
  assert decode.max_len_for(cfg, 6) == 65 and decode.max_len_for(cfg, 100) == 100
  assert decode.max_len_for(ModelConfig(vocab_size=50, d_model=32, num_heads=4, d_ff=64), 6) == 6
  model = build_model(cfg)
  params = random_variables(model, np.zeros((1, 128), np.int32))["params"]
  prompt = np.asarray([[3, 1, 4], [1, 5, 9]], np.int32)
  new = np.asarray(sampling.generate(params, cfg, prompt, max_new_tokens=4, rng=0, temperature=0.0))
  tokens = np.zeros((2, 128), np.int32)
  tokens[:, :7] = np.concatenate([prompt, new], axis=1)
  logits = model.apply({"params": params}, tokens)
  np.testing.assert_array_equal(np.argmax(logits[:, 2:6], axis=-1), new)
