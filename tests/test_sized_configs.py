"""Configs sized by a rule: configs/draft.py (a draft under a tenth of its target's parameters, warned about when
larger or when it is the target itself) and configs/gpu_sized.py (docs/choosing.md's one parameter per 5 bytes of
training text, 4 passes). Analytic counts only: nothing compiles."""

import importlib.util
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model.counting import total_params
from hourglass_jax.model.decode import drafts
from hourglass_jax.model.decode.drafts.model import MAX_FRACTION, size_warning
from tests.helpers import CONFIGS, load_config


def _params(section) -> int:
  return total_params(ModelConfig.from_dict(section))


def _module(name: str):
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("target", ["configs/default.py", "configs/dynamic.py:whitespace", "configs/gpu.py", "enwik8"])
def test_a_draft_is_the_widest_vanilla_2_at_1_under_a_tenth_of_its_target(target):
  file, _, preset = target.partition(":")
  goal, draft = load_config(pathlib.Path(file).stem, *filter(None, [preset])), load_config("draft", target)
  assert (draft.model.kind, draft.model.hierarchy, draft.model.dropout) == ("vanilla", "2@1", 0.0)
  assert draft.model.vocab_size == goal.model.vocab_size and draft.model.dtype == goal.model.dtype
  assert dict(draft.data) == dict(goal.data) and dict(draft.train) == dict(goal.train)  # the target's data and recipe
  budget = MAX_FRACTION * _params(goal.model)
  assert _params(draft.model) <= budget
  module = _module("draft")
  wider = module.WIDTHS[module.WIDTHS.index(draft.model.d_model) + 1]
  assert _params(dict(draft.model, d_model=wider, num_heads=wider // module.HEAD_DIM, d_ff=4 * wider)) > budget
  assert size_warning(ModelConfig.from_dict(draft.model), ModelConfig.from_dict(goal.model)) is None


def test_configs_default_draft_is_the_measured_one():
  """For configs/default.py: d 64, 2 heads, d_ff 256, the draft benchmarks/speculative.py measures (8% of 1.65M)."""
  model = load_config("draft", "configs/default.py").model
  assert (model.d_model, model.num_heads, model.d_ff) == (64, 2, 256)


def _param_shapes(cfg):
  """The shapes of cfg's params (all a draft's check reads of them), computed without any arithmetic."""
  return jax.eval_shape(build_model(cfg).init, jax.random.key(0), jnp.zeros((1, cfg.pad_multiple), jnp.int32))


def test_a_large_draft_and_the_target_itself_are_warned_about_in_one_line():
  target = ModelConfig.from_dict(load_config("default").model)
  large = ModelConfig(kind="vanilla", hierarchy="2@1", d_model=128, num_heads=4, d_ff=512)
  assert size_warning(large, target) == (
      "the draft model has 462,592 parameters, 28% of the target's 1,652,992: each proposal costs about that share "
      "of a target step, more than speculation gains back above 10% (docs/generation.md); configs/draft.py sizes a "
      "draft for a target.")
  assert size_warning(target, target).startswith("the draft model is the target model itself")
  for draft_cfg in (large, target):  # what generate() and hourglass-sample check the draft with
    with pytest.warns(UserWarning, match="the draft model"):
      drafts.Model(draft_cfg).check(target, params=_param_shapes(draft_cfg))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    small = ModelConfig.from_dict(load_config("draft").model)
    drafts.Model(small).check(target, params=_param_shapes(small))


def _sized(argument: str):
  return load_config("gpu_sized", argument)


@pytest.mark.parametrize("size, width, steps", [("2MB", 128, 110), ("50MB", 256, 2746), ("100MB", 384, 5491)])
def test_a_gpu_model_is_sized_for_its_corpus(size, width, steps):
  """About one parameter per 5 bytes of the training split (90%), the nearest width in ratio, and 4 passes."""
  cfg = _sized(size)
  train_bytes = 0.9 * float(size[:-2]) * 1e6
  assert cfg.model.d_model == width and cfg.train.steps == steps
  step_bytes = cfg.data.batch_size * cfg.data.seq_len
  assert (cfg.train.steps - 1) * step_bytes < 4 * train_bytes <= cfg.train.steps * step_bytes  # 4 passes, rounded up
  ratio = _params(cfg.model) / (train_bytes / 5)
  neighbours = [_params(dict(cfg.model, d_model=d, num_heads=d // 64, d_ff=4 * d)) / (train_bytes / 5)
                for d in (width - 64, width + 64) if d >= 128]
  assert all(abs(np.log(ratio)) <= abs(np.log(other)) for other in neighbours)
  assert cfg.model.dtype == "bfloat16" and cfg.model.dropout == 0.0 and cfg.model.shorten == "avg"
  assert cfg.train.warmup_steps == steps // 20 and cfg.train.learning_rate == pytest.approx(3e-3 * min(1, 128 / width),
                                                                                            rel=0.05)


def test_a_gpu_model_sized_from_a_file_trains_on_it(tmp_path):
  text = tmp_path / "english.txt"
  text.write_bytes(b"The ship sailed at dawn. " * 80_000)  # 2 MB
  cfg = _sized(str(text))
  assert (cfg.data.name, cfg.data.path) == ("text_file", str(text)) and cfg.model.d_model == 128
  with pytest.raises(ValueError, match="'fifty' is neither a file nor a size such as 50MB"):
    _sized("fifty")
