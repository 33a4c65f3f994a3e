"""Scale-out on localhost, verified multi-process. 2 processes started as SLURM tasks (through launch/slurm_task.sh;
jax.distributed finds coordinator, count and rank in the SLURM_* variables) with 2 CPU devices each get SIGTERM
mid-run, as SLURM's --signal=TERM sends it, and save the same step; 4 processes with an explicit coordinator and 1
device each are SIGKILLed two steps after a checkpoint. Both resume and match one process step for step, the
repeated steps included, and each process feeds its own disjoint block of every batch."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from hourglass_jax.train.loop import train_and_evaluate
from tests import scale_out_probe
from tests.train_util import command_env, quiet, tiny_config, train_command

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, EVERY, PAUSE = 8, 4, 6  # the first attempt checkpoints step 4, stops after step 6 and is killed there


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _trainer_args(workdir, probe: dict) -> list[str]:
  """hourglass-train's flags (the shared FLAGS of train_util) after `python`, with the probe installed first."""
  command = train_command(workdir, f"--config.train.steps={STEPS}", f"--config.checkpoint.every_steps={EVERY}")
  code = (f"from tests.scale_out_probe import install; install({str(workdir / 'probe')!r}, **{probe!r}); "
          "from hourglass_jax.main import train_entry; train_entry()")
  return ["-c", code, *command[3:]]


def _slurm_tasks(workdir, probe, tasks: int = 2, devices: int = 2):
  """`tasks` SLURM tasks on one node, each through launch/slurm_task.sh in per-GPU mode."""
  port = _free_port()
  for rank in range(tasks):
    env = dict(command_env(devices), HOURGLASS_TRAIN=sys.executable, SLURM_JOB_ID="4242",
               SLURM_STEP_NODELIST="localhost", SLURM_NTASKS=str(tasks), SLURM_PROCID=str(rank),
               SLURM_LOCALID=str(rank), JAX_COORDINATOR_PORT=str(port), CUDA_VISIBLE_DEVICES="0,1")
    yield ["bash", str(REPO / "launch" / "slurm_task.sh"), "gpu", *_trainer_args(workdir, probe)], env


def _coordinated(workdir, probe, processes: int = 4, devices: int = 1):
  port = _free_port()
  for rank in range(processes):
    flags = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={rank}"]
    yield [sys.executable, *_trainer_args(workdir, probe), *flags], command_env(devices)


def _start(launch, workdir, attempt: str, **probe) -> list[subprocess.Popen]:
  """Starts the processes, their output in files (a full pipe would block a process while the test polls)."""
  processes = []
  for rank, (command, env) in enumerate(launch(workdir, probe)):
    out = workdir / f"{attempt}-{rank}"
    with open(f"{out}.out", "w") as stdout, open(f"{out}.err", "w") as stderr:
      processes.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, start_new_session=True))
  return processes


def _stop(processes, workdir, attempt: str, timeout: float = 0) -> list[tuple[str, str]]:
  """Waits up to `timeout` seconds, SIGKILLs all that still run at once (each with its session: the task script's
  python), and returns each process's (stdout, stderr)."""
  deadline = time.monotonic() + timeout
  for p in processes:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      break
  for p in processes:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGKILL)
  for p in processes:
    p.wait()
  return [((workdir / f"{attempt}-{rank}.out").read_text(), (workdir / f"{attempt}-{rank}.err").read_text())
          for rank in range(len(processes))]


def _probe(workdir, rank: int) -> pathlib.Path:
  return workdir / "probe" / f"probe-{rank}.txt"


def _wait(processes, ready, seconds: float = 400) -> None:
  deadline = time.monotonic() + seconds
  while not ready() and time.monotonic() < deadline and all(p.poll() is None for p in processes):
    time.sleep(0.05)


def _sigkill_two_steps_after_checkpoint(launch, workdir) -> int:
  processes = _start(launch, workdir, "first", pause_after=PAUSE)

  def ready() -> bool:
    return (workdir / "checkpoints" / str(EVERY)).is_dir() and all(
        scale_out_probe.paused(_probe(workdir, rank)) for rank in range(len(processes)))
  try:
    _wait(processes, ready)
    running = [p.poll() is None for p in processes]
  finally:
    outputs = _stop(processes, workdir, "first")  # the others may abort on their own once process 0 is gone
  assert ready() and all(running), outputs[0][1][-3000:]
  return EVERY


def _sigterm_mid_run(launch, workdir) -> int:
  processes = _start(launch, workdir, "first", slow_after=EVERY + 1)
  try:
    _wait(processes, lambda: scale_out_probe.last_step(_probe(workdir, 0)) > EVERY)
    for p in processes:
      p.send_signal(signal.SIGTERM)
    outputs = _stop(processes, workdir, "first", timeout=120)
  finally:
    _stop(processes, workdir, "first")
  assert all(p.returncode == 0 for p in processes), outputs[0][1][-3000:]
  saved = [int(n) for n in re.findall(r"SIGTERM/preemption: saved checkpoint step (\d+)", outputs[0][0])]
  assert len(saved) == 1 and EVERY < saved[0] < STEPS, outputs[0][0]
  assert scale_out_probe.last_step(_probe(workdir, 1)) == saved[0]  # every process stopped at that step
  return saved[0]


def _resume(launch, workdir, start: int) -> None:
  processes = _start(launch, workdir, "resumed")
  try:
    outputs = _stop(processes, workdir, "resumed", timeout=400)
  finally:
    _stop(processes, workdir, "resumed")
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  assert f"resuming from step {start}" in outputs[0][0]
  assert f"devices: 4 x cpu in {len(processes)} process(es)" in outputs[0][0]
  assert "bits/byte" not in outputs[1][0]  # only process 0 reports
  assert (workdir / "checkpoints" / str(STEPS)).is_dir()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One process on 8 devices: the loss of every step and the rows of the first batches."""
  workdir = tmp_path_factory.mktemp("one")
  with pytest.MonkeyPatch.context() as patch:
    scale_out_probe.install(workdir / "probe", set_attribute=patch.setattr)
    summary = train_and_evaluate(tiny_config(steps=STEPS), workdir, log=quiet)
  batches, _ = scale_out_probe.read(workdir / "probe" / "probe-0.txt")
  return summary["losses"], batches


def _check_against(reference, workdir, processes: int, repeated: range) -> None:
  losses_one, batches_one = reference
  probes = [scale_out_probe.read(_probe(workdir, rank)) for rank in range(processes)]
  losses = probes[0][1]
  assert {step: len(attempts) for step, attempts in losses.items()} == {
      step: 2 if step in repeated else 1 for step in range(1, STEPS + 1)}
  for step, attempts in losses.items():
    np.testing.assert_allclose(attempts, losses_one[step], atol=2e-4, err_msg=f"step {step}")
  for step in range(EVERY + 1):  # the first attempt's batches, each split over the processes
    blocks = [batches[step] for batches, _ in probes]
    assert [h for block in blocks for h in block] == batches_one[step]  # process p feeds block p, in order
    assert len({h for block in blocks for h in block}) == sum(map(len, blocks))  # disjoint


def test_two_slurm_tasks_stopped_by_sigterm_resume_and_match_one_process(reference, tmp_path):
  saved = _sigterm_mid_run(_slurm_tasks, tmp_path)
  _resume(_slurm_tasks, tmp_path, saved)
  _check_against(reference, tmp_path, processes=2, repeated=range(0))


def test_four_processes_killed_resume_and_match_one_process(reference, tmp_path):
  saved = _sigkill_two_steps_after_checkpoint(_coordinated, tmp_path)
  _resume(_coordinated, tmp_path, saved)
  _check_against(reference, tmp_path, processes=4, repeated=range(EVERY + 1, PAUSE + 1))  # steps 5, 6 ran again
