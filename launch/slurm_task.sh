#!/usr/bin/env bash
# One SLURM task of launch/slurm.sbatch: `slurm_task.sh gpu|node HOURGLASS_TRAIN_FLAGS...`. Chooses the GPUs this
# process drives, then runs hourglass-train; jax.distributed.initialize() takes coordinator, process count and rank
# from SLURM_* variables.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MODE="${1:-}"
shift || true

# GPUs this task can see: CUDA_VISIBLE_DEVICES (set by SLURM's GPU binding) or every GPU of the node.
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"
  count="${#visible[@]}"
else
  count="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
fi
[[ "$count" -gt 0 ]] || { echo "error: task ${SLURM_PROCID:-?} on $(hostname) sees no GPU; request them with \
--gres=gpu:N (or --gpus-per-node=N)" >&2; exit 2; }

# JAX_LOCAL_DEVICE_IDS indexes the visible GPUs. Without it, jax would give every SLURM task only GPU
# number SLURM_LOCALID, which is right for one task per GPU that sees all GPUs, and wrong otherwise.
case "$MODE" in
  node)
    [[ "${SLURM_LOCALID:-0}" == 0 ]] || { echo "error: --mode=node runs one process per node, but this is local \
task ${SLURM_LOCALID}; submit with --ntasks-per-node=1" >&2; exit 2; }
    JAX_LOCAL_DEVICE_IDS="$(seq -s, 0 $((count - 1)))" ;;
  gpu) JAX_LOCAL_DEVICE_IDS="$([[ "$count" == 1 ]] && echo 0 || echo "${SLURM_LOCALID:?not inside srun}")" ;;
  *) echo "error: usage: slurm_task.sh gpu|node HOURGLASS_TRAIN_FLAGS..." >&2; exit 2 ;;
esac
[[ "${JAX_LOCAL_DEVICE_IDS##*,}" -lt "$count" ]] || { echo "error: task ${SLURM_PROCID:-?} (local rank \
${SLURM_LOCALID:-?}) on $(hostname) sees only $count GPU(s); use at most one task per GPU (--ntasks-per-node)" >&2
  exit 2; }
export JAX_LOCAL_DEVICE_IDS
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
# HOURGLASS_TRAIN: the trainer program (tests run `python -c ...` through it).
exec "${HOURGLASS_TRAIN:-.venv/bin/hourglass-train}" "$@" --distributed=on
