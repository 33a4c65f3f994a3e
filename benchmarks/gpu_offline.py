"""The train step of each configs/gpu.py preset compiled for an H100 on a machine without a GPU, and what it costs.

    .venv-gpu-offline/bin/python benchmarks/gpu_offline.py                 # every preset as configs/gpu.py runs it
    .venv-gpu-offline/bin/python benchmarks/gpu_offline.py --presets large --variants preset,dots
    .venv-gpu-offline/bin/python benchmarks/gpu_offline.py --presets enwik8 --set model.scan_unroll=1
    .venv/bin/python benchmarks/gpu_offline.py --dry-run                   # tiny sizes, any backend (CI)

Deviceless ahead-of-time compilation: with the CUDA plugin installed (`jax-cuda12-plugin`, see docs/gpu.md for the
venv), `jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=...)` describes an H100 from
its XLA target config (`TARGET_CONFIGS`), and jit(...).lower(...).compile() runs XLA:GPU's whole pipeline on the
CPU (fusion, GEMM rewriting, Pallas / Triton kernels to PTX and cubin) without autotuning, so GEMM tile choices are
XLA's defaults, not the device's tuned ones. For each preset and execution variant it records the compiled memory,
the kernels one step launches (benchmarks/hlo_kernels.py: fusions, custom calls, GEMMs) and what the runtime
submits (benchmarks/thunk_census.py: command buffers, from the thunk sequence XLA dumps during the compile), XLA's
HLO cost analysis of the optimized module (which counts a while loop's body once and custom calls as zero) and the
roofline of the step per kernel class on an H100 and an H200, which benchmarks/gpu_calibration.py turns into a
calibrated step estimate. Without the plugin (or with --backend cpu) it falls back to the train step compiled for
this CPU, with the same census and roofline: a weaker estimate (XLA:CPU fuses differently and attention takes the
CPU's kernel).

Writes results/gpu_offline.json (appended) and results/gpu_offline.md (the BENCHMARKS.md section);
`--record gpu_calibration` writes the calibration's programs instead (docs/gpu.md).
"""

import argparse
import ast
import contextlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host stays the CPU: the GPU is described, not opened

from benchmarks import gpu_calibration, hlo_kernels, thunk_census  # noqa: E402

PRESETS = ("", "large", "dynamic", "fixed")
# 'preset': the preset's own execution settings (configs/gpu.py EXECUTION); the others override its remat, or
# bring back its scanned stacks.
VARIANTS = {"preset": {}, "none": dict(model=dict(remat_policy="none")),
            "dots": dict(model=dict(remat_policy="dots_saveable")),
            "full": dict(model=dict(remat_policy="nothing_saveable")),
            "scanned": dict(model=dict(scan_unroll=1))}
# XLA's GPU target descriptions (xla/backends/gpu/target_config/specs, as Compiler::TargetConfig text): what the
# compiler reads from a device it cannot query. H200: the H100's SMs and clocks with 141 GB of HBM3e at 4.8 TB/s.
_DEVICE_INFO = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98 device_memory_size: {memory}
  driver_version: "13.0.0"
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
# Non-tensor-core work per visited score element of the flash kernel (ops/flash_dropout.py): exp2 once per kernel
# on the SFUs; on the integer / fp32 lanes the causal compare and the softmax's fp32 ops (counted from its code),
# and, with dropout, the keep-mask hash, counted from the traced `_keep` of the kernel compiled (`hash_ops`).
FLASH_MATMULS = {"flash_dropout_forward": 2, "flash_dropout_dkv": 4, "flash_dropout_dq": 3}
FLASH_INT_OPS = dict(mask=3, softmax=6)


def hash_ops(module, spec, tile: int = 128) -> float:
  """Integer operations per score element of `module._keep` (the flash kernel's dropout hash) on a tile x tile
  tile: each traced operation weighted by its output's share of the tile (a [tile, 1] vector counts 1 / tile)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  zero = jnp.int32(0)
  jaxpr = jax.make_jaxpr(lambda seeds: module._keep(spec, seeds, zero, zero, zero, zero, tile, tile))(
      jnp.zeros((4,), jnp.uint32))
  return sum(int(np.prod(v.aval.shape)) / tile ** 2 for e in jaxpr.jaxpr.eqns for v in e.outvars
             if v.aval.shape)


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
      # an older checkout (the code a device run measured) had one backward tile, bb_q x bb_k
      dq_q, dq_k = getattr(spec, "dq_q", None) or spec.bb_q, getattr(spec, "dq_k", None) or spec.bb_k
      dkv_q, dkv_k = getattr(spec, "dkv_q", None) or spec.bb_q, getattr(spec, "dkv_k", None) or spec.bb_k
      self.seen[(spec.b, spec.tp, spec.n, spec.hp, spec.sp)] = dict(
          rate=spec.rate, hp=spec.hp, heads=spec.b * spec.n,
          hash_ops=hash_ops(self.module, spec) if spec.rate else 0.0,
          flash_dropout_forward=visited(spec.fwd, spec.bq, spec.bk),
          flash_dropout_dq=visited(spec.dq, dq_q, dq_k),
          flash_dropout_dkv=visited(spec.dkv, dkv_k, dkv_q))
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
                 hash_ops=facts["hash_ops"])


def flash_vector_seconds(kernel: dict, gpu: dict) -> float:
  """exp2 and integer / fp32 work of a flash kernel on `gpu` (0 for other kernels)."""
  elements = kernel.get("score_elements", 0)
  if not elements:
    return 0.0
  ops = FLASH_INT_OPS["mask"] + FLASH_INT_OPS["softmax"] + kernel.get("hash_ops", 0.0)
  return max(elements / gpu["exp_per_s"], elements * ops / gpu["int_ops_per_s"])


def step_config(preset: str, variant: str, dry_run: bool, overrides: dict | None = None, settings=()):
  """The benchmark step of `preset` with the remat `variant` and `settings` ('section.field=value', as the
  command line's --config.section.field=value) applied."""
  from benchmarks import battery_configs

  cfg = battery_configs.train_config(preset, dict(overrides or {}), dry_run)
  for section, values in VARIANTS[variant].items():
    cfg[section].update(values)
  for setting in settings:
    key, value = setting.split("=", 1)
    section, field = key.split(".", 1)
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass  # a plain string
    cfg[section][field] = value
  return cfg


def compile_step(cfg, devices, as_gpu: bool, lower_only: bool = False):
  """(Trainer, compiled step (None when `lower_only`), seconds, flash recorder): the train step of `cfg` for
  `devices`, tracing as on a GPU (jax.default_backend() reads 'gpu', so 'auto' picks cuDNN or the flash kernel)
  when `as_gpu`."""
  from hourglass_jax.ops import flash_dropout
  from hourglass_jax.runtime import sharding

  major = int(str(getattr(devices[0], "compute_capability", "9.0")).split(".")[0]) if as_gpu else None
  # An older checkout (the code a GPU measured) has no per-GPU block table: its own blocks.
  blocks = (flash_dropout.use_blocks(flash_dropout.BLOCKS.get(major, flash_dropout.DEFAULT_BLOCKS))
            if hasattr(flash_dropout, "use_blocks") else contextlib.nullcontext())
  with FlashRecorder() as recorder, blocks:
    mesh = sharding.make_mesh(cfg.mesh, devices[:1])
    trainer, compiled, seconds = _compile_ahead(cfg, mesh, "gpu" if as_gpu else None, lower_only)
  return trainer, compiled, seconds, recorder


def _compile_ahead(cfg, mesh, backend, lower_only: bool):
  """train.compiled.trainer.compile_ahead, written out where it is missing (an older checkout) or only the lowering is
  wanted (the HLO is read from a saved file)."""
  import time

  import jax
  import jax.numpy as jnp
  from hourglass_jax.train.compiled import trainer as trainer_module

  try:
    from hourglass_jax.config.run import run_config
  except ImportError:  # an older checkout: its Trainer takes the ConfigDict
    pass
  else:
    cfg = run_config(cfg)
  if hasattr(trainer_module, "compile_ahead") and not lower_only:
    return trainer_module.compile_ahead(cfg, mesh, backend)
  real = jax.default_backend
  if backend:
    jax.default_backend = lambda: backend
  try:
    trainer = trainer_module.Trainer(cfg, mesh)
    start = time.perf_counter()
    with jax.set_mesh(mesh):
      if lower_only:
        tokens = jax.ShapeDtypeStruct((trainer.batch_size, trainer.seq_len + 1), jnp.int32,
                                      sharding=trainer.batch_sharding)
        trainer.train_step.lower(trainer.abstract, tokens)
        return trainer, None, time.perf_counter() - start
      compiled = trainer.compile_train_step()
    return trainer, compiled, time.perf_counter() - start
  finally:
    jax.default_backend = real


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
  from hourglass_jax.train.reporting import metrics

  cfg = step_config(preset, variant, args.dry_run, settings=args.set)
  saved = load_saved(pathlib.Path(args.from_hlo), preset, variant) if args.from_hlo else None
  if args.from_hlo and saved is None:
    raise FileNotFoundError(f"--from-hlo {args.from_hlo}: nothing saved for {preset or 'enwik8'} / {variant}")
  trainer, compiled, seconds, recorder = compile_step(cfg, devices, as_gpu, lower_only=saved is not None)
  if saved:
    hlo_text, sequence, metadata, compiled_facts = saved
  else:
    stats = compiled.memory_analysis()
    hlo_text = compiled.as_text()
    sequence, metadata = read_thunks(args.dump_dir) if getattr(args, "dump_dir", "") else ("", "")
    compiled_facts = dict(compile_s=round(seconds, 1), memory_bytes=metrics.memory_bytes(compiled),
                          temp_bytes=stats.temp_size_in_bytes if stats else None, xla_cost=xla_cost(compiled))
    if args.hlo_dir:
      save_hlo(pathlib.Path(args.hlo_dir), preset, variant, hlo_text, sequence, metadata, compiled_facts)
  kernel_list = hlo_kernels.kernels(hlo_text)
  recorder.annotate(kernel_list)
  record = dict(
      preset=preset, variant=variant, settings=list(args.set),
      remat_policy=cfg.model.remat_policy, scan_unroll=cfg.model.get("scan_unroll", 1),
      batch=cfg.data.batch_size, seq_len=cfg.data.seq_len, params=trainer.num_params, model_flops=model_flops(cfg),
      **compiled_facts, kernels=hlo_kernels.summary(kernel_list), flash_kernels=len(recorder.seen),
      flash_hash_ops=max((f["hash_ops"] for f in recorder.seen.values()), default=0.0))
  if sequence:
    record["thunks"] = thunk_census.count(sequence, metadata, hlo_text)
  constants = (gpu_calibration.calibrate() or {}).get("model")
  record["estimate"] = {}
  for gpu in ("h100", "h200"):
    spec = hlo_kernels.GPUS[gpu]
    roof = hlo_kernels.roofline(kernel_list, spec, extra=flash_vector_seconds)
    # ranked with the fitted launch cost when there is one: a kernel's place in the step includes its launch
    launch_s = constants["launch_s"] if constants else 0.0
    record["estimate"][gpu] = dict(
        roofline_s=roof["total"]["seconds"], classes=roof["classes"],
        top=hlo_kernels.top(kernel_list, spec, args.top, extra=flash_vector_seconds, launch_s=launch_s))
  return record


def dump_flags(folder: str) -> str:
  """XLA_FLAGS that dump the train step's thunk sequence (and its HLO) into `folder` at each compile."""
  return f"--xla_dump_to={folder} --xla_dump_hlo_module_re=.*train_step.*"


def read_thunks(folder: str) -> tuple[str, str]:
  """(thunk sequence after the thunk passes, thunk metadata) of the newest compile dumped into `folder`, whose
  files are then removed (a step's dump is about 25 MB)."""
  paths = sorted(pathlib.Path(folder).glob("module_*"), key=lambda p: p.name)
  if not paths:
    return "", ""
  newest = paths[-1].name.split(".")[0]
  files = {p.name: p for p in paths if p.name.startswith(newest + ".")}
  pick = lambda suffix: next((p.read_text() for n, p in files.items() if n.endswith(suffix)), "")
  sequence = pick(".thunk_sequence_after_thunk_passes.txt") or pick(".thunk_sequence.txt")
  metadata = pick(".thunk_metadata.txt")
  for p in paths:
    p.unlink()
  return sequence, metadata


def save_hlo(folder: pathlib.Path, preset: str, variant: str, hlo_text: str, sequence: str, metadata: str,
             compiled_facts: dict) -> pathlib.Path:
  """The optimized HLO of one row, its thunk sequence and what the compile reported (memory, XLA's cost), so
  that `--from-hlo` recomputes the census and the estimate without compiling."""
  from hourglass_jax.runtime import files

  files.make_folder(folder)
  stem = f"{preset or 'enwik8'}_{variant}"
  for suffix, text in zip(SAVED, (hlo_text, sequence, metadata, json.dumps(compiled_facts, indent=1))):
    files.write_text(folder / (stem + suffix), text)
  return folder / stem


SAVED = (".hlo.txt", ".thunks.txt", ".thunk_metadata.txt", ".compiled.json")


def load_saved(folder: pathlib.Path, preset: str, variant: str):
  """(HLO text, thunk sequence, thunk metadata, compiled facts) that save_hlo wrote, or None."""
  paths = [folder / f"{preset or 'enwik8'}_{variant}{suffix}" for suffix in SAVED]
  if not (paths[0].exists() and paths[-1].exists()):
    return None
  texts = [p.read_text() if p.exists() else "" for p in paths]
  return (*texts[:3], json.loads(texts[3]))


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--presets", default=",".join(p or "enwik8" for p in PRESETS),
                      help="configs/gpu.py presets ('enwik8' is the default one)")
  parser.add_argument("--variants", default="preset", help="execution variants, of " + ",".join(VARIANTS))
  parser.add_argument("--gpu", default="h100", choices=sorted(TARGET_CONFIGS), help="the GPU compiled for")
  parser.add_argument("--backend", default="auto", choices=("auto", "gpu", "cpu"),
                      help="gpu: deviceless compile (needs the CUDA plugin); cpu: the fallback; auto: gpu if it can")
  parser.add_argument("--dry-run", dest="dry_run", action="store_true", help="tiny models (CI)")
  parser.add_argument("--top", type=int, default=10, help="kernels listed per preset")
  parser.add_argument("--results", default="", help="results folder (default benchmarks/results)")
  parser.add_argument("--hlo-dir", dest="hlo_dir", default="", help="also save each row's optimized HLO here")
  parser.add_argument("--from-hlo", dest="from_hlo", default="",
                      help="re-analyse what --hlo-dir saved (traces each step, compiles nothing)")
  parser.add_argument("--record", default="gpu_offline", choices=("gpu_offline", "gpu_calibration"),
                      help="results file: gpu_calibration for the programs a GPU measured (gpu_calibration.POINTS, "
                           "compiled from the code that ran: docs/gpu.md)")
  parser.add_argument("--label", default="", help="a name for this record in the results, e.g. 'before'")
  parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                      help="a config override for every preset, e.g. model.scan_unroll=0 (repeatable)")
  args = parser.parse_args(argv)
  presets = [p.strip() for p in args.presets.split(",")]
  unknown = [p for p in presets if p not in ("enwik8", *PRESETS[1:])]
  bad_variants = set(args.variants.split(",")) - set(VARIANTS)
  if unknown or bad_variants:
    parser.error(f"unknown {'--presets ' + ','.join(unknown) if unknown else '--variants ' + ','.join(bad_variants)}"
                 f"; presets: enwik8, {', '.join(PRESETS[1:])}; variants: {', '.join(VARIANTS)}")
  bad_settings = [x for x in args.set if "=" not in x or "." not in x.split("=", 1)[0]]
  if bad_settings:
    parser.error(f"--set {bad_settings[0]!r}: write SECTION.FIELD=VALUE, e.g. --set model.scan_unroll=0")
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
  user_flags = os.environ.get("XLA_FLAGS", "")
  args.dump_dir = tempfile.mkdtemp(prefix="gpu_offline_xla_") if as_gpu else ""
  if as_gpu:  # read when the backends start, below: the thunk sequence is where command buffers show
    os.environ["XLA_FLAGS"] = f"{user_flags} {dump_flags(args.dump_dir)}".strip()
  devices = gpu_devices(args.gpu) if as_gpu else jax.devices("cpu")
  record = dict(gpu=args.gpu if as_gpu else None, backend="deviceless gpu" if as_gpu else "cpu fallback",
                device_kind=devices[0].device_kind, dry_run=args.dry_run, jax=jax.__version__,
                plugin=cuda_plugin(), xla_flags=user_flags, label=args.label, rows=[])
  print(f"compiling for {devices[0].device_kind} ({record['backend']})", flush=True)
  for preset in args.presets:
    for variant in args.variants:
      try:
        row = analyse(preset, variant, args, devices, as_gpu)
      except FileNotFoundError as missing:  # --from-hlo: a row that was not saved is left out
        print(missing, flush=True)
        continue
      except Exception as error:  # noqa: BLE001 -- one preset that fails to compile must not lose the others
        row = dict(preset=preset, variant=variant, error=f"{type(error).__name__}: {str(error)[:400]}")
      record["rows"].append(row)
      print(_line(row), flush=True)
  results = pathlib.Path(args.results) if args.results else RESULTS
  name = args.record + ("_dry_run" if args.dry_run else "")
  path = append_result(name, record, results)
  if args.record == "gpu_offline":
    from benchmarks.gpu_offline_summary import summary_markdown
    from hourglass_jax.runtime import files

    files.write_text(path.with_suffix(".md"), summary_markdown(record, results))
  print(f"results: {path}")
  if args.dump_dir:
    shutil.rmtree(args.dump_dir, ignore_errors=True)
  return record


def _line(row: dict) -> str:
  if "error" in row:
    return f"{row['preset'] or 'enwik8'} / {row['variant']}: {row['error']}"
  h100 = row["estimate"]["h100"]
  host = f" ({row['thunks']['host_launches']:,.0f} from the host)" if "thunks" in row else ""
  gb = sum(c["bytes"] for c in h100["classes"].values()) / 1e9
  return (f"{row['preset'] or 'enwik8'} / remat {row['remat_policy']}: {row['memory_bytes'] / 2**30:.1f} GiB, "
          f"{row['kernels']['launches_per_step']:,.0f} launches{host}, {gb:.1f} GB, roofline "
          f"{h100['roofline_s'] * 1e3:.1f} ms on an H100 "
          f"({', '.join(f'{k} {v['seconds'] * 1e3:.1f}' for k, v in h100['classes'].items() if v['seconds'])})")


if __name__ == "__main__":
  main()
