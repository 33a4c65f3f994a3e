"""A run config's compiled pieces on a mesh: `Evaluator` (model, parameter layout, batch sharding, eval splits, the
jitted eval step: no optimizer, no train step, no train split) and `Trainer` (adds the train split, optimizer, state
layout and the jitted train step), each made from a RunConfig (hourglass_jax/config/run.py); `compile_ahead`
compiles a Trainer's step for a mesh that may have no devices (launch/aot_compile_tpu.py, benchmarks/gpu_offline.py)."""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.config.run import RunConfig
from hourglass_jax.data.batches import pipeline, sources
from hourglass_jax.model import build_model
from hourglass_jax.runtime import sharding, xla_options
from hourglass_jax.train import checks
from hourglass_jax.train.compiled.optimizer import make_optimizer
from hourglass_jax.train.compiled.state import create_state, make_init_fn, state_layout
from hourglass_jax.train.compiled.step import make_train_step, token_losses_and_sown


class Evaluator:
  """Checks the run config `run` against `mesh` (before anything compiles) and holds what evaluating its params
  needs."""

  def __init__(self, run: RunConfig, mesh: jax.sharding.Mesh):
    if not isinstance(run, RunConfig):
      raise TypeError(f"{type(self).__name__} takes a RunConfig, not a {type(run).__name__}: make one with "
                      "hourglass_jax.config.run_config(cfg).")
    self.run, self.mesh = run, mesh
    self.model = build_model(run.model)
    self.rules = run.mesh.rules
    self.batch_sharding = sharding.batch_sharding(mesh, self.rules)
    checks.check_batch_split(run.data, run.train, sharding.batch_parallelism(mesh, self.rules), jax.process_count())
    self.batch_size, self.seq_len = run.data.batch_size, run.data.seq_len
    self.rows = sharding.process_rows(self.batch_sharding, self.batch_size, (self.seq_len + 1,))
    self.compiler_options = xla_options.compiler_options(run.model.dtype, mesh.devices.flat[0].platform)
    self._layout()

  def _layout(self):
    """The params' abstract tree and shardings (`abstract`, `shardings`, `param_shardings`)."""
    self.init_fn = make_init_fn(self.model, None, self.seq_len, self.run.train.seed)
    self.abstract, self.shardings = state_layout(self.init_fn, self.mesh, self.rules)
    self.param_shardings = self.shardings

  def global_array(self, local: np.ndarray) -> jax.Array:
    """This process's rows -> one global array sharded over the batch axes."""
    shape = (self.batch_size, *local.shape[1:])
    return jax.make_array_from_process_local_data(self.batch_sharding, local, shape)

  def eval_source(self, split: str):
    run = self.run
    return sources.make_source(run.data, split, run.model.vocab_size, run.train.seed, eval_windows=True)

  @functools.cached_property
  def eval_step(self):
    """`eval_step(params, tokens_BxL1, weights_BxL) -> ({loss_sum, tokens, rows}, sown metrics)`: only predictions
    with weight 1 count, so overlapping eval windows (sliding, long_context) score each byte once; `rows` counts the
    windows that score any. The sown metrics (a dynamic level's boundary_rate...) are the batch's, as in training."""

    def step(params, tokens_BxL1, weights_BxL):
      losses_BxL, _, sown = token_losses_and_sown(self.model, params, tokens_BxL1, self.rules)
      return dict(loss_sum=(losses_BxL * weights_BxL).sum(), tokens=weights_BxL.sum(),
                  rows=(weights_BxL.sum(axis=1) > 0).sum()), sown

    return jax.jit(step, in_shardings=(self.param_shardings, self.batch_sharding, self.batch_sharding),
                   out_shardings=sharding.replicated(self.mesh), compiler_options=self.compiler_options)


class Trainer(Evaluator):
  """An Evaluator that also holds the train split, optimizer and jitted train step; `abstract` and `shardings` are
  the whole train state's."""

  def _layout(self):
    run = self.run
    self.train_source = sources.make_source(run.data, "train", run.model.vocab_size, run.train.seed)
    checks.check_train_windows(run.data, len(self.train_source))
    self.eval_source(run.data.eval_split)  # every run evaluates at its end: a split too short fails now, not then
    self.optimizer, self.schedule = make_optimizer(run.train)
    self.init_fn = make_init_fn(self.model, self.optimizer, self.seq_len, run.train.seed)
    self.abstract, self.shardings = state_layout(self.init_fn, self.mesh, self.rules)
    self.param_shardings = self.shardings.params
    self.num_params = sum(leaf.size for leaf in jax.tree.leaves(self.abstract.params))
    step = make_train_step(self.model, self.optimizer, self.schedule, self.rules, run.train.grad_accum_steps)
    # The train step keeps XLA's defaults: with dense kernel gradients taken as (x^T) dy its bfloat16 dots run
    # natively in YNNPACK, 1.27x faster than under the option (benchmarks/throughput.py --dtypes float32,bfloat16).
    self.train_step = jax.jit(step, in_shardings=(self.shardings, self.batch_sharding),
                              out_shardings=(self.shardings, sharding.replicated(self.mesh)), donate_argnums=0)

  def init_state(self):
    return create_state(self.init_fn, self.shardings)

  def compile_train_step(self):
    """Ahead-of-time compilation of the train step for this config's batch shape."""
    tokens = jax.ShapeDtypeStruct((self.batch_size, self.seq_len + 1), jnp.int32, sharding=self.batch_sharding)
    return self.train_step.lower(self.abstract, tokens).compile()

  def train_iterator(self):
    return pipeline.train_iterator(self.train_source, self.run.train.seed, self.batch_size, self.rows)


def compile_ahead(run: RunConfig, mesh: jax.sharding.Mesh, backend: str | None = None):
  """(Trainer, its train step compiled ahead of time, seconds) on `mesh`, which may be a deviceless topology's;
  `backend` is what jax.default_backend() reads meanwhile, so attention='auto' resolves as on that accelerator."""
  real = jax.default_backend
  if backend:
    jax.default_backend = lambda: backend
  try:
    trainer = Trainer(run, mesh)
    start = time.perf_counter()
    with jax.set_mesh(mesh):
      compiled = trainer.compile_train_step()
    return trainer, compiled, time.perf_counter() - start
  finally:
    jax.default_backend = real
