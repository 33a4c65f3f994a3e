#!/usr/bin/env bash
# Installs this checkout into ./.venv on a TPU worker or GPU node: `bash launch/remote_setup.sh tpu|cuda12`.
# jax 0.12 needs Python >= 3.12; TPU VM images ship 3.10, so a missing 3.12 is fetched with uv (no root needed).
# The gcs extra: gcsfs lets Orbax and the JAX compilation cache use gs:// paths; google-cloud-storage, TensorBoard.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EXTRA="${1:-}"
case "$EXTRA" in
  tpu|cuda12) ;;
  *) echo "error: usage: bash launch/remote_setup.sh tpu|cuda12 (the jax extra to install)" >&2; exit 2 ;;
esac

if [[ ! -x .venv/bin/python ]]; then
  python=""
  for candidate in python3.13 python3.12 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
      python="$candidate"
      break
    fi
  done
  if [[ -n "$python" ]]; then
    "$python" -m venv .venv
  else
    export PATH="$HOME/.local/bin:$PATH"
    command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh
    uv venv --seed --python 3.12 .venv
  fi
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$EXTRA,gcs]"
# Only the version: touching the devices of one worker of a pod slice would wait for all the others.
.venv/bin/python -c 'import jax; print("hourglass_jax installed with jax", jax.__version__)'
