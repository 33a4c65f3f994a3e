#!/usr/bin/env bash
# Trains on all (or the chosen) NVIDIA GPUs of this host: one process, one device per GPU, the mesh from the config
# (data=-1 spreads the batch over every GPU). Run with --help.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HERE")"
# shellcheck source=launch/common.sh
source "$HERE/common.sh"

usage() {
  cat <<'EOF'
usage: launch/gpu.sh [flags] [-- hourglass-train flags, e.g. --config.train.steps=1000]

flags (each also read from the environment variable in brackets)
  --config=FILE[:PRESET]  config file [HOURGLASS_CONFIG] (required)
  --workdir=DIR           checkpoints + TensorBoard; rerunning resumes from it [HOURGLASS_WORKDIR] (required)
  --gpus=0,1,...          GPUs to use (CUDA_VISIBLE_DEVICES) [HOURGLASS_GPUS] (default: all)
  --mem-fraction=F        share of each GPU's memory JAX reserves up front [HOURGLASS_MEM_FRACTION] (default 0.90)
  --no-preallocate        allocate on demand instead (slower, but shares the GPU) [HOURGLASS_PREALLOCATE=false]
  --install               first install the project with the [cuda12] extra into .venv
  --dry-run               print the exact commands instead of running them [HOURGLASS_DRY_RUN=1]

example
  launch/gpu.sh --install --config=configs/enwik8.py --workdir=workdirs/enwik8 -- --config.model.dtype=bfloat16
EOF
}

CONFIG="${HOURGLASS_CONFIG:-}"
WORKDIR="${HOURGLASS_WORKDIR:-}"
GPUS="${HOURGLASS_GPUS:-}"
MEM_FRACTION="${HOURGLASS_MEM_FRACTION:-0.90}"
PREALLOCATE="${HOURGLASS_PREALLOCATE:-true}"
INSTALL=0
TRAIN_ARGS=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --config=*) CONFIG="${1#*=}" ;;
    --workdir=*) WORKDIR="${1#*=}" ;;
    --gpus=*) GPUS="${1#*=}" ;;
    --mem-fraction=*) MEM_FRACTION="${1#*=}" ;;
    --no-preallocate) PREALLOCATE=false ;;
    --install) INSTALL=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) unknown_argument "$1" ;;
  esac
  shift
done

require "$CONFIG" "--config / HOURGLASS_CONFIG" "a config file, e.g. configs/enwik8.py or configs/imagenet64.py:pod"
require "$WORKDIR" "--workdir / HOURGLASS_WORKDIR" "a directory for checkpoints and logs, e.g. workdirs/enwik8"
if [[ ! -f "${CONFIG%%:*}" ]]; then
  [[ -f "$REPO/${CONFIG%%:*}" ]] || die "--config=$CONFIG: no such config file (here or in $REPO)"
  CONFIG="$REPO/$CONFIG"
fi
[[ "$MEM_FRACTION" =~ ^(0?\.[0-9]+|1(\.0*)?)$ ]] || die "--mem-fraction=$MEM_FRACTION must be a number in (0, 1]"
[[ "$PREALLOCATE" == true || "$PREALLOCATE" == false ]] \
  || die "HOURGLASS_PREALLOCATE=$PREALLOCATE must be true or false"
[[ -z "$GPUS" || "$GPUS" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--gpus=$GPUS must list GPU indices, e.g. 0,1,2,3"
if [[ "$DRY_RUN" != 1 ]]; then
  command -v nvidia-smi >/dev/null || die "no NVIDIA driver on this host (nvidia-smi not found); launch/gpu.sh \
runs on a machine with NVIDIA GPUs (use hourglass-train directly on CPU)"
fi

if [[ "$INSTALL" == 1 ]]; then
  run bash "$REPO/launch/remote_setup.sh" cuda12
fi
if [[ "$DRY_RUN" != 1 && ! -x "$REPO/.venv/bin/hourglass-train" ]]; then
  die "no $REPO/.venv/bin/hourglass-train; install first: launch/gpu.sh --install ..."
fi

environment=("XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM_FRACTION" "XLA_PYTHON_CLIENT_PREALLOCATE=$PREALLOCATE")
[[ -n "$GPUS" ]] && environment+=("CUDA_VISIBLE_DEVICES=$GPUS")
run env "${environment[@]}" "$REPO/.venv/bin/hourglass-train" "--config=$CONFIG" "--workdir=$WORKDIR" \
  --distributed=off ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
