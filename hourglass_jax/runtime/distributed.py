"""Joining a multi-process run (TPU pod, SLURM, MPI, or an explicit coordinator) before JAX touches devices."""

import os

import jax

# Environment variables that mean "this process is one of several" (read by jax's cluster auto-detection).
_CLUSTER_MARKERS = ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NODELIST", "OMPI_MCA_orte_hnp_uri", "PMIX_RANK",
                    "MEGASCALE_COORDINATOR_ADDRESS")


def _multi_host_tpu() -> bool:
  return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def cluster_detected() -> bool:
  """True when the environment describes a multi-process job jax.distributed can configure itself from."""
  return _multi_host_tpu() or any(name in os.environ for name in _CLUSTER_MARKERS)


def initialize(mode: str = "auto", coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Calls `jax.distributed.initialize` when needed; returns whether this is a distributed run.

  mode 'auto': when a coordinator is given or a cluster is detected; 'on': always (jax auto-detects the rest);
  'off': never (a single process).
  """
  if mode not in ("auto", "on", "off"):
    raise ValueError(f"--distributed={mode!r}; choose auto, on or off.")
  if jax.distributed.is_initialized():
    return True
  if mode == "off" or (mode == "auto" and not coordinator_address and not cluster_detected()):
    return False
  jax.distributed.initialize(coordinator_address=coordinator_address or None, num_processes=num_processes,
                             process_id=process_id)
  return True


def barrier(name: str, timeout_s: int = 1800) -> None:
  """Waits until every process reaches `name`. Uses the coordinator's key-value store rather than a device
  collective: CPU collectives (gloo) give up after 30 s, so one process compiling slower than the others
  would otherwise fail the first training step."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed as jax_distributed  # the client has no public accessor yet

  jax_distributed.global_state.client.wait_at_barrier(name, timeout_in_ms=timeout_s * 1000)
