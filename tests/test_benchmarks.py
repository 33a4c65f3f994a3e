"""The benchmark scripts work end to end at tiny sizes (no timing is asserted: this machine is shared)."""

import importlib.util
import json
import sys

import pytest

from benchmarks import common, dynamic_decode, dynamic_step, learning, throughput
from benchmarks.peer_compare import Worker
from hourglass_jax.model.hourglass import BOUNDARY_PREDICTORS

TINY = "d_model=32,num_heads=4,d_ff=64,dropout=0.0"


def test_throughput_records_costs_timings_and_plot(tmp_path):
  record = throughput.main(["--presets", "vanilla", "--lengths", "16", "--dtypes", "float32", "--model",
                            TINY + ",hierarchy=1@1", "--rounds", "1", "--results", str(tmp_path)]
                           + ([] if importlib.util.find_spec("matplotlib") else ["--no_plot"]))
  (row,) = record["rows"]
  assert row["model_flops"] > 0 and row["xla_flops"] > 0 and row["memory_bytes"] > 0
  assert row["step_s"] > 0 and 0 < row["mfu_vs_f32"]
  assert record["peaks"]["float32"] > 0 and record["peaks"]["bfloat16"] > 0
  runs = json.loads((tmp_path / "throughput.json").read_text())
  assert runs[-1]["machine"]["loadavg"] and runs[-1]["machine"]["cores"]
  if importlib.util.find_spec("matplotlib"):  # the `bench` extra
    assert (tmp_path / "throughput_cost_curves.png").stat().st_size > 0


@pytest.mark.slow
def test_dynamic_step_benchmark_times_each_predictor_against_the_fixed_level(tmp_path):
  record = dynamic_step.main(["--rounds", "1", "--capacities", "1.0", "--model", TINY + ",hierarchy=1@1 1@4 1@1",
                              "--seq_len", "16", "--batch", "2", "--results", str(tmp_path)])
  assert set(record["rows"]) == {"fixed_avg_k4", *(f"dynamic_{p}_capacity1" for p in BOUNDARY_PREDICTORS)}
  assert record["rows"]["fixed_avg_k4"]["vs_fixed"] == 1.0
  assert all(row["median_step_s"] > 0 for row in record["rows"].values())
  assert json.loads((tmp_path / "dynamic_step.json").read_text())[-1]["load_during"]


@pytest.mark.slow
def test_dynamic_decode_benchmark_matches_the_gumbel_rate_and_times_each_predictor(tmp_path):
  record = dynamic_decode.main(["--rounds", "1", "--batches", "1,2", "--prompt", "8", "--steps", "64", "--model",
                                TINY + ",hierarchy=1@1 1@4 1@1", "--results", str(tmp_path)])
  rows = record["rows"]
  assert set(rows) == {f"{name}_batch{b}" for name in ("fixed_avg_k4", "dynamic_whitespace", "dynamic_gumbel")
                       for b in (1, 2)}
  assert rows["fixed_avg_k4_batch1"]["time_vs_fixed"] == 1.0 and rows["fixed_avg_k4_batch2"]["center_steps"] == 0.25
  assert abs(rows["dynamic_gumbel_batch2"]["boundary_rate"] - 0.25) < 0.05  # the bias was matched to 1/k
  assert rows["dynamic_whitespace_batch2"]["center_steps"] >= rows["dynamic_whitespace_batch2"]["boundary_rate"]
  assert all(row["tokens_per_s"] > 0 for row in rows.values())
  assert json.loads((tmp_path / "dynamic_decode.json").read_text())[-1]["load_during"]


def test_equal_flop_budget_gives_the_cheaper_model_more_steps():
  args = learning.parse_args(["--quick"])
  vanilla, hourglass = (learning.run_config(args, preset, 0) for preset in ("vanilla", "hourglass"))
  budget = args.budget_tflop * 1e12
  for cfg in (vanilla, hourglass):
    assert abs(cfg.train.steps * learning.model_flops(cfg) - budget) <= learning.model_flops(cfg)
  assert hourglass.train.steps > vanilla.train.steps
  assert vanilla.model.d_model == hourglass.model.d_model == 32


def test_peer_driver_speaks_the_worker_protocol():
  serve = ("import sys; sys.path.insert(0, 'benchmarks/peer'); from worker_protocol import serve; "
           "serve(lambda: None, dict(impl='fake'))")
  worker = Worker([sys.executable, "-c", serve], timeout_s=30)
  assert worker.facts == dict(ready=True, impl="fake")
  assert len(worker.time_steps(3)) == 3
  worker.close()
  assert worker.proc.returncode == 0


def test_helpers():
  assert common.parse_overrides("d_model=64,dropout=0.0,dtype=bfloat16") == dict(d_model=64, dropout=0.0,
                                                                                 dtype="bfloat16")
  calls = []
  timed = common.interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2)
  assert calls == ["a", "b", "a", "b"] and len(timed["times"]["a"]) == 2 and len(timed["loads"]) == 2
  assert common.paired_ratios([2.0, 4.0], [1.0, 2.0]) == [2.0, 2.0]
