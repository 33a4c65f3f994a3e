#!/usr/bin/env bash
# Builds .venv-peer: lucidrains' hourglass-transformer-pytorch on the CPU build of torch (the peer of
# benchmarks/peer_compare.py). Nothing fetched is committed: the package lives in the gitignored venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-peer
# The interpreter behind .venv (any Python torch supports would do), else python3.
PYTHON=${PYTHON:-$(.venv/bin/python -c 'import sys; print(sys.base_prefix + "/bin/python3")' 2>/dev/null || echo python3)}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
if ! "$VENV/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu; then
  echo "setup_peer: the PyTorch CPU index is unreachable; installing torch from the default index" >&2
  "$VENV/bin/pip" install -q torch
fi
"$VENV/bin/pip" install -q hourglass-transformer-pytorch==0.0.6 numpy
"$VENV/bin/python" -c "import torch, hourglass_transformer_pytorch as h; print('peer ready: torch', torch.__version__)"
