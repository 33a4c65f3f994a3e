#!/usr/bin/env bash
# The device battery on a lent GPU (benchmarks/device_check.py): at most about 8 minutes on one H100, then
# benchmarks/results/device_<device>.json and .md. Extra arguments go to device_check.py (e.g. --skip tests).
#   bash benchmarks/device_check.sh [PYTHON] [device_check.py flags]
set -u
cd "$(dirname "$0")/.."
python=${1:-.venv/bin/python}
shift || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"
# The battery stops itself at --budget_s (default 420 s, plus at most one compile); the timeout is the backstop.
XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90} timeout 540 "$python" benchmarks/device_check.py "$@"
