"""The train step of each configs/gpu.py preset compiled for an H100 on a machine without a GPU, and what it costs.

    .venv-gpu-offline/bin/python benchmarks/gpu_offline.py                 # every preset, remat none / dots
    .venv-gpu-offline/bin/python benchmarks/gpu_offline.py --presets large --variants none
    .venv/bin/python benchmarks/gpu_offline.py --dry-run                   # tiny sizes, any backend (CI)

Deviceless ahead-of-time compilation: with the CUDA plugin installed (`jax-cuda12-plugin`, see docs/gpu.md for the
venv), `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)` describes an H100 from
its XLA target config (`TARGET_CONFIGS`), and jit(...).lower(...).compile() runs XLA:GPU's whole pipeline on the
CPU (fusion, GEMM rewriting, Pallas / Triton kernels to PTX and cubin) without autotuning, so GEMM tile choices are
XLA's defaults, not the device's tuned ones. For each preset and remat variant it records the compiled memory, the
kernels one step launches (benchmarks/hlo_kernels.py: fusions, custom calls, GEMMs), XLA's HLO cost analysis of the
optimized module (which counts a while loop's body once and custom calls as zero) and a roofline estimate of the
step per kernel class on an H100 and an H200. Without the plugin (or with --backend cpu) it falls back to the
train step compiled for this CPU, with the same census and roofline: a weaker estimate (XLA:CPU fuses differently
and attention takes the CPU's kernel).

Writes results/gpu_offline.json (appended) and results/gpu_offline.md (the BENCHMARKS.md section).
"""

import argparse
import importlib.util
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host stays the CPU: the GPU is described, not opened

from benchmarks import hlo_kernels  # noqa: E402

PRESETS = ("", "large", "dynamic", "fixed")
VARIANTS = {"none": dict(remat=False), "dots": dict(remat=True, remat_policy="dots_saveable"),
            "full": dict(remat=True, remat_policy="nothing_saveable")}
# XLA's GPU target descriptions (xla/backends/gpu/target_config/specs, as Compiler::TargetConfig text): what the
# compiler reads from a device it cannot query. H200: the H100's SMs and clocks with 141 GB of HBM3e at 4.8 TB/s.
_DEVICE_INFO = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: {memory}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{name}"
"""
TARGET_CONFIGS = {"h100": _DEVICE_INFO.format(bandwidth=3352320000000, memory=84929347584,
                                              name=hlo_kernels.GPUS["h100"]["name"]),
                  "h200": _DEVICE_INFO.format(bandwidth=4800000000000, memory=150754820096,
                                              name=hlo_kernels.GPUS["h200"]["name"])}
# The step times one H200 measured (benchmarks/device_check.py; the issue's table), to set against the estimates.
MEASURED_H200 = {"": 0.2171, "large": 0.2253, "dynamic": 0.0877, "fixed": 0.0745}
# Non-tensor-core work per visited score element of the flash kernel (ops/flash_dropout.py), counted from its code:
# exp2 once per kernel; the dropout hash (mix32: 8 integer ops) on the [rows, cols] tile, three of them as first
# written, one since the row and column halves are hashed as vectors; the causal compare and the softmax's fp32 ops.
FLASH_MATMULS = {"flash_dropout_forward": 2, "flash_dropout_dkv": 4, "flash_dropout_dq": 3}
FLASH_INT_OPS = dict(mask=3, hash_per_element=10, softmax=6)


def cuda_plugin() -> str | None:
  """The installed CUDA PJRT plugin's module name, or None."""
  for name in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13"):
    try:
      if importlib.util.find_spec(name):
        return name
    except ModuleNotFoundError:
      pass
  return None


def gpu_devices(gpu: str):
  """Compile-only devices of one described GPU (no GPU needed)."""
  from jax.experimental import topologies

  return topologies.get_topology_desc(platform="cuda", target_config=TARGET_CONFIGS[gpu], topology="1x1x1").devices


class FlashRecorder:
  """Notes every flash kernel the trace builds (ops/flash_dropout._attention_fn), keyed by the padded shapes its
  custom calls carry, with the score elements each of its three kernels visits."""

  def __init__(self):
    from hourglass_jax.ops import flash_dropout

    self.module, self.seen = flash_dropout, {}
    self.original = flash_dropout._attention_fn

  def __enter__(self):
    def record(spec, interpret):
      visited = lambda lo_hi, rows, cols: int((lo_hi[1] - lo_hi[0]).sum()) * rows * cols
      self.seen[(spec.b, spec.tp, spec.n, spec.hp, spec.sp)] = dict(
          rate=spec.rate, hp=spec.hp, heads=spec.b * spec.n,
          flash_dropout_forward=visited(spec.fwd, spec.bq, spec.bk),
          flash_dropout_dq=visited(spec.dq, spec.dq_q, spec.dq_k),
          flash_dropout_dkv=visited(spec.dkv, spec.dkv_k, spec.dkv_q))
      return self.original(spec, interpret)

    self.module._attention_fn = record
    return self

  def __exit__(self, *exc):
    self.module._attention_fn = self.original

  def annotate(self, kernel_list: list[dict]):
    """Adds matmul FLOPs and score elements to the flash custom calls (HLO counts a custom call as zero)."""
    for k in kernel_list:
      if k["label"] not in FLASH_MATMULS or not k.get("operand_types"):
        continue
      q, key = (hlo_kernels.arrays(t)[0][1] for t in k["operand_types"][4:6])
      facts = self.seen.get((q[0], q[1], q[2], q[3], key[1]))
      if facts:
        elements = facts[k["label"]] * facts["heads"]
        k.update(flops=2.0 * FLASH_MATMULS[k["label"]] * elements * facts["hp"], score_elements=elements,
                 dropout=facts["rate"] > 0)


def flash_vector_seconds(kernel: dict, gpu: dict) -> float:
  """exp2 and integer / fp32 work of a flash kernel on `gpu` (0 for other kernels)."""
  elements = kernel.get("score_elements", 0)
  if not elements:
    return 0.0
  ops = FLASH_INT_OPS["mask"] + FLASH_INT_OPS["softmax"] + (FLASH_INT_OPS["hash_per_element"]
                                                            if kernel.get("dropout") else 0)
  return max(elements / gpu["exp_per_s"], elements * ops / gpu["int_ops_per_s"])


def step_config(preset: str, variant: str, dry_run: bool, overrides: dict | None = None):
  from benchmarks import device_check

  cfg = device_check.train_config(preset, dict(overrides or {}), dry_run)
  cfg.train.update(VARIANTS[variant])
  return cfg


def compile_step(cfg, devices, as_gpu: bool):
  """(Trainer, compiled step, seconds, flash recorder): the train step of `cfg` for `devices`, tracing as on a GPU
  (jax.default_backend() reads 'gpu', so 'auto' picks cuDNN or the flash kernel) when `as_gpu`."""
  from hourglass_jax import sharding
  from hourglass_jax.ops import flash_dropout
  from hourglass_jax.train.trainer import compile_ahead

  major = int(str(getattr(devices[0], "compute_capability", "9.0")).split(".")[0]) if as_gpu else None
  with FlashRecorder() as recorder, flash_dropout.use_blocks(flash_dropout.BLOCKS.get(
      major, flash_dropout.DEFAULT_BLOCKS)):
    mesh = sharding.make_mesh(cfg.mesh, devices[:1])
    trainer, compiled, seconds = compile_ahead(cfg, mesh, "gpu" if as_gpu else None)
  return trainer, compiled, seconds, recorder


def xla_cost(compiled) -> dict:
  """XLA's HloCostAnalysis of the optimized module (for a compile-only GPU executable, run by the CPU client)."""
  import jax
  from jax._src.lib import _jax

  try:
    costs = compiled.cost_analysis()
    if not costs:
      module = compiled.runtime_executable().hlo_modules()[0]
      costs = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  except Exception as error:  # noqa: BLE001 -- an estimate without XLA's figures is still an estimate
    return dict(error=f"{type(error).__name__}: {str(error)[:200]}")
  costs = costs[0] if isinstance(costs, list) else costs
  return {key: float(costs.get(key, 0.0)) for key in ("flops", "bytes accessed", "transcendentals")}


def analyse(preset: str, variant: str, args, devices, as_gpu: bool) -> dict:
  from benchmarks.steps import model_flops
  from hourglass_jax.train import metrics

  cfg = step_config(preset, variant, args.dry_run)
  trainer, compiled, seconds, recorder = compile_step(cfg, devices, as_gpu)
  stats = compiled.memory_analysis()
  kernel_list = hlo_kernels.kernels(compiled.as_text())
  recorder.annotate(kernel_list)
  estimates = {}
  for gpu in ("h100", "h200"):
    spec = hlo_kernels.GPUS[gpu]
    roof = hlo_kernels.roofline(kernel_list, spec, extra=flash_vector_seconds)
    estimates[gpu] = dict(step_s=roof["total"]["seconds"], classes=roof["classes"],
                          top=hlo_kernels.top(kernel_list, spec, args.top, extra=flash_vector_seconds))
  record = dict(
      preset=preset, variant=variant, remat=VARIANTS[variant], batch=cfg.data.batch_size, seq_len=cfg.data.seq_len,
      params=trainer.num_params, compile_s=round(seconds, 1), model_flops=model_flops(cfg),
      memory_bytes=metrics.memory_bytes(compiled), temp_bytes=stats.temp_size_in_bytes if stats else None,
      kernels=hlo_kernels.summary(kernel_list), xla_cost=xla_cost(compiled), estimate=estimates,
      flash_kernels=len(recorder.seen))
  measured = MEASURED_H200.get(preset) if variant == "none" and not args.dry_run and as_gpu else None
  if measured:
    record["measured_h200_step_s"] = measured
    record["measured_over_estimate_h200"] = measured / estimates["h200"]["step_s"]
  return record


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--presets", default=",".join(p or "enwik8" for p in PRESETS),
                      help="configs/gpu.py presets ('enwik8' is the default one)")
  parser.add_argument("--variants", default="none,dots", help="remat variants, of " + ",".join(VARIANTS))
  parser.add_argument("--gpu", default="h100", choices=sorted(TARGET_CONFIGS), help="the GPU compiled for")
  parser.add_argument("--backend", default="auto", choices=("auto", "gpu", "cpu"),
                      help="gpu: deviceless compile (needs the CUDA plugin); cpu: the fallback; auto: gpu if it can")
  parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="tiny models (CI)")
  parser.add_argument("--top", type=int, default=10, help="kernels listed per preset")
  parser.add_argument("--results", default="", help="results folder (default benchmarks/results)")
  args = parser.parse_args(argv)
  presets = [p.strip() for p in args.presets.split(",")]
  unknown = [p for p in presets if p not in ("enwik8", *PRESETS[1:])]
  bad_variants = set(args.variants.split(",")) - set(VARIANTS)
  if unknown or bad_variants:
    parser.error(f"unknown {'--presets ' + ','.join(unknown) if unknown else '--variants ' + ','.join(bad_variants)}"
                 f"; presets: enwik8, {', '.join(PRESETS[1:])}; variants: {', '.join(VARIANTS)}")
  args.presets = ["" if p == "enwik8" else p for p in presets]
  args.variants = args.variants.split(",")
  if args.backend == "gpu" and not cuda_plugin():
    parser.error("--backend gpu needs the CUDA plugin (jax-cuda12-plugin) in this Python: see docs/gpu.md, "
                 "'Compiling for a GPU without one'.")
  return args


def main(argv=None) -> dict:
  import jax

  from benchmarks.common import RESULTS, append_result

  args = parse_args(argv)
  as_gpu = args.backend == "gpu" or (args.backend == "auto" and cuda_plugin() is not None)
  devices = gpu_devices(args.gpu) if as_gpu else jax.devices("cpu")
  record = dict(gpu=args.gpu if as_gpu else None, backend="deviceless gpu" if as_gpu else "cpu fallback",
                device_kind=devices[0].device_kind, dry_run=args.dry_run, jax=jax.__version__,
                plugin=cuda_plugin(), rows=[])
  print(f"compiling for {devices[0].device_kind} ({record['backend']})", flush=True)
  for preset in args.presets:
    for variant in args.variants:
      try:
        row = analyse(preset, variant, args, devices, as_gpu)
      except Exception as error:  # noqa: BLE001 -- one preset that fails to compile must not lose the others
        row = dict(preset=preset, variant=variant, error=f"{type(error).__name__}: {str(error)[:400]}")
      record["rows"].append(row)
      print(_line(row), flush=True)
  results = pathlib.Path(args.results) if args.results else RESULTS
  name = "gpu_offline" + ("_dry_run" if args.dry_run else "")
  path = append_result(name, record, results)
  from benchmarks.gpu_offline_summary import summary_markdown

  path.with_suffix(".md").write_text(summary_markdown(record))
  print(f"results: {path}")
  return record


def _line(row: dict) -> str:
  if "error" in row:
    return f"{row['preset'] or 'enwik8'} / {row['variant']}: {row['error']}"
  h100 = row["estimate"]["h100"]
  return (f"{row['preset'] or 'enwik8'} / remat {row['variant']}: {row['memory_bytes'] / 2**30:.1f} GiB, "
          f"{row['kernels']['launches_per_step']:.0f} launches, estimate {h100['step_s'] * 1e3:.1f} ms on an "
          f"H100 ({', '.join(f'{k} {v['seconds'] * 1e3:.1f}' for k, v in h100['classes'].items() if v['seconds'])})")


if __name__ == "__main__":
  main()
