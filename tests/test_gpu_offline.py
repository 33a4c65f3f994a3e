"""benchmarks/gpu_offline.py, hlo_kernels.py, thunk_census.py and gpu_calibration.py: the kernel census and roofline
of a program XLA compiled for an H100 without one (tests/data/h100_scan_grad.hlo: the gradient of a 3-layer scanned
matmul + GELU stack, compiled deviceless with the CUDA plugin; h100_scan_grad_graphs.*: the same stack's optimized
HLO and thunk sequence with command buffers, compiled with XLA_FLAGS=--xla_gpu_graph_min_graph_size=1), the flash
kernel's FLOPs and hash work, the calibration's fit, the report, and the CPU fallback end to end."""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from benchmarks import gpu_calibration, gpu_offline, gpu_offline_summary, hlo_kernels, thunk_census
from hourglass_jax.ops import flash_dropout
from hourglass_jax.model.layers import causal_mask
from hourglass_jax.ops.flash_dropout import flash_attention

DATA = pathlib.Path(__file__).parent / "data"
H100_HLO = DATA / "h100_scan_grad.hlo"


def test_census_counts_each_loop_trip_and_the_exact_matmul_flops_of_an_h100_program():
  kernels = hlo_kernels.kernels(H100_HLO.read_text())
  matmuls = [k for k in kernels if k["kind"] == "matmul"]
  # forward, input gradient and weight gradient of each of the 3 scanned layers: 2 x 512 x 256 x 256 each
  assert sorted(k["count"] for k in matmuls) == [3.0, 3.0, 3.0]
  assert sum(k["flops"] * k["count"] for k in matmuls) == 9 * 2 * 512 * 256 * 256
  assert {k["kind"] for k in kernels} <= set(hlo_kernels.CLASSES) and all(k["bytes"] >= 0 for k in kernels)
  h100, h200 = (hlo_kernels.roofline(kernels, hlo_kernels.GPUS[g]) for g in ("h100", "h200"))
  launches = sum(k["count"] for k in kernels)
  assert h100["total"]["launches"] == launches == hlo_kernels.summary(kernels)["launches_per_step"]
  assert h100["total"]["seconds"] >= max(k["bytes"] for k in kernels) / 3.35e12
  with_launches = hlo_kernels.roofline(kernels, hlo_kernels.GPUS["h100"], launch_s=1e-5)
  assert with_launches["total"]["seconds"] == pytest.approx(h100["total"]["seconds"] + launches * 1e-5)
  assert h200["total"]["seconds"] < h100["total"]["seconds"]  # the same kernels, more bandwidth
  top = hlo_kernels.top(kernels, hlo_kernels.GPUS["h100"], n=3)
  assert len(top) == 3 and top[0]["seconds"] >= top[-1]["seconds"]


def test_flash_recorder_gives_the_pallas_calls_their_matmul_flops():
  mask = causal_mask(64)
  x = jax.ShapeDtypeStruct((2, 64, 2, 16), jnp.float32)
  attend = functools.partial(flash_attention, mask_TxS=mask, dropout_rate=0.1, dropout_rng=jax.random.key(0),
                             interpret=True, block_q=16, block_k=16, block_bwd=16)
  with gpu_offline.FlashRecorder() as recorder:
    jax.jit(jax.grad(lambda q: attend(q, q, q).sum())).trace(x)
  [facts] = recorder.seen.values()
  tiles = 4 * 5 // 2  # a causal 4 x 4 grid of 16 x 16 tiles visits 10
  assert facts["flash_dropout_forward"] == facts["flash_dropout_dq"] == facts["flash_dropout_dkv"] == tiles * 256
  kernel = dict(label="flash_dropout_dkv", flops=0.0, operand_types=["u32[4]", "s32[4]", "s32[4]", "s8[16,16]",
                                                                     "f32[2,64,2,16]", "f32[2,64,2,16]"])
  recorder.annotate([kernel])
  # dK / dV: four matmuls (the scores again, dP, dV, dK) over the visited elements of the 2 x 2 heads
  assert kernel["flops"] == 2 * 4 * tiles * 256 * 4 * 16 and kernel["hash_ops"] > 9
  assert gpu_offline.flash_vector_seconds(kernel, hlo_kernels.GPUS["h100"]) > 0


def test_thunk_census_counts_command_buffers_loops_and_every_kernel():
  hlo = (DATA / "h100_scan_grad_graphs.hlo").read_text()
  sequence, metadata = ((DATA / f"h100_scan_grad_graphs.{suffix}").read_text()
                        for suffix in ("thunks", "thunk_metadata"))
  counts = thunk_census.count(sequence, metadata, hlo)
  # the forward and the backward scans, 3 trips each: every kernel the HLO census counts, fewer host launches
  assert counts["kernels"] == sum(k["count"] for k in hlo_kernels.kernels(hlo)) == 65
  assert counts["loop_iterations"] == 6 and counts["graphs"] > 0
  assert counts["host_launches"] == counts["kernels"] - counts["graph_kernels"] + counts["graphs"] < counts["kernels"]
  without_graphs = "\n".join(line for line in sequence.splitlines() if "kCommandBuffer" not in line)
  assert thunk_census.count(without_graphs.replace("\n    ", "\n"), metadata, hlo)["graphs"] == 0


def test_hash_ops_are_counted_from_the_kernel_s_traced_hash():
  spec = flash_dropout._cached_spec((2, 256, 2, 64), 256, None, 0.2, flash_dropout.BLOCKS[9], 2)
  vectors = gpu_offline.hash_ops(flash_dropout, spec)
  assert 10 <= vectors < 11  # one mix32 (9 ops) and a compare per element, the row and column halves amortised

  class PerElement:  # the kernel's first form: three mix32 on the whole tile
    @staticmethod
    def _keep(spec, seeds, b, n, q0, k0, rows, cols):
      row = jax.lax.broadcasted_iota(jnp.uint32, (rows, cols), 0) + q0.astype(jnp.uint32)
      col = jax.lax.broadcasted_iota(jnp.uint32, (rows, cols), 1) + k0.astype(jnp.uint32)
      mix = flash_dropout.mix32
      return mix(mix(col ^ seeds[0]) ^ mix(row ^ seeds[1])) < spec.threshold

  assert gpu_offline.hash_ops(PerElement, spec) > 3 * 9


def _rows(points, step):
  """Offline rows of made-up programs (roofline seconds, launches) and their measured steps."""
  return [dict(preset=str(i), device="h200", measured_s=step(r, n), kernels=dict(launches_per_step=n),
               thunks=dict(host_launches=n / 2), estimate=dict(h200=dict(roofline_s=r))) for i, (r, n) in
          enumerate(points)]


def test_calibration_recovers_a_launch_cost_and_reports_each_point_left_out():
  points = [(0.15, 6000), (0.16, 5700), (0.05, 2200), (0.045, 2300)]
  exact = gpu_calibration.fit(gpu_calibration.MODEL, _rows(points, lambda r, n: r + 8e-6 * n))
  assert exact["launch_s"] == pytest.approx(8e-6) and exact["scale"] == 1.0
  assert all(abs(p["loo_error"]) < 1e-9 for p in exact["points"])
  scaled = gpu_calibration.fit(gpu_calibration.ALTERNATIVES[1], _rows(points, lambda r, n: 1.2 * r + 5e-6 * n))
  assert scaled["scale"] == pytest.approx(1.2) and scaled["launch_s"] == pytest.approx(5e-6)
  noisy = gpu_calibration.fit(gpu_calibration.MODEL, _rows(points, lambda r, n: (r + 8e-6 * n) * (1 + r)))
  assert noisy["worst_loo_error"] > max(abs(p["error"]) for p in noisy["points"]) > 0


def test_the_committed_calibration_fits_each_measured_step_within_15_percent_left_out():
  fits = gpu_calibration.calibrate()
  assert len(fits["model"]["points"]) == len(gpu_calibration.POINTS)
  for fit in [fits["model"], *fits["alternatives"]]:
    assert fit["worst_loo_error"] < 0.15, fit["name"]
  assert 1e-6 < fits["model"]["launch_s"] < 5e-5


def _row(preset, launches, roofline_s, memory_gib=20):
  classes = {k: dict(seconds=roofline_s / len(hlo_kernels.CLASSES), bytes=1e10, launches=0)
             for k in hlo_kernels.CLASSES}
  return dict(preset=preset, variant="preset", remat_policy="none", scan_unroll=0, memory_bytes=memory_gib * 2**30,
              model_flops=35e12, kernels=dict(launches_per_step=launches), thunks=dict(host_launches=1),
              estimate={g: dict(roofline_s=roofline_s, classes=classes,
                                top=[dict(kind="copy", label="fusion kLoop", source="x", launches=3, bytes=1e9,
                                          seconds=0.005)]) for g in ("h100", "h200")})


def test_summary_calibrates_the_rows_and_sets_before_against_after(tmp_path):
  before = dict(label="before", rows=[_row("", 6000, 0.16)], device_kind="H100", backend="deviceless gpu")
  after = dict(label="", rows=[_row("", 3000, 0.10), _row("dynamic", 1100, 0.04), _row("fixed", 1000, 0.04),
                               dict(preset="large", variant="dots", error="XlaRuntimeError: boom")],
               device_kind="NVIDIA H100 80GB HBM3", backend="deviceless gpu", jax="0.12")
  (tmp_path / "gpu_offline.json").write_text(json.dumps([before, after]))
  (tmp_path / "gpu_calibration.json").write_text(json.dumps([dict(rows=[
      dict(_row(p, n, r), preset=p) for p, (r, n) in zip(("", "large", "dynamic", "fixed"),
                                                          [(0.16, 6000), (0.17, 5700), (0.06, 2200), (0.05, 2200)])])]))
  fits = gpu_calibration.calibrate(tmp_path)
  launch_s = fits["model"]["launch_s"]
  text = gpu_offline_summary.summary_markdown(after, tmp_path)
  ms = lambda r, n: f"{(r + launch_s * n) * 1e3:.1f}"
  assert f"launch_s = {launch_s * 1e6:.2f} us" in text
  assert f"| enwik8 | 60.0 -> 60.0 | 6,000 (1) -> 3,000 (1) | {ms(0.16, 6000)} -> {ms(0.10, 3000)} |" in text
  assert "- enwik8 launches <= 2,000: 3,000.0 (missed)" in text and "| large | dots | XlaRuntimeError: boom" in text
  assert "- dynamic within 1.1x of fixed, launches: 1.10x (met)" in text
  host, scaled = fits["alternatives"]  # the other fits' estimates close each row: the estimate's spread
  by_host, by_scaled = 0.10 + host["launch_s"] * 1, scaled["scale"] * 0.10 + scaled["launch_s"] * 3000
  other = f"{by_host * 1e3:.1f} / {by_scaled * 1e3:.1f}"
  assert any(line.startswith("| enwik8 | none | 0 |") and line.endswith(f"| {other} |") for line in text.splitlines())
  assert gpu_offline_summary.latest_summary(tmp_path).startswith("Compiled for NVIDIA H100 80GB HBM3")


def test_the_before_after_table_takes_each_preset_s_own_program_over_its_variants():
  scanned = dict(_row("", 6000, 0.16), variant="scanned", scan_unroll=1)
  dots = dict(_row("", 3500, 0.11), variant="dots", remat_policy="dots_saveable")
  rows = gpu_offline_summary.default_rows(dict(rows=[scanned, dots, _row("", 3000, 0.10), _row("fixed", 900, 0.04)]))
  assert list(rows) == ["enwik8", "fixed"] and rows["enwik8"]["variant"] == "preset"
  others = gpu_offline_summary.default_rows(dict(rows=[dots, scanned]))  # no "preset" row: the first in order
  assert others["enwik8"]["variant"] == "dots"


def test_saved_hlo_is_read_back_and_a_row_not_saved_is_named(tmp_path):
  facts = dict(memory_bytes=3 * 2**30, cost_bytes=1e9)
  gpu_offline.save_hlo(tmp_path / "hlo", "large", "preset", "HloModule m", "thunks", "metadata", facts)
  assert gpu_offline.load_saved(tmp_path / "hlo", "large", "preset") == ("HloModule m", "thunks", "metadata", facts)
  assert gpu_offline.load_saved(tmp_path / "hlo", "", "preset") is None
  assert not [p.name for p in (tmp_path / "hlo").iterdir() if p.name.startswith(".")]  # no temporary left


def test_unknown_presets_and_a_missing_plugin_are_named(monkeypatch, capsys):
  with pytest.raises(SystemExit):
    gpu_offline.parse_args(["--presets", "enwik9"])
  assert "enwik9" in capsys.readouterr().err
  monkeypatch.setattr(gpu_offline, "cuda_plugin", lambda: None)
  with pytest.raises(SystemExit):
    gpu_offline.parse_args(["--backend", "gpu"])
  assert "jax-cuda12-plugin" in capsys.readouterr().err


@pytest.mark.slow  # one tiny train step compiled for the CPU: about 30 s on 2 cores
def test_dry_run_falls_back_to_the_cpu_and_writes_the_estimates(tmp_path):
  record = gpu_offline.main(["--dry-run", "--backend", "cpu", "--presets", "fixed", "--variants", "none",
                             "--results", str(tmp_path)])
  [row] = record["rows"]
  assert record["backend"] == "cpu fallback" and row["memory_bytes"] > 0, row
  assert row["kernels"]["launches_per_step"] > 0 and row["estimate"]["h100"]["roofline_s"] > 0
  assert row["estimate"]["h100"]["classes"]["matmul"]["flops"] > 0
  saved = json.loads((tmp_path / "gpu_offline_dry_run.json").read_text())[-1]
  assert saved["rows"][0]["preset"] == "fixed"
  assert "| fixed | none |" in (tmp_path / "gpu_offline_dry_run.md").read_text()
