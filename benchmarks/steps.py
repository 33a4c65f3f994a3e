"""The project's real train step, compiled for one config on one device, as a callable to time.

`StepRunner(cfg)` builds `Trainer(run_config(cfg), mesh)`, compiles the step ahead of time, reads XLA's cost and memory
analyses, creates the state and one synthetic batch; `runner()` then runs one step and waits for it.
"""

import time

import jax
import numpy as np

from hourglass_jax.config import run_config
from hourglass_jax.model import ModelConfig, counting
from hourglass_jax.runtime import sharding
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.reporting import metrics


def model_flops(cfg) -> float:
  """Analytic training FLOPs per step: 3 x forward matmul FLOPs x batch (hourglass_jax.model.counting)."""
  return 3.0 * counting.forward_flops(ModelConfig.from_dict(cfg.model), cfg.data.seq_len) * cfg.data.batch_size


def compile_step(cfg):
  """(trainer, compiled step, facts) without creating any state: FLOPs and memory come from the compiler."""
  mesh = sharding.make_mesh(cfg.mesh, jax.devices()[:1])
  trainer = Trainer(run_config(cfg), mesh)
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    compiled = trainer.compile_train_step()
  stats = compiled.memory_analysis()
  facts = dict(params=trainer.num_params, compile_s=round(time.perf_counter() - start, 1),
               model_flops=model_flops(cfg), xla_flops=metrics.cost_flops(compiled),
               memory_bytes=metrics.memory_bytes(compiled),
               temp_bytes=stats.temp_size_in_bytes if stats else None)
  return trainer, compiled, facts


class StepRunner:
  """One compiled train step with its live state; calling it runs one step on the same batch and blocks."""

  def __init__(self, cfg, compiled=None):
    """`compiled`: compile_step(cfg)'s result, when the caller already has it."""
    self.cfg = cfg
    self.trainer, self.compiled, self.facts = compiled or compile_step(cfg)
    with jax.set_mesh(self.trainer.mesh):
      self.state = self.trainer.init_state()
      source = self.trainer.train_source
      rows = np.stack([source[i] for i in range(cfg.data.batch_size)])
      self.tokens = self.trainer.global_array(rows)
    self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len

  def __call__(self):
    with jax.set_mesh(self.trainer.mesh):
      self.state, out = self.compiled(self.state, self.tokens)
    jax.block_until_ready(out)  # metrics depend on the whole step, so the step has finished
    return out

  def close(self):
    self.state = self.compiled = self.tokens = None
