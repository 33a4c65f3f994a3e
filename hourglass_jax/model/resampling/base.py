"""The resampling-method interfaces and their registries. A shortening turns each group of k consecutive vectors of
a stream already shifted right by k-1 (`shift_right`) into one; an up-sampling turns each shortened vector back into
k and adds the full-resolution residual. Each method is one class, filed under its config name by
`register_shortening` / `register_upsampling`; `shortening` / `upsampling` pick one by name."""

from typing import ClassVar

import jax.numpy as jnp

from hourglass_jax.model import costs
from hourglass_jax.model.layer_config import LayerConfig, check_choice
from hourglass_jax.model.layers import layer_norm

SHORTENINGS: dict[str, type["Shortening"]] = {}  # key -> class, in the order registered
UPSAMPLINGS: dict[str, type["Upsampling"]] = {}


def shift_right(x_BxLxD, shift: int):
  """k-1 zero vectors in front, the last k-1 dropped."""
  if shift == 0:
    return x_BxLxD
  return jnp.pad(x_BxLxD, ((0, 0), (shift, 0), (0, 0)))[:, :x_BxLxD.shape[1]]


class Shortening:
  """A fixed shortening method, used inside a Flax module's compact call (its submodules are the caller's). A
  subclass declares its `key` (model.shorten / Shorten.method) and `multiscale_name`, its name among the multi-scale
  models' downsamplers (None: not one); a pooling method its `pool` (k vectors -> 1, parameters under `name`) and
  `pool_cost`; a method with more (attention) its `shorten`, the decoding `cache` entries it keeps and its `cost`."""
  key: ClassVar[str]
  multiscale_name: ClassVar[str | None] = None

  @classmethod
  def pool(cls, cfg: LayerConfig, k: int, h_BxLxD, deterministic: bool, name: str = "pool"):
    """h [B, L, D] -> [B, L/k, D]: each group of k consecutive vectors -> one."""
    raise NotImplementedError(f"shortening {cls.key!r} has no pooling of its own")

  @classmethod
  def shorten(cls, cfg: LayerConfig, k: int, outer_factor: int, h0_BxLxD, deterministic: bool, kv=None, start=None):
    """(z [B, L/k, D], kv) from the shifted stream h0 (cached decoding, `start` given: the rows of whole groups
    start, start+1, ...; `kv` the method's cache entry, passed through when it keeps none)."""
    return cls.pool(cfg, k, h0_BxLxD, deterministic), kv

  cache = classmethod(lambda cls, cfg, batch, padded, k: {})  # its decoding cache entries, by name
  pool_cost = classmethod(lambda cls, cfg, k, short: (0, 0))  # (params, FLOPs) of pooling into `short` vectors

  @classmethod
  def cost(cls, cfg, k: int, length: int) -> tuple[int, int]:
    """(params, forward FLOPs) at `length` full-resolution positions."""
    return cls.pool_cost(cfg, k, length // k)


class Upsampling:
  """A fixed up-sampling method, used inside a Flax module's compact call. A subclass declares its `key`
  (model.upsample / Upsample.method), `multiscale_name` (its name among the multi-scale models' upsamplers; None: not
  one) and whether it `reads_shortened` (False: the level above needs no shortened tokens in decoding); an
  unpooling method its `unpool` (one vector -> k, parameters under `name`) and `unpool_cost`; a method with more its
  `upsample`, the decoding `cache` entries it keeps and its `cost`."""
  key: ClassVar[str]
  multiscale_name: ClassVar[str | None] = None
  reads_shortened: ClassVar[bool] = True

  @classmethod
  def unpool(cls, cfg: LayerConfig, k: int, z_BxSxD, deterministic: bool, name: str = "unpool"):
    """z [B, S, D] -> [B, S*k, D]: finer vector i reads only z[i // k]."""
    raise NotImplementedError(f"up-sampling {cls.key!r} has no unpooling of its own")

  @classmethod
  def upsample(cls, cfg: LayerConfig, k: int, outer_factor: int, z_BxSxD, r_BxLxD, deterministic: bool, rows,
               kv=None, start=None, first=None):
    """(y [B, L, D] including "+ r", kv): `rows` picks r's rows from the unpooled stream (cached decoding: r holds
    entries start.., z the shortened tokens from entry `first`; `kv` the method's cache entry)."""
    u_BxLxD = rows(cls.unpool(cfg, k, z_BxSxD, deterministic))
    return layer_norm(cfg, "output_norm")(u_BxLxD) + r_BxLxD, kv

  cache = classmethod(lambda cls, cfg, batch, padded, k: {})
  unpool_cost = classmethod(lambda cls, cfg, k, short: (0, 0))  # (params, FLOPs) of unpooling `short` vectors

  @classmethod
  def cost(cls, cfg, k: int, length: int) -> tuple[int, int]:
    """(params, forward FLOPs) at `length` full-resolution positions: the unpooling and the output LayerNorm."""
    params, flops = cls.unpool_cost(cfg, k, length // k)
    return params + costs.norm(cfg.d_model), flops


def register_shortening(cls):
  SHORTENINGS[cls.key] = cls
  return cls


def register_upsampling(cls):
  UPSAMPLINGS[cls.key] = cls
  return cls


def shortening(name: str, owner: str = "shorten") -> type[Shortening]:
  """The shortening method `name` names; ValueError naming `owner` and the choices."""
  check_choice(owner, name, tuple(SHORTENINGS))
  return SHORTENINGS[name]


def upsampling(name: str, owner: str = "upsample") -> type[Upsampling]:
  check_choice(owner, name, tuple(UPSAMPLINGS))
  return UPSAMPLINGS[name]


def by_multiscale_name(registry: dict) -> dict:
  """{multiscale_name: class} of the methods in `registry` that are also a multi-scale model's, in its order."""
  return {cls.multiscale_name: cls for cls in registry.values() if cls.multiscale_name}


def downsampling(name: str, owner: str = "downsampler") -> type[Shortening]:
  """The shortening a multi-scale model's `downsampler` names."""
  by_name = by_multiscale_name(SHORTENINGS)
  check_choice(owner, name, tuple(by_name))
  return by_name[name]


def scale_upsampling(name: str, owner: str = "upsampler") -> type[Upsampling]:
  """The up-sampling a multi-scale model's `upsampler` names."""
  by_name = by_multiscale_name(UPSAMPLINGS)
  check_choice(owner, name, tuple(by_name))
  return by_name[name]
