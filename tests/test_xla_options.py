"""Per-program XLA options: bfloat16 eval and sampling programs on CPU send their dots to YNNPACK; the train step
and float32 programs keep XLA's defaults."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hourglass_jax.config import run_config
from hourglass_jax.runtime import sharding, xla_options
from hourglass_jax.train.compiled.trainer import Trainer
from tests.helpers import tiny_config

DOT_OPTION = {xla_options.YNN_FUSION_TYPE: xla_options.LIBRARY_FUSION_TYPE_DOT}


def test_only_bfloat16_on_cpu_gets_ynnpack_dots(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  assert xla_options.compiler_options("bfloat16", "cpu") == DOT_OPTION
  assert xla_options.compiler_options(jnp.bfloat16, "cpu") == DOT_OPTION
  assert xla_options.compiler_options("float32", "cpu") == {}
  assert xla_options.compiler_options("bfloat16", "gpu") == {}
  assert xla_options.compiler_options("bfloat16", "tpu") == {}


def test_the_users_xla_flags_win(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", f"--{xla_options.YNN_FUSION_TYPE}=")
  assert xla_options.compiler_options("bfloat16", "cpu") == {}


def _compiled_train_step(dtype: str) -> tuple[dict, str]:
  cfg = tiny_config(steps=2, model=dict(dtype=dtype))
  mesh = sharding.make_mesh(cfg.mesh, devices=jax.devices()[:1])
  with jax.set_mesh(mesh):
    trainer = Trainer(run_config(cfg), mesh)
    return trainer.compiler_options, trainer.compile_train_step().as_text()


def test_the_bfloat16_train_step_keeps_xla_defaults_and_its_matmuls_in_bfloat16(monkeypatch):
  """Since dense kernel gradients are taken as (x^T) dy, XLA's default runs the train step's bfloat16 dots natively
  in YNNPACK; the option would up-cast every one of them to float32 (and made the enwik8 step 1.27x slower)."""
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  options, train_step = _compiled_train_step("bfloat16")
  assert options == DOT_OPTION  # still the eval step's and the sampler's
  assert _compiled_train_step("float32")[0] == {}
  assert len(re.findall(r"= bf16\[[\d,]*\]\{[\d,]*\} dot\(", train_step)) > 0


def test_the_option_gives_the_same_numbers_within_bfloat16_rounding():
  a = jnp.asarray(np.random.default_rng(0).normal(size=(4, 64, 64)), jnp.bfloat16)
  batched = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x, preferred_element_type=jnp.float32))
  default = batched.lower(a).compile()(a)
  ynn = batched.lower(a).compile(compiler_options=DOT_OPTION)(a)
  np.testing.assert_allclose(ynn, default, rtol=2e-2, atol=2e-2)
  assert ynn.dtype == jnp.float32


def test_a_jaxlib_without_the_option_warns_and_compiles_with_the_default(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.setattr(xla_options, "YNN_FUSION_TYPE", "xla_cpu_no_such_option")
  xla_options._cpu_takes_ynn_fusion.cache_clear()
  try:
    with pytest.warns(UserWarning, match="does not take xla_cpu_no_such_option"):
      assert xla_options.compiler_options("bfloat16", "cpu") == {}
  finally:
    xla_options._cpu_takes_ynn_fusion.cache_clear()
