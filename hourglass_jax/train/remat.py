"""Per-layer activation rematerialisation without touching model code: while active, every DecoderBlock call
runs under `nn.remat`, so its activations are recomputed in the backward pass instead of stored."""

import contextlib
import contextvars

import flax.linen as nn

from hourglass_jax.model.layers import DecoderBlock

_INSIDE = contextvars.ContextVar("inside_remat_block", default=False)


def _block(module, x, deterministic):
  token = _INSIDE.set(True)
  try:
    return module(x, deterministic)
  finally:
    _INSIDE.reset(token)


_remat_block = nn.remat(_block, static_argnums=(2,))


def _interceptor(next_fun, args, kwargs, context):
  if (_INSIDE.get() or context.method_name != "__call__" or not isinstance(context.module, DecoderBlock)
      or kwargs or len(args) != 2):
    return next_fun(*args, **kwargs)
  return _remat_block(context.module, *args, **kwargs)


@contextlib.contextmanager
def remat_blocks(enabled: bool = True):
  """Context (active while tracing `model.apply`) that rematerialises each decoder block."""
  if not enabled:
    yield
    return
  with nn.intercept_methods(_interceptor):
    yield
