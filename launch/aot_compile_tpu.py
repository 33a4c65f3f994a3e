"""Ahead-of-time compile of the train step for a Cloud TPU slice that is described, not attached.

Shows, from any CPU machine, that a config lowers, partitions over the slice's mesh and fits the chips' HBM:
libtpu's compiler runs against a topology from `jax.experimental.topologies`, nothing executes. The data source is
replaced by synthetic tokens of the same shape (the step's program depends only on batch and sequence shapes).

  .venv/bin/pip install "libtpu==0.0.50.*"      # the libtpu that jax 0.12.0.1's [tpu] extra pins
  .venv/bin/python launch/aot_compile_tpu.py --config=configs/enwik8.py:pod --accelerator=v4-32
"""

import importlib.util
import json
import os
import re
import sys

from absl import app, flags
from ml_collections import config_flags

# Set before jax loads: the host backend stays CPU, so libtpu never tries to open a TPU that is not there; the TPU_*
# values only quiet libtpu's warnings about the absent TPU VM metadata; compiling needs no exclusive hold on a TPU.
HOST_ENVIRONMENT = dict(JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1", TPU_ACCELERATOR_TYPE="v4-8",
                        TPU_WORKER_HOSTNAMES="localhost", ALLOW_MULTIPLE_LIBTPU_LOAD="1")


# family -> (topology prefix, chip config, TensorCores per chip, HBM GiB per JAX device, chip-count -> shape).
# v4 / v5p names count TensorCores (2 per chip, one megacore device); v5e / v6e names count chips.
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_FAMILIES = {
    "v4": ("v4", "megacore", 2, 32, _SHAPES_3D),
    "v5p": ("v5p", "megacore", 2, 95, _SHAPES_3D),
    "v5e": ("v5e", "default", 1, 16, _SHAPES_2D),
    "v6e": ("v6e", "default", 1, 32, _SHAPES_2D),
}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e"}


def describe_accelerator(accelerator: str) -> dict:
  """gcloud accelerator type -> topology arguments, host count and HBM per device."""
  match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v5lite|v6e|v6litepod)-(\d+)", accelerator)
  if not match:
    raise ValueError(f"--accelerator={accelerator!r}: expected a Cloud TPU type such as v4-8, v4-32, v5p-8, "
                     f"v5litepod-16, v6e-8.")
  family = _ALIASES.get(match[1], match[1])
  prefix, chip_config, cores_per_chip, hbm_gib, shapes = _FAMILIES[family]
  count = int(match[2])
  chips = count // cores_per_chip
  if count % cores_per_chip or chips not in shapes:
    sizes = ", ".join(f"{family}-{c * cores_per_chip}" for c in shapes)
    raise ValueError(f"--accelerator={accelerator!r}: no known {family} slice of that size; known: {sizes}.")
  per_host = (2, 4, 1) if chips == 8 and family in ("v5e", "v6e") else (2, 2, 1)  # 8-chip v5e/v6e: one host
  if chips < 4:
    per_host = tuple(int(n) for n in shapes[chips].split("x")) + (1,)
  hosts = max(1, chips // (per_host[0] * per_host[1] * per_host[2]))
  return dict(accelerator=accelerator, topology=f"{prefix}:{shapes[chips]}", chip_config=chip_config,
              chips_per_host=per_host, hosts=hosts, devices=chips, hbm_bytes=hbm_gib * 2**30)


def _topology_devices(spec: dict):
  if importlib.util.find_spec("libtpu") is None:
    raise SystemExit("error: describing a TPU topology needs libtpu (the TPU compiler), which is not installed: "
                     "`.venv/bin/pip install 'libtpu==0.0.50.*'` (the version jax 0.12.0.1's [tpu] extra pins).")
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc(platform="tpu", topology_name=spec["topology"],
                                            chip_config_name=spec["chip_config"],
                                            chips_per_host_bounds=spec["chips_per_host"], num_slices=1)
  except Exception as error:
    raise SystemExit(f"error: libtpu cannot describe TPU topology {spec['topology']} ({type(error).__name__}: "
                     f"{str(error).splitlines()[0][:300]}).")
  return topology.devices


def hosts_with_split_rows(mesh, mesh_cfg, global_batch: int, row_shape: tuple[int, ...]) -> list[int]:
  """Hosts whose devices hold a non-contiguous set of batch rows: hourglass_jax.runtime.sharding.process_rows (each
  process feeds one block of rows) refuses such a mesh, so a real launch on this slice would stop there."""
  from hourglass_jax.runtime import sharding

  batch_sharding = sharding.batch_sharding(mesh, sharding.logical_rules(mesh_cfg))
  rows = {}
  for device, index in batch_sharding.devices_indices_map((global_batch, *row_shape)).items():
    start, stop, _ = index[0].indices(global_batch)
    rows.setdefault(device.process_index, set()).update(range(start, stop))
  return sorted(host for host, held in rows.items() if max(held) - min(held) + 1 != len(held))


def aot_compile(cfg, accelerator: str, tpu_attention: bool = True, log=print) -> dict:
  """Compiles cfg's train step for the described slice; returns its per-device memory and FLOPs."""
  import jax

  from hourglass_jax.config import run_config
  from hourglass_jax.runtime import sharding
  from hourglass_jax.train.compiled.trainer import compile_ahead
  from hourglass_jax.train.reporting import metrics

  spec = describe_accelerator(accelerator)
  devices = _topology_devices(spec)
  if len(devices) != spec["devices"]:
    raise SystemExit(f"error: topology {spec['topology']} has {len(devices)} devices, expected {spec['devices']}.")
  cfg = cfg.copy_and_resolve_references()
  data_name = cfg.data.name
  cfg.data.name = "synthetic"
  if cfg.data.batch_size % spec["hosts"]:
    raise SystemExit(f"error: data.batch_size={cfg.data.batch_size} does not split over the {spec['hosts']} hosts "
                     f"of {accelerator}; use a multiple of {spec['hosts']}.")
  mesh = sharding.make_mesh(cfg.mesh, devices)
  split = hosts_with_split_rows(mesh, cfg.mesh, cfg.data.batch_size, (cfg.data.seq_len + 1,))
  if split:
    log(f"warning: on {accelerator}, this mesh gives host(s) {split} non-contiguous batch rows; the trainer's "
        "per-process data feed (sharding.process_rows) refuses that, so a real launch stops before compiling. "
        "Compiling anyway, feeding no data.")
  real_rows = sharding.process_rows
  if split:
    sharding.process_rows = lambda _, batch, __: (0, batch // spec["hosts"])  # only the data feed reads them
  try:  # tpu_attention: 'auto' attention resolves at trace time as on a TPU
    trainer, compiled, seconds = compile_ahead(run_config(cfg), mesh, "tpu" if tpu_attention else None)
  finally:
    sharding.process_rows = real_rows
  stats = compiled.memory_analysis()
  needed = metrics.memory_bytes(compiled)
  flops = metrics.cost_flops(compiled)
  result = dict(
      spec, config_data=data_name, mesh=dict(mesh.shape), batch_size=cfg.data.batch_size, seq_len=cfg.data.seq_len,
      params=trainer.num_params, dtype=cfg.model.dtype, remat=cfg.model.remat_policy,
      compile_seconds=round(seconds, 1),
      memory_bytes=needed, argument_bytes=stats.argument_size_in_bytes, temp_bytes=stats.temp_size_in_bytes,
      flops_per_device=flops, fits=needed <= spec["hbm_bytes"], device_kind=devices[0].device_kind,
      hosts_with_split_rows=split, mosaic_kernel_calls=compiled.as_text().count('"tpu_custom_call"'),
      jax=jax.__version__)
  mesh_text = " x ".join(f"{k}={v}" for k, v in result["mesh"].items())
  log(f"{accelerator} ({spec['topology']}, {spec['devices']} x {result['device_kind']}, {spec['hosts']} host(s)): "
      f"mesh {mesh_text}; batch {cfg.data.batch_size} x {cfg.data.seq_len}; {trainer.num_params:,} params")
  log(f"compiled in {seconds:.0f} s: {needed / 2**30:.2f} GiB/device of {spec['hbm_bytes'] / 2**30:.0f} GiB HBM "
      f"(arguments {stats.argument_size_in_bytes / 2**30:.2f}, temporaries {stats.temp_size_in_bytes / 2**30:.2f})"
      f"; {flops / 1e12 if flops else float('nan'):.2f} TFLOPs/device/step; "
      f"{'fits' if result['fits'] else 'DOES NOT FIT'}; {result['mosaic_kernel_calls']} Pallas kernel calls (splash)")
  return result


def _define_flags():
  """Flags are defined only when run as a script, so tests can import this module next to hourglass_jax.cli.main."""
  config = config_flags.DEFINE_config_file("config", None, "configs/*.py file, optionally :preset.")
  accelerator = flags.DEFINE_string("accelerator", None, "Slice to compile for: v4-8, v4-32, v5litepod-16 (or "
                                    "v5e-16), v5p-8, v6e-8, ... as gcloud's --accelerator-type names them.")
  json_path = flags.DEFINE_string("json", None, "Also write the result as JSON to this file.")
  tpu_attention = flags.DEFINE_bool("tpu_attention", True, "Resolve attention_impl='auto' as on a TPU host "
                                    "(splash where it applies) rather than as on this CPU host.")
  flags.mark_flags_as_required(["config", "accelerator"])
  return config, accelerator, json_path, tpu_attention


def _main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    result = aot_compile(_CONFIG.value, _ACCELERATOR.value, _TPU_ATTENTION.value)
  except ValueError as error:
    sys.exit(f"error: {error}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(result, f, indent=1)
  if not result["fits"]:
    sys.exit(1)


if __name__ == "__main__":
  for name, value in HOST_ENVIRONMENT.items():
    os.environ.setdefault(name, value)
  _CONFIG, _ACCELERATOR, _JSON, _TPU_ATTENTION = _define_flags()
  app.run(_main)
