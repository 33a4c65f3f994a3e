"""Scale-out on localhost, verified multi-process, in one chain of runs of the tiny config (a checkpoint every 4
steps) that must match one process step for step:
1. 4 processes with an explicit coordinator, 1 CPU device each, are SIGKILLed two steps after checkpoint 4;
2. 2 processes started as SLURM tasks through launch/slurm_task.sh (jax.distributed finds coordinator, count and rank
   in the SLURM_* variables), 2 devices each, resume from step 4 and get SIGTERM mid-run, as SLURM's --signal=TERM
   sends it: every process saves the same step and exits cleanly;
3. the 2 SLURM tasks resume from there and finish.
The repeated steps match too, and in every run each process feeds its own disjoint block of every batch."""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hourglass_jax.train.loop.loop import train_and_evaluate
from hourglass_jax.train.loop.preemption import EXIT_PREEMPTED
from tests import scale_out_probe
from tests.helpers import command_env, free_port, quiet, tiny_config, train_command

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

REPO = pathlib.Path(__file__).resolve().parents[1]
STEPS, EVERY, PAUSE = 10, 4, 6  # run 1 checkpoints step 4, stops after step 6 and is killed there


def _trainer_args(workdir, probe: dict) -> list[str]:
  """hourglass-train's flags (the shared FLAGS of tests/helpers.py) after `python`, with the probe installed first."""
  command = train_command(workdir, f"--config.train.steps={STEPS}", f"--config.checkpoint.every_steps={EVERY}")
  code = (f"from tests.scale_out_probe import install; install({str(workdir / 'probe')!r}, **{probe!r}); "
          "from hourglass_jax.cli.main import train_entry; train_entry()")
  return ["-c", code, *command[3:]]


def _slurm_tasks(workdir, probe, tasks: int = 2, devices: int = 2):
  """`tasks` SLURM tasks on one node, each through launch/slurm_task.sh in per-GPU mode."""
  port = free_port()
  for rank in range(tasks):
    env = dict(command_env(devices), HOURGLASS_TRAIN=sys.executable, SLURM_JOB_ID="4242",
               SLURM_STEP_NODELIST="localhost", SLURM_NTASKS=str(tasks), SLURM_PROCID=str(rank),
               SLURM_LOCALID=str(rank), JAX_COORDINATOR_PORT=str(port), CUDA_VISIBLE_DEVICES="0,1")
    yield ["bash", str(REPO / "launch" / "slurm_task.sh"), "gpu", *_trainer_args(workdir, probe)], env


def _coordinated(workdir, probe, processes: int = 4, devices: int = 1):
  port = free_port()
  for rank in range(processes):
    flags = [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={rank}"]
    yield [sys.executable, *_trainer_args(workdir, probe), *flags], command_env(devices)


def _start(launch, workdir, run: int, **probe) -> list[subprocess.Popen]:
  """Starts the processes, their output in files (a full pipe would block a process while the test polls)."""
  processes = []
  for rank, (command, env) in enumerate(launch(workdir, probe)):
    with open(workdir / f"{run}-{rank}.out", "w") as stdout, open(workdir / f"{run}-{rank}.err", "w") as stderr:
      processes.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, start_new_session=True))
  return processes


def _stop(processes, workdir, run: int, timeout: float = 0) -> list[tuple[str, str]]:
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
  return [((workdir / f"{run}-{rank}.out").read_text(), (workdir / f"{run}-{rank}.err").read_text())
          for rank in range(len(processes))]


def _probe(workdir, rank: int) -> pathlib.Path:
  return workdir / "probe" / f"probe-{rank}.txt"


def _wait(processes, ready, seconds: float = 400) -> None:
  deadline = time.monotonic() + seconds
  while not ready() and time.monotonic() < deadline and all(p.poll() is None for p in processes):
    time.sleep(0.05)


def _sigkill_two_steps_after_checkpoint(launch, workdir) -> None:
  processes = _start(launch, workdir, 1, pause_after=PAUSE)

  def ready() -> bool:
    return (workdir / "checkpoints" / str(EVERY)).is_dir() and all(
        scale_out_probe.paused(_probe(workdir, rank)) for rank in range(len(processes)))
  try:
    _wait(processes, ready)
    running = [p.poll() is None for p in processes]
  finally:
    outputs = _stop(processes, workdir, 1)  # the others may abort on their own once process 0 is gone
  assert ready() and all(running), outputs[0][1][-3000:]


def _resume_then_sigterm(launch, workdir, start: int) -> int:
  processes = _start(launch, workdir, 2, slow_after=PAUSE + 1)
  try:
    _wait(processes, lambda: scale_out_probe.last_step(_probe(workdir, 0)) > PAUSE)
    for p in processes:
      p.send_signal(signal.SIGTERM)
    outputs = _stop(processes, workdir, 2, timeout=120)
  finally:
    _stop(processes, workdir, 2)
  assert all(p.returncode == EXIT_PREEMPTED for p in processes), outputs[0][1][-3000:]
  assert f"resuming from step {start}" in outputs[0][0]
  saved = [int(n) for n in re.findall(r"SIGTERM/preemption: saved checkpoint step (\d+)", outputs[0][0])]
  assert len(saved) == 1 and PAUSE < saved[0] < STEPS, outputs[0][0]
  assert scale_out_probe.last_step(_probe(workdir, 1)) == saved[0]  # every process stopped at that step
  return saved[0]


def _resume_to_the_end(launch, workdir, start: int) -> None:
  processes = _start(launch, workdir, 3)
  try:
    outputs = _stop(processes, workdir, 3, timeout=400)
  finally:
    _stop(processes, workdir, 3)
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  assert f"resuming from step {start}" in outputs[0][0]
  assert f"devices: 4 x cpu in {len(processes)} process(es)" in outputs[0][0]
  assert "bits/byte" not in outputs[1][0]  # only process 0 reports
  assert (workdir / "checkpoints" / str(STEPS)).is_dir()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """One process on 8 devices: the loss and the rows of every step."""
  workdir = tmp_path_factory.mktemp("one")
  with pytest.MonkeyPatch.context() as patch:
    scale_out_probe.install(workdir / "probe", set_attribute=patch.setattr)
    summary = train_and_evaluate(tiny_config(steps=STEPS), workdir, log=quiet)
  (batches,), _ = scale_out_probe.read(_probe(workdir, 0))
  return summary["losses"], batches


def _check_rows(batches_one, probes, run: int, first_step: int, last_step: int) -> None:
  """Run `run`'s batches for steps first..last, split over its processes: process p feeds block p, disjoint."""
  for step in range(first_step, last_step + 1):
    blocks = [attempts[run - 1][step - first_step] for attempts, _ in probes]
    assert [h for block in blocks for h in block] == batches_one[step - 1], f"run {run}, step {step}"
    assert len({h for block in blocks for h in block}) == sum(map(len, blocks))


def test_killed_and_preempted_multiprocess_runs_resume_and_match_one_process(reference, tmp_path):
  _sigkill_two_steps_after_checkpoint(_coordinated, tmp_path)
  saved = _resume_then_sigterm(_slurm_tasks, tmp_path, EVERY)
  _resume_to_the_end(_slurm_tasks, tmp_path, saved)

  losses_one, batches_one = reference
  losses = scale_out_probe.read(_probe(tmp_path, 0))[1]
  assert {step: len(attempts) for step, attempts in losses.items()} == {
      step: 2 if EVERY < step <= PAUSE else 1 for step in range(1, STEPS + 1)}  # steps 5, 6 ran twice
  for step, attempts in losses.items():
    np.testing.assert_allclose(attempts, losses_one[step], atol=2e-4, err_msg=f"step {step}")
  _check_rows(batches_one, [scale_out_probe.read(_probe(tmp_path, rank)) for rank in range(4)], 1, 1, PAUSE)
  two = [scale_out_probe.read(_probe(tmp_path, rank)) for rank in range(2)]
  _check_rows(batches_one, two, 2, EVERY + 1, saved)
  _check_rows(batches_one, two, 3, saved + 1, STEPS)
