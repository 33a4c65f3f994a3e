"""The benchmark scripts work end to end at tiny sizes (no timing is asserted: this machine is shared)."""

import importlib.util
import json
import os
import pathlib
import sys

import pytest

from benchmarks import (common, dynamic_decode, dynamic_step, learning, peer_compare, shortening_study, speculative,
                        throughput)
from benchmarks.peer_compare import Worker
from hourglass_jax.model.hourglass import BOUNDARY_PREDICTORS
from hourglass_jax.runtime import host_memory

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
  record = dynamic_decode.main(["--rounds", "1", "--batches", "2", "--prompt", "8", "--steps", "64", "--model",
                                TINY + ",hierarchy=1@1 1@4 1@1", "--results", str(tmp_path)])  # one batch size: the
  rows = record["rows"]                                                 # same code at every size, a compile each
  assert set(rows) == {f"{name}_batch2" for name in ("fixed_avg_k4", "dynamic_whitespace", "dynamic_gumbel")}
  assert rows["fixed_avg_k4_batch2"]["time_vs_fixed"] == 1.0 and rows["fixed_avg_k4_batch2"]["center_steps"] == 0.25
  assert rows["fixed_avg_k4_batch2"]["center_rows"] == 0.25  # every row, once per k steps
  assert rows["dynamic_whitespace_batch2"]["center_rows"] <= rows["dynamic_whitespace_batch2"]["center_steps"]
  assert abs(rows["dynamic_gumbel_batch2"]["boundary_rate"] - 0.25) < 0.05  # the bias was matched to 1/k
  assert rows["dynamic_whitespace_batch2"]["center_steps"] >= rows["dynamic_whitespace_batch2"]["boundary_rate"]
  assert all(row["tokens_per_s"] > 0 for row in rows.values())
  assert json.loads((tmp_path / "dynamic_decode.json").read_text())[-1]["load_during"]


@pytest.mark.slow
def test_speculative_benchmark_trains_its_runs_and_times_plain_against_each_draft(tmp_path):
  record = speculative.main(["--workdirs", str(tmp_path / "runs"), "--steps", "2", "--prose", "", "--batches", "2",
                             "--temperatures", "0", "--new_tokens", "6", "--prompt_bytes", "4", "--rounds", "1",
                             "--drafts", "self,model",
                             "--seq_len", "16", "--model", TINY + ",hierarchy=1@1 1@2 1@1", "--draft_model",
                             "d_model=16", "--pass_cost_batches", "2", "--results", str(tmp_path)])
  (row,) = record["rows"]
  assert row["corpus"] == "code" and row["plain_tokens_per_s"] > 0
  for draft in ("self", "model"):  # each draft is two compiled programs; the device check's dry run times 'ngram'
    assert row[draft]["same_tokens_as_plain"] and 1 <= row[draft]["tokens_per_pass"] <= 5 and row[draft]["speedup"] > 0
  assert [cost["batch"] for cost in record["pass_costs"]] == [2] and record["pass_costs"][0]["pass_over_step"] > 0
  page = (tmp_path / "speculative.md").read_text()
  assert "| code | 2 | 0 |" in page and "| self, batch 1, code: >= 2.0x | - | - |" in page
  assert (tmp_path / "runs" / "code_draft" / "checkpoints").is_dir()


def test_equal_flop_budget_gives_the_cheaper_model_more_steps():
  args = learning.parse_args(["--quick"])
  vanilla, hourglass = (learning.run_config(args, preset, 0) for preset in ("vanilla", "hourglass"))
  budget = args.budget_tflop * 1e12
  for cfg in (vanilla, hourglass):
    assert abs(cfg.train.steps * learning.model_flops(cfg) - budget) <= learning.model_flops(cfg)
  assert hourglass.train.steps > vanilla.train.steps
  assert vanilla.model.d_model == hourglass.model.d_model == 32


def _study_run(args, model, budget, seed, rate, bits, boundary_rate=None):
  metrics = {"body/level1/boundary_rate": boundary_rate,
             "body/level1/segment_overflow": boundary_rate / 10} if boundary_rate is not None else {}
  return dict(key=shortening_study.run_key(args, "corpus", model, budget, seed, rate), corpus_id="corpus",
              model=model, budget_tflop=budget, seed=seed, learning_rate=rate, valid_bits=bits, eval_metrics=metrics)


def test_shortening_study_sweeps_rates_at_the_middle_budget_then_trains_every_budget_at_the_best():
  args = shortening_study.parse_args(["--models", "vanilla,dynamic_gumbel", "--budgets_tflop", "1,4,16",
                                      "--learning_rates", "1e-3,3e-3", "--seeds", "0,1"])
  sweep = shortening_study.planned_runs(args, "corpus", [])
  assert sorted(sweep) == sorted(("sweep", m, 4.0, 0, r) for m in ("vanilla", "dynamic_gumbel") for r in (1e-3, 3e-3))
  runs = [_study_run(args, "vanilla", 4.0, 0, 1e-3, 2.5), _study_run(args, "vanilla", 4.0, 0, 3e-3, 2.4),
          _study_run(args, "dynamic_gumbel", 4.0, 0, 1e-3, 2.3, 0.26),
          _study_run(args, "dynamic_gumbel", 4.0, 0, 3e-3, None)]  # diverged: never chosen
  assert shortening_study.pick_learning_rates(runs, "corpus", 4.0) == {"vanilla": 3e-3, "dynamic_gumbel": 1e-3}
  grid = shortening_study.planned_runs(args, "corpus", runs)
  # 3 budgets x 2 seeds x 2 models, less the two sweep runs at the chosen rate (middle budget, seed 0)
  assert len(grid) == 10 and {stage for stage, *_ in grid} == {"grid"}
  assert {(m, r) for _, m, _, _, r in grid} == {("vanilla", 3e-3), ("dynamic_gumbel", 1e-3)}
  assert ("grid", "vanilla", 4.0, 0, 3e-3) not in grid and ("grid", "vanilla", 4.0, 1, 3e-3) in grid


def test_shortening_study_adding_a_larger_budget_reuses_the_sweep_and_trains_only_the_new_budget():
  assert [shortening_study.sweep_budget(b) for b in ([1.0], [1.0, 4.0], [1.0, 4.0, 16.0], [1.0, 4.0, 16.0, 64.0])] \
      == [1.0, 1.0, 4.0, 4.0]
  finished = shortening_study.parse_args(["--models", "fixed_avg", "--budgets_tflop", "1,4,16",
                                          "--learning_rates", "1e-3,3e-3", "--seeds", "0"])
  runs = [_study_run(finished, "fixed_avg", 4.0, 0, 1e-3, 2.3), _study_run(finished, "fixed_avg", 4.0, 0, 3e-3, 2.2),
          _study_run(finished, "fixed_avg", 1.0, 0, 3e-3, 3.0), _study_run(finished, "fixed_avg", 16.0, 0, 3e-3, 1.8)]
  assert shortening_study.planned_runs(finished, "corpus", runs) == []
  larger = shortening_study.parse_args(["--models", "fixed_avg", "--budgets_tflop", "1,4,16,64",
                                        "--learning_rates", "1e-3,3e-3", "--seeds", "0"])
  assert shortening_study.planned_runs(larger, "corpus", runs) == [("grid", "fixed_avg", 64.0, 0, 3e-3)]


def test_shortening_study_table_reports_chosen_rates_means_and_the_gap_to_fixed():
  args = shortening_study.parse_args(["--models", "fixed_avg,dynamic_routing", "--budgets_tflop", "1,4,16",
                                      "--learning_rates", "1e-3,3e-3", "--seeds", "0,1"])
  runs = [_study_run(args, "fixed_avg", 4.0, 0, 1e-3, 2.0), _study_run(args, "fixed_avg", 4.0, 0, 3e-3, 2.2),
          _study_run(args, "fixed_avg", 4.0, 1, 1e-3, 2.2), _study_run(args, "fixed_avg", 1.0, 0, 1e-3, 3.0),
          _study_run(args, "dynamic_routing", 4.0, 0, 3e-3, 1.9, 0.24),
          _study_run(args, "dynamic_routing", 4.0, 1, 3e-3, 1.7, 0.26)]
  text = shortening_study.table(runs, "corpus", [1.0, 4.0, 16.0], ["fixed_avg", "dynamic_routing"])
  assert "| fixed_avg | 0.001 | 3.000 (1) | 2.100 (2) |  |  |  |" in text  # the 3e-3 sweep run is not averaged in
  assert "| dynamic_routing | 0.003 |  | 1.800 (2) |  | 0.250 | 0.025 |" in text
  assert "4 TFLOP: best learned dynamic_routing 1.800; fixed_avg +0.300" in text


def test_shortening_study_keeps_each_segment_capacity_and_read_rule_apart(tmp_path):
  at = {c: shortening_study.parse_args(["--segment_capacity", str(c)]) for c in (1.0, 1.5)}
  assert shortening_study.run_key(at[1.0], "c", "dynamic_whitespace", 4.0, 0, 3e-3).endswith(
      "|capacity1|read-closing")
  assert shortening_study.run_key(at[1.0], "c", "fixed_avg", 4.0, 0, 3e-3) == \
      shortening_study.run_key(at[1.5], "c", "fixed_avg", 4.0, 0, 3e-3)
  assert "capacity" not in shortening_study.run_key(at[1.5], "c", "dynamic_whitespace", 4.0, 0, 3e-3)  # older runs
  shape = dict(widths=at[1.0].model, batch=at[1.0].batch, seq_len=at[1.0].seq_len)
  # recorded without a read rule: the learned runs of the earlier rule, which the study no longer reads
  runs = [dict(model="fixed_avg", segment_capacity=None, **shape), dict(model="dynamic_gumbel", **shape),
          dict(model="dynamic_gumbel", segment_capacity=1.0, **shape),
          dict(model="dynamic_gumbel", segment_capacity=1.0, segment_read="closing", **shape),
          dict(model="dynamic_gumbel", segment_read="closing", **shape)]
  (tmp_path / "study.json").write_text(json.dumps(runs))
  for slots, kept in ((1.0, [0, 3]), (1.5, [0, 4])):
    assert shortening_study.recorded_runs(at[slots], tmp_path / "study.json") == [runs[i] for i in kept]
  steps = {(c, m): shortening_study.study_config(at[c], m, 4.0, 0, 3e-3).train.steps
           for c in (1.0, 1.5) for m in ("fixed_avg", "dynamic_whitespace")}
  assert steps[1.0, "fixed_avg"] == steps[1.5, "fixed_avg"]
  # at capacity 1 the center has the fixed level's slots (plus the merged tail): within 1% of its steps
  assert steps[1.5, "dynamic_whitespace"] < 0.95 * steps[1.0, "fixed_avg"] <= steps[1.0, "dynamic_whitespace"]


def test_shortening_study_layers_set_every_hierarchy_and_keep_their_runs_apart(tmp_path, capsys):
  default, deep = shortening_study.parse_args([]), shortening_study.parse_args(["--layers", "2,8,2"])
  hierarchies = {(args.layers, m): shortening_study.study_config(args, m, 4.0, 0, 3e-3).model.hierarchy
                 for args in (default, deep) for m in ("vanilla", "fixed_avg", "dynamic_whitespace_code")}
  assert hierarchies == {("2,4,2", "vanilla"): "8@1", ("2,4,2", "fixed_avg"): "2@1 4@4 2@1",
                         ("2,4,2", "dynamic_whitespace_code"): "2@1 4@4 2@1", ("2,8,2", "vanilla"): "12@1",
                         ("2,8,2", "fixed_avg"): "2@1 8@4 2@1", ("2,8,2", "dynamic_whitespace_code"): "2@1 8@4 2@1"}
  assert "layers" not in shortening_study.run_key(default, "c", "fixed_avg", 4.0, 0, 3e-3)  # the recorded keys
  assert shortening_study.run_key(deep, "c", "fixed_avg", 4.0, 0, 3e-3).endswith("|layers2-8-2")
  shape = dict(model="fixed_avg", widths=default.model, batch=default.batch, seq_len=default.seq_len)
  runs = [dict(shape), dict(shape, layers="2,4,2"), dict(shape, layers="2,8,2")]  # the first recorded without
  (tmp_path / "study.json").write_text(json.dumps(runs))
  assert shortening_study.recorded_runs(default, tmp_path / "study.json") == runs[:2]
  assert shortening_study.recorded_runs(deep, tmp_path / "study.json") == runs[2:]
  for bad in ("2,8", "2,0,2", "2,x,2"):
    with pytest.raises(SystemExit):
      shortening_study.parse_args(["--layers", bad])
    assert f"--layers={bad}: give three positive block counts, before,inside,after (e.g. 2,8,2)" in \
        capsys.readouterr().err


def test_shortening_study_report_mentions_unread_runs_of_the_earlier_read_rule_only_when_there_are_some(tmp_path):
  args = shortening_study.parse_args(["--models", "fixed_avg", "--budgets_tflop", "4", "--learning_rates", "3e-3",
                                      "--seeds", "0", "--no_plot", "--results", str(tmp_path)])
  fixed = dict(_study_run(args, "fixed_avg", 4.0, 0, 3e-3, 2.0), corpus="a corpus")
  for runs, mentioned in (([fixed], False), ([fixed, dict(model="dynamic_gumbel")], True)):
    (tmp_path / "shortening_study.json").write_text(json.dumps(runs))
    text = shortening_study.report(args, [fixed], tmp_path).read_text()
    assert "| fixed_avg | 0.003 | 2.000 (1) |" in text
    assert ("earlier rule stay in shortening_study.json, unread" in text) == mentioned


def test_shortening_study_stops_with_a_message_when_training_is_interrupted(monkeypatch):
  monkeypatch.setattr(shortening_study, "train_and_evaluate",
                      lambda cfg, workdir, log: dict(stopped="preempted", step=7, eval=None, losses={}))
  cfg = shortening_study.study_config(shortening_study.parse_args(["--quick"]), "fixed_avg", 0.002, 0, 3e-3)
  with pytest.raises(SystemExit, match="preempted at step 7 of .*not recorded, rerun"):
    shortening_study.train_once(cfg)


@pytest.mark.slow
def test_shortening_study_trains_records_and_resumes(tmp_path):
  argv = ["--quick", "--models", "dynamic_whitespace", "--budgets_tflop", "0.002", "--results", str(tmp_path)]
  argv += [] if importlib.util.find_spec("matplotlib") else ["--no_plot"]
  (run,) = shortening_study.main(argv)
  assert run["valid_bits"] > 0 and run["steps"] * run["flops_per_step"] >= 0.002e12 - run["flops_per_step"]
  assert 0 < shortening_study.boundary_rate(run) < 1
  assert shortening_study.main(argv) == []  # every planned run is recorded: nothing trains again
  assert len(json.loads((tmp_path / "shortening_study_quick.json").read_text())) == 1
  assert "| dynamic_whitespace | 0.003 |" in (tmp_path / "shortening_study_quick.md").read_text()


def test_peer_driver_speaks_the_worker_protocol():
  serve = ("import sys; sys.path.insert(0, 'benchmarks/peer'); from worker_protocol import serve; "
           "serve(lambda: None, dict(impl='fake'))")
  worker = Worker([sys.executable, "-c", serve], timeout_s=30)
  assert worker.facts == dict(ready=True, impl="fake")
  assert len(worker.time_steps(3)) == 3
  worker.close()
  assert worker.proc.returncode == 0


def test_peer_driver_times_each_turn_after_its_settle_steps(tmp_path, monkeypatch):
  requests, envs = [], {}

  class FakeWorker:
    """A worker whose first step of every turn takes 10 s and the rest 1 s (ours) or 2 s (the peer)."""
    def __init__(self, command, timeout_s, env=None):
      self.name = "ours" if "ours_worker.py" in " ".join(command) else "peer"
      envs[self.name] = env
      self.facts = dict(config="fake", params=1, model_flops=1.0, xla_flops=1.0, torch="fake", threads=1)

    def time_steps(self, steps):
      requests.append((self.name, steps))
      return [10.0] + [1.0 if self.name == "ours" else 2.0] * (steps - 1)

    def close(self):
      pass

  monkeypatch.setenv("HOURGLASS_PEER_SHAPE", "default")  # main() sets these for its workers; restored after
  monkeypatch.setenv("HOURGLASS_HOST_MALLOC", "auto")
  monkeypatch.setattr(peer_compare, "Worker", FakeWorker)
  monkeypatch.setattr(peer_compare, "PEER_PYTHON", pathlib.Path(sys.executable))
  record = peer_compare.main(["--rounds", "2", "--steps", "2", "--settle_steps", "1", "--results", str(tmp_path)])
  assert requests == [("ours", 3), ("peer", 3)] * 2
  assert record["step_s"] == {"ours": [1.0, 1.0], "peer": [2.0, 2.0]}  # the 10 s settle steps are not timed
  assert record["settle_step_s"]["ours"] == [[10.0], [10.0]] and record["speed_ratio_median"] == 2.0
  assert envs == {"ours": None, "peer": None}  # both inherit the driver's environment
  peer_compare.main(["--rounds", "1", "--peer_malloc", "keep", "--host_malloc", "system", "--results", str(tmp_path)])
  assert envs["peer"]["GLIBC_TUNABLES"] == host_memory.GLIBC_TUNABLES and envs["ours"] is None
  assert os.environ["HOURGLASS_HOST_MALLOC"] == "system"  # read by ours_worker.py
  with pytest.raises(SystemExit, match="--settle_steps=-1"):
    peer_compare.main(["--settle_steps", "-1", "--results", str(tmp_path)])


def test_peer_driver_with_fresh_workers_ends_each_turns_worker_before_the_others_turn(tmp_path, monkeypatch):
  events = []

  class FakeWorker:
    def __init__(self, command, timeout_s, env=None):
      self.name = "ours" if "ours_worker.py" in " ".join(command) else "peer"
      events.append(("start", self.name))
      self.facts = dict(config="fake", params=1, model_flops=1.0, xla_flops=1.0, torch="fake", threads=1)

    def time_steps(self, steps):
      events.append(("time", self.name))
      return [1.0 if self.name == "ours" else 3.0] * steps

    def close(self):
      events.append(("close", self.name))

  monkeypatch.setenv("HOURGLASS_PEER_SHAPE", "default")
  monkeypatch.setenv("HOURGLASS_HOST_MALLOC", "auto")
  monkeypatch.setattr(peer_compare, "Worker", FakeWorker)
  monkeypatch.setattr(peer_compare, "PEER_PYTHON", pathlib.Path(sys.executable))
  record = peer_compare.main(["--rounds", "2", "--fresh_workers", "--results", str(tmp_path)])
  turn = [("start", "ours"), ("time", "ours"), ("close", "ours"), ("start", "peer"), ("time", "peer"),
          ("close", "peer")]
  assert events == turn * 2 and record["speed_ratio_median"] == 3.0
  events.clear()
  peer_compare.main(["--rounds", "2", "--results", str(tmp_path)])  # kept workers: built once, closed at the end
  assert events == [("start", "ours"), ("start", "peer"), *[("time", "ours"), ("time", "peer")] * 2,
                    ("close", "ours"), ("close", "peer")]


def test_helpers():
  assert common.parse_overrides("d_model=64,dropout=0.0,dtype=bfloat16") == dict(d_model=64, dropout=0.0,
                                                                                 dtype="bfloat16")
  calls = []
  timed = common.interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2)
  assert calls == ["a", "b", "a", "b"] and len(timed["times"]["a"]) == 2 and len(timed["loads"]) == 2
  assert common.paired_ratios([2.0, 4.0], [1.0, 2.0]) == [2.0, 2.0]


def test_results_appended_at_once_from_many_writers_are_all_kept(tmp_path):
  import concurrent.futures
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda i: common.append_result("runs", dict(run=i), tmp_path), range(64)))
  runs = json.loads((tmp_path / "runs.json").read_text())
  assert sorted(r["run"] for r in runs) == list(range(64))
  assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["runs.json"]
