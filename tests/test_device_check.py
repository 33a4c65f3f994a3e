"""benchmarks/device_check.py: its --dry-run (one tiny train case and one decoding batch, the same code the GPU
battery runs) and the markdown summary that BENCHMARKS.md's GPU section is made from."""

import json
import subprocess
import sys

import pytest

from benchmarks import device_check


@pytest.mark.slow  # the battery at tiny sizes, XLA's backend optimisations off as in the rest of the suite
def test_dry_run_records_a_train_step_and_decoding_and_writes_the_summary(tmp_path):
  record = device_check.main(["--dry-run", "--skip", "tests", "--cases", "fixed", "--decode_batches", "1",
                              "--results", str(tmp_path)])
  [train], [decode] = record["train"], record["decode"]
  assert train["step_s"] > 0 and train["mfu_nominal_peak"] > 0 and train["params"] > 0, train
  assert decode["tokens_per_s"] > 0 and decode["compile_s"] > 0, decode
  profile = record["profile"]["fixed twin"]  # the profile stage: one traced step, its top kernels by time
  assert profile["kernels"] and profile["total_ms"] > 0 and all(k["calls"] > 0 for k in profile["kernels"])
  speculative = record["speculative"]  # plain against the n-gram draft
  assert [r["batch"] for r in speculative] == [1, 16] and all(r["tokens_per_pass"] >= 1 for r in speculative), \
      speculative
  [path] = tmp_path.glob("device_dry_run_*.json")
  assert json.loads(path.read_text())[-1]["train"][0]["name"] == "fixed twin"
  summary = path.with_suffix(".md").read_text()
  assert "| fixed twin | 2 x 48 |" in summary and "Dry run" in summary and "Profile of one step, fixed twin" in summary
  assert "| 16 | " in summary and "tokens/pass" in summary


def test_presets_decoding_and_the_hook_come_before_the_ablations():
  presets, ablations = device_check.split_cases(device_check.DEFAULT_CASES)
  assert presets == list(device_check.PRESET_CASES) and "fixed" in presets
  assert {"attention_flash", "attention_cudnn", "attention_xla", "no_dropout", "remat_dots", "vanilla",
          "untuned_blocks", "rolled"} <= set(ablations)
  rolled = device_check.train_config("", device_check.TRAIN_CASES["rolled"]["model"], False)
  assert rolled.model.scan_unroll == 1 and device_check.train_config("", {}, False).model.scan_unroll == 0
  args = device_check.parse_args(["--dry-run"])
  assert args.tests_s <= 90 and not args.full_tests and args.decode_batches == [1, 2, 4]
  vanilla = device_check.train_config("", device_check.TRAIN_CASES["vanilla"]["model"], False)
  assert (vanilla.model.kind, vanilla.model.hierarchy) == ("vanilla", "34@1")  # 5 + 24 + 5 layers
  remat = device_check.train_config("", {}, False, device_check.TRAIN_CASES["remat_dots"])
  assert remat.model.remat_policy == "dots_saveable"
  small = device_check.train_config("", {}, False, device_check.TRAIN_CASES["attention_xla"])
  assert small.data.batch_size == 8


def test_smoke_tests_name_tests_that_exist():
  # The smoke stage names single test ids: a renamed test or parameter must fail here, not on the lent GPU.
  done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                         *device_check.SMOKE_TESTS], capture_output=True, text=True, cwd=device_check.ROOT)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
  assert all(test_id in done.stdout for test_id in device_check.SMOKE_TESTS)


def test_summary_names_the_device_figures_skips_and_failures():
  record = dict(
      dry_run=False, wall_s=400.0,
      environment=dict(device_kind="NVIDIA H100 80GB HBM3", versions={"jax": "0.12.0"}, peak_measured_bf16=7e14,
                       peak_nominal_bf16=989e12, peak_nominal_source="table"),
      tests=dict(command="-m pytest tests/x.py", timed_out=False, verdict="failed", **device_check.pytest_outcome(
          "FAILED tests/x.py::test_a - boom\n1 failed, 9 passed, 2 skipped in 3.0s")),
      train=[dict(name="large", batch=16, seq_len=2049, params=4.3e8, attention="flash", compile_s=50.0,
                  memory_bytes=40 * 2**30, step_s=0.5, bytes_per_s=65568.0, mfu_measured_peak=0.4,
                  mfu_nominal_peak=0.3, aunet_bytes_per_s_scaled=523255.8),
             dict(name="fixed twin", skipped="out of time")],
      decode=[dict(batch=128, tokens=64, cache=2049, compile_s=9.0, tokens_per_s=12345.0),
              dict(batch=1, tokens=64, cache=2049, error="XlaRuntimeError: oom")],
      profile={"large": dict(source="device", total_ms=210.0, kernels=[dict(name="flash_dropout_dkv", calls=24,
                                                                              ms=63.0, share=0.3)])},
      speculative=[dict(batch=1, skipped="not measured")])
  text = device_check.summary_markdown([record])
  assert "Smoke tests (`-m pytest tests/x.py`): failed;" in text
  assert "Profile of one step, large (device time 210.0 ms): flash_dropout_dkv 30%." in text
  assert "| 1 | not measured | - |" in text
  assert "NVIDIA H100 80GB HBM3" in text and "1 failed, 9 passed, 2 skipped" in text and "tests/x.py::test_a" in text
  assert "| large | 16 x 2049 | 430M | flash | 50.0 | 40.0 | 0.5000 | 65,568 | 40.0% | 30.0% |" in text
  assert "out of time" in text and "523,256" in text and "12,345" in text and "XlaRuntimeError" in text


def test_tests_stage_runs_each_group_in_pytest_and_reads_its_outcome(monkeypatch):
  target = "tests/test_device_check.py::test_summary_names_the_device_figures_skips_and_failures"
  monkeypatch.setattr(device_check, "DRY_TESTS", [("summary", [target]), ("missing", ["tests/no_such_file.py"])])
  args = device_check.parse_args(["--dry-run"])
  outcome = device_check.run_tests(args, device_check.Clock(120.0))
  ok, missing = outcome["groups"]
  assert ok["counts"] == {"passed": 1} and ok["returncode"] == 0, ok["tail"]
  assert missing["returncode"] not in (0, None) and outcome["counts"]["passed"] == 1


def test_latest_summary_takes_the_newest_real_run_and_says_when_there_is_none(tmp_path):
  assert "Not yet measured" in device_check.latest_summary(tmp_path)
  run = lambda time, kind, dry: dict(time=time, dry_run=dry, environment=dict(
      device_kind=kind, versions={}, peak_measured_bf16=1.0, peak_nominal_bf16=1.0, peak_nominal_source="-"))
  (tmp_path / "device_a.json").write_text(json.dumps([run("2026-01-02", "GPU new", False)]))
  (tmp_path / "device_b.json").write_text(json.dumps([run("2026-01-01", "GPU old", False),
                                                      run("2026-01-03", "dry", True)]))
  assert device_check.latest_summary(tmp_path).startswith("Device: GPU new")
