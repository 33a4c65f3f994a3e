#!/usr/bin/env bash
# Submits launch/slurm.sbatch with the resources for N nodes of G GPUs each, one process per GPU or per node.
# Run with --help.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() {
  cat <<'EOF'
usage: launch/slurm.sh [flags] [-- hourglass-train flags]

flags (each also read from the environment variable in brackets)
  --config=FILE[:PRESET]  config, relative to the repo [HOURGLASS_CONFIG] (required)
  --workdir=DIR           checkpoints + logs on a filesystem every node shares [HOURGLASS_WORKDIR] (required)
  --data-dir=DIR          TFDS data_dir with the prepared datasets [HOURGLASS_DATA_DIR] (optional)
  --nodes=N               nodes [HOURGLASS_NODES] (default 1)
  --gpus-per-node=G       GPUs on each node [HOURGLASS_GPUS_PER_NODE] (required)
  --mode=gpu|node         one process per GPU (default) or one per node driving all its GPUs [HOURGLASS_MODE]
  --partition=P           SLURM partition [HOURGLASS_PARTITION] (optional)
  --account=A             SLURM account [HOURGLASS_ACCOUNT] (optional)
  --time=HH:MM:SS         time limit [HOURGLASS_TIME] (default 24:00:00); the job checkpoints 5 min before it
  --job-name=NAME         [HOURGLASS_JOB_NAME] (default hourglass)
  --sbatch=OPTION         extra sbatch option, repeatable, e.g. --sbatch=--cpus-per-task=8
  --dry-run               print the sbatch command instead of submitting it [HOURGLASS_DRY_RUN=1]

example: 2 nodes x 8 GPUs = 16 processes
  launch/slurm.sh --nodes=2 --gpus-per-node=8 --partition=gpu --config=configs/enwik8.py:pod \
    --workdir=/shared/runs/enwik8
EOF
}

CONFIG="${HOURGLASS_CONFIG:-}"
WORKDIR="${HOURGLASS_WORKDIR:-}"
DATA_DIR="${HOURGLASS_DATA_DIR:-}"
NODES="${HOURGLASS_NODES:-1}"
GPUS="${HOURGLASS_GPUS_PER_NODE:-}"
MODE="${HOURGLASS_MODE:-gpu}"
PARTITION="${HOURGLASS_PARTITION:-}"
ACCOUNT="${HOURGLASS_ACCOUNT:-}"
TIME="${HOURGLASS_TIME:-24:00:00}"
JOB_NAME="${HOURGLASS_JOB_NAME:-hourglass}"
SBATCH_EXTRA=()
TRAIN_ARGS=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --data-dir=*) DATA_DIR="${1#*=}" ;;
    --nodes=*) NODES="${1#*=}" ;;
    --gpus-per-node=*) GPUS="${1#*=}" ;;
    --mode=*) MODE="${1#*=}" ;;
    --partition=*) PARTITION="${1#*=}" ;;
    --account=*) ACCOUNT="${1#*=}" ;;
    --time=*) TIME="${1#*=}" ;;
    --job-name=*) JOB_NAME="${1#*=}" ;;
    --sbatch=*) SBATCH_EXTRA+=("${1#*=}") ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) unknown_argument "$1" ;;
  esac
  shift
done

require "$CONFIG" "--config / HOURGLASS_CONFIG" "a config file relative to the repo, e.g. configs/enwik8.py:pod"
require "$WORKDIR" "--workdir / HOURGLASS_WORKDIR" \
  "a directory on a filesystem all nodes share, e.g. /shared/runs/enwik8"
require "$GPUS" "--gpus-per-node / HOURGLASS_GPUS_PER_NODE" "how many GPUs each node has, e.g. 8"
[[ -f "$REPO/${CONFIG%%:*}" ]] || die "--config=$CONFIG: no file ${CONFIG%%:*} in $REPO"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes=$NODES must be a positive integer"
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node=$GPUS must be a positive integer"
case "$MODE" in
  gpu) TASKS="$GPUS" ;;
  node) TASKS=1 ;;
  *) die "--mode=$MODE; choose gpu (a process per GPU) or node (a process per node)" ;;
esac
[[ "$WORKDIR" == /* || "$WORKDIR" == *://* ]] || WORKDIR="$(pwd)/$WORKDIR"  # every node must resolve it alike

options=("--job-name=$JOB_NAME" "--nodes=$NODES" "--ntasks-per-node=$TASKS" "--gres=gpu:$GPUS" "--time=$TIME"
         "--chdir=$REPO")
[[ -n "$PARTITION" ]] && options+=("--partition=$PARTITION")
[[ -n "$ACCOUNT" ]] && options+=("--account=$ACCOUNT")
options+=(${SBATCH_EXTRA[@]+"${SBATCH_EXTRA[@]}"})
job_args=("--repo=$REPO" "--mode=$MODE" "--config=$CONFIG" "--workdir=$WORKDIR")
[[ -n "$DATA_DIR" ]] && job_args+=("--data-dir=$DATA_DIR")
[[ ${#TRAIN_ARGS[@]} -gt 0 ]] && job_args+=(-- "${TRAIN_ARGS[@]}")
run sbatch "${options[@]}" "$REPO/launch/slurm.sbatch" "${job_args[@]}"
