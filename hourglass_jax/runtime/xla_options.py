"""XLA options chosen per compiled program from the model's dtype, which XLA_FLAGS (one setting for the whole
process) cannot express. Today one: on CPU, bfloat16 eval and sampling programs send their dots to YNNPACK's fused
kernels. XLA:CPU's default runs batched bfloat16 dots as float32 Eigen dots on converted copies; the same option
slows float32 programs, so they keep XLA's default (benchmarks/throughput.py --dtypes float32,bfloat16). The
train step keeps XLA's default too: with dense kernel gradients taken as (x^T) dy (ops/weight_gradient.py), its
bfloat16 dots run natively in YNNPACK, and the option, which up-casts them, made it 1.27x (enwik8) and 1.37x (the
peer's shape) slower."""

import functools
import os
import warnings

import jax
import jax.numpy as jnp

YNN_FUSION_TYPE = "xla_cpu_experimental_ynn_fusion_type"
# xla.DebugOptions.LibraryFusionType.LIBRARY_FUSION_TYPE_DOT: the option takes the enum's number, not its name.
LIBRARY_FUSION_TYPE_DOT = 1


def compiler_options(dtype, platform: str) -> dict:
  """Options for a program computing in `dtype` on `platform` ('cpu', 'gpu', 'tpu'): YNNPACK dot fusion for
  bfloat16 on CPU, unless XLA_FLAGS already sets that field (the user's choice wins); {} otherwise."""
  if platform != "cpu" or jnp.dtype(dtype) != jnp.bfloat16 or YNN_FUSION_TYPE in os.environ.get("XLA_FLAGS", ""):
    return {}
  return {YNN_FUSION_TYPE: LIBRARY_FUSION_TYPE_DOT} if _cpu_takes_ynn_fusion() else {}


@functools.cache
def _cpu_takes_ynn_fusion() -> bool:
  """Whether this jaxlib's XLA:CPU knows the (experimental) option; a release without it gets a warning, once."""
  try:
    probe = jax.device_put(jnp.zeros(()), jax.devices("cpu")[0])
    jax.jit(lambda x: x + 1).lower(probe).compile(compiler_options={YNN_FUSION_TYPE: LIBRARY_FUSION_TYPE_DOT})
    return True
  except jax.errors.JaxRuntimeError as error:
    warnings.warn(f"this jaxlib's XLA:CPU does not take {YNN_FUSION_TYPE} ({error}); bfloat16 programs on CPU "
                  "compile with XLA's default dots, which run slower than float32 there.", stacklevel=3)
    return False
