"""Device mesh (data, fsdp, tensor) from the config, logical-axis rules, and the shardings built from them."""

import dataclasses
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from hourglass_jax.runtime.settings import Section

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axes. Activations name ('batch', 'length', 'embed'); a mesh axis already used by an earlier
# logical axis of the same array is skipped, so activations shard batch over data x fsdp and parameters shard their
# 'embed' dimension over fsdp (ZeRO-3 style) and heads / mlp / vocab over tensor (Megatron style). Scanned stacks
# add a leading 'layers' axis to their blocks' parameters.
LAYERS_AXIS = "layers"  # named by the model's scanned stacks (model/layers.py, retina.py)
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    (LAYERS_AXIS, None),  # the leading axis of scanned block parameters: replicated (map it to pipeline stages later)
)
LOGICAL_AXES = tuple(name for name, _ in DEFAULT_RULES)  # every logical axis name the model code uses


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshSettings(Section):
  """The `mesh` config section: the device mesh's axis sizes and the logical-axis rule table."""
  data: int = -1  # data-parallel devices (-1 = the devices the other axes leave)
  fsdp: int = 1  # devices the parameters' 'embed' dimension and the batch are split over (ZeRO-3 style)
  tensor: int = 1  # devices heads, mlp and vocab are split over (Megatron style)
  rules: tuple = DEFAULT_RULES  # logical axis -> mesh axes (None = replicated), as DEFAULT_RULES
  NAME = "mesh"

  def check_values(self) -> None:
    """The axis sizes (positive, at most one -1) and the rule table (known logical names and mesh axes), which is
    kept as a tuple of (name, axes) pairs however the config spelt it (lists from a command line)."""
    sizes = [getattr(self, name) for name in MESH_AXES]
    if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
      described = ", ".join(f"mesh.{n}={s}" for n, s in zip(MESH_AXES, sizes))
      raise ValueError(f"{described}: each size must be a positive integer, and at most one may be -1 (= the rest "
                       "of the devices).")
    rules = tuple((str(name), tuple(axes) if isinstance(axes, list) else axes) for name, axes in self.rules)
    for name, axes in rules:
      if name not in LOGICAL_AXES:
        raise ValueError(f"mesh.rules names logical axis {name!r}; the model uses {', '.join(LOGICAL_AXES)}.")
      for axis in (axes,) if isinstance(axes, str) or axes is None else axes:
        if axis is not None and axis not in MESH_AXES:
          raise ValueError(f"mesh.rules maps {name!r} to mesh axis {axis!r}; mesh axes are "
                           f"{', '.join(MESH_AXES)}.")
    object.__setattr__(self, "rules", rules)


def mesh_shape(mesh: "MeshSettings | Mapping[str, Any]", num_devices: int) -> tuple[int, ...]:
  """Axis sizes with one -1 filled in; raises unless their product is exactly `num_devices`."""
  mesh = MeshSettings.of(mesh)
  sizes = [getattr(mesh, name) for name in MESH_AXES]
  described = ", ".join(f"mesh.{n}={s}" for n, s in zip(MESH_AXES, sizes))
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"{described} does not divide the {num_devices} devices: the fixed axes need a multiple of "
                       f"{known}. Pick sizes whose product divides {num_devices}.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"{described} uses {math.prod(sizes)} devices but {num_devices} are available; make the "
                     f"product equal {num_devices}, or set one axis to -1 to take the rest.")
  return tuple(sizes)


def make_mesh(mesh: "MeshSettings | Mapping[str, Any]", devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh with axes data, fsdp, tensor in Auto mode (the compiler propagates shardings), from the run's mesh
  section (a mapping such as dict(data=2, tensor=-1) is read as one: `MeshSettings.of`).

  With several processes, the devices are then grouped by process (a stable sort of jax.make_mesh's order, which
  follows the TPU torus and can interleave hosts), so each process holds one contiguous block of batch rows and
  feeds it from its own data shard.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh, len(devices))
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  made = jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
  if len({d.process_index for d in devices}) > 1:
    by_process = sorted(made.devices.flat, key=lambda d: d.process_index)
    made = Mesh(np.array(by_process).reshape(shape), MESH_AXES, axis_types=axis_types)
  return made


def logical_rules(mesh: "MeshSettings | Mapping[str, Any]") -> tuple[tuple[str, Any], ...]:
  """The mesh section's rule table (checked when the section was made: known logical names, known mesh axes)."""
  return MeshSettings.of(mesh).rules


def tree_shardings(abstract_boxed, mesh: Mesh, rules) -> Any:
  """NamedShardings for a tree of (possibly) logically annotated leaves; plain leaves are replicated."""
  specs = nn.get_partition_spec(abstract_boxed)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """[batch, ...] arrays: rows split per the 'batch' rule, the rest replicated."""
  return nn.logical_to_mesh_sharding(P("batch"), mesh, rules)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_parallelism(mesh: Mesh, rules) -> int:
  """How many ways the batch dimension is split."""
  spec = batch_sharding(mesh, rules).spec[0]
  axes = () if spec is None else (spec,) if isinstance(spec, str) else spec
  return math.prod(mesh.shape[a] for a in axes)


def check_divisible(abstract_boxed, shardings, what: str = "parameter") -> None:
  """Raises, naming the array, its logical axis and the fix, when a sharded dimension does not divide evenly."""
  logical = jax.tree_util.tree_leaves(nn.get_partition_spec(abstract_boxed), is_leaf=lambda x: isinstance(x, P))
  leaves = jax.tree_util.tree_leaves_with_path(abstract_boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  for (path, leaf), names, sharding in zip(leaves, logical, jax.tree_util.tree_leaves(shardings)):
    leaf = leaf.value if isinstance(leaf, nn.Partitioned) else leaf
    for dim, name, axes in zip(leaf.shape, tuple(names) + (None,) * leaf.ndim, sharding.spec):
      axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
      parts = math.prod(sharding.mesh.shape[a] for a in axes)
      if dim % parts:
        where = jax.tree_util.keystr(path, simple=True, separator="/")
        raise ValueError(f"{what} {where} of shape {tuple(leaf.shape)}: its {name!r} dimension of {dim} cannot be "
                         f"split evenly over mesh axes {axes} ({parts} devices); change the mesh sizes or map "
                         f"{name!r} to None in mesh.rules.")


def process_rows(sharding: NamedSharding, global_batch: int, row_shape: tuple[int, ...]) -> tuple[int, int]:
  """The contiguous block [start, stop) of batch rows this process's devices hold."""
  index_map = sharding.addressable_devices_indices_map((global_batch, *row_shape))
  rows = sorted({(s[0].start or 0, global_batch if s[0].stop is None else s[0].stop)
                 for s in index_map.values()})
  start, stop = rows[0][0], max(r[1] for r in rows)
  covered = np.zeros(global_batch, bool)
  for a, b in rows:
    covered[a:b] = True
  if not covered[start:stop].all():
    raise ValueError("this process's devices hold a non-contiguous set of batch rows; build the mesh with "
                     "hourglass_jax.runtime.sharding.make_mesh, which groups the devices by process, so each process "
                     "feeds one block of the batch.")
  return start, stop


def to_host(tree):
  """NumPy copies of replicated arrays (works in multi-process runs, where device_get would refuse)."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data), tree)
