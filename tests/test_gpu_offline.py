"""benchmarks/gpu_offline.py and hlo_kernels.py: the kernel census and roofline of a program XLA compiled for an
H100 without one (tests/data/h100_scan_grad.hlo: the gradient of a 3-layer scanned matmul + GELU stack, compiled
deviceless with the CUDA plugin), the flash kernel's FLOPs, and the CPU fallback end to end."""

import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from benchmarks import gpu_offline, gpu_offline_summary, hlo_kernels
from hourglass_jax.model.layers import causal_mask
from hourglass_jax.ops.flash_dropout import flash_attention

H100_HLO = pathlib.Path(__file__).parent / "data" / "h100_scan_grad.hlo"


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
  assert h100["total"]["seconds"] >= launches * hlo_kernels.LAUNCH_S + max(k["bytes"] for k in kernels) / 3.35e12
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
  assert kernel["flops"] == 2 * 4 * tiles * 256 * 4 * 16 and kernel["dropout"]
  assert gpu_offline.flash_vector_seconds(kernel, hlo_kernels.GPUS["h100"]) > 0


def test_summary_sets_the_estimate_against_the_measured_step():
  row = dict(preset="fixed", variant="none", memory_bytes=20 * 2**30, model_flops=11.2e12,
             kernels=dict(launches_per_step=2228), xla_cost={"flops": 1.8e11, "bytes accessed": 9e10},
             measured_h200_step_s=0.0745, measured_over_estimate_h200=1.9,
             estimate={g: dict(step_s=0.04, top=[dict(kind="copy", label="fusion kLoop", source="x", launches=3,
                                                      bytes=1e9, seconds=0.005)],
                               classes={k: dict(seconds=0.01) for k in hlo_kernels.CLASSES}) for g in ("h100", "h200")})
  text = gpu_offline_summary.summary_markdown(dict(device_kind="NVIDIA H100 80GB HBM3", backend="deviceless gpu",
                                                   jax="0.12", rows=[row, dict(preset="", variant="dots",
                                                                               error="XlaRuntimeError: boom")]))
  assert "| fixed | none | 20.0 | 2,228 | 0.18, 90.0 | 11.20 | 10.0 / 10.0 / 10.0 / 10.0 / 10.0 | 40.0 | 40.0 | " \
         "74.5 (1.90x) |" in text
  assert "| enwik8 | dots | XlaRuntimeError: boom" in text and "| copy | fusion kLoop | `x` | 3 | 1.00 | 5.00 |" in text


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
  assert row["kernels"]["launches_per_step"] > 0 and row["estimate"]["h100"]["step_s"] > 0
  assert row["estimate"]["h100"]["classes"]["matmul"]["flops"] > 0
  saved = json.loads((tmp_path / "gpu_offline_dry_run.json").read_text())[-1]
  assert saved["rows"][0]["preset"] == "fixed"
  assert "| fixed | none |" in (tmp_path / "gpu_offline_dry_run.md").read_text()
