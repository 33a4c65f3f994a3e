#!/usr/bin/env bash
# The enwik8-shaped train step (configs/enwik8.py, 8 x 2049) on one GPU: float32 against bfloat16, and each
# attention kernel with and without attention-probability dropout; then its 10-layer full-resolution part alone at
# 8 x 2048. BENCHMARKS.md, "On a GPU". About 12 minutes on an H100 (compiles dominate).
#   bash benchmarks/gpu_throughput.sh RESULTS_DIR [BATCH] [PYTHON] [all|hourglass|vanilla]
set -u
out=${1:?usage: gpu_throughput.sh RESULTS_DIR [BATCH] [PYTHON] [all|hourglass|vanilla]}
batch=${2:-8}
python=${3:-python3}
which=${4:-all}
common=(--batch "$batch" --rounds 8 --budget_s 60 --memory_gib 70 --max_step_s 30 --probe_size 8192 --no_plot
        --results "$out" --name gpu_throughput)
run() {
  echo "== $*"
  "$python" benchmarks/throughput.py "${common[@]}" "$@" || echo "FAILED: $*"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [[ $which != vanilla ]]; then
  hg=(--presets hourglass_enwik8 --lengths 2049)
  run "${hg[@]}" --dtypes float32,bfloat16 --model attention_impl=xla  # einsum with dropout, recomputed in backward
  run "${hg[@]}" --dtypes float32,bfloat16                             # 'auto': block attention with its dropout
  run "${hg[@]}" --dtypes bfloat16 --model attention_dropout=0.0,attention_impl=xla
  run "${hg[@]}" --dtypes bfloat16 --model attention_dropout=0.0,attention_impl=block
  run "${hg[@]}" --dtypes bfloat16 --model attention_dropout=0.0      # 'auto': cuDNN, odd lengths padded
  run "${hg[@]}" --dtypes bfloat16 --model dropout=0.0                # no dropout anywhere
fi
if [[ $which != hourglass ]]; then
  va=(--presets vanilla_enwik8 --lengths 2048 --dtypes bfloat16)
  run "${va[@]}" --model dropout=0.0                                  # 'auto': cuDNN
  run "${va[@]}" --model dropout=0.0,attention_impl=block
fi
