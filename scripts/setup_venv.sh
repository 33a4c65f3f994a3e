#!/usr/bin/env bash
# Creates .venv with Python >= 3.12 and installs the project with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  local candidate version
  for candidate in "${PYTHON:-}" python3.12 python3.13 python3; do
    [[ -n "$candidate" ]] || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then  # pyenv shims answer only for the selected version
    for version in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])' | sort -rV); do
      echo "$(pyenv root)/versions/$version/bin/python3"; return 0
    done
  fi
  return 1
}

if [[ -x .venv/bin/python ]] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  echo "removing .venv: it has no pip (an interrupted set-up?)"
  rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
  python=$(find_python) || { echo "error: need Python >= 3.12 (jax 0.12 requires it); install python3.12 or set PYTHON=/path/to/python3.12" >&2; exit 1; }
  echo "creating .venv with $python ($("$python" --version))"
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"
echo ".venv ready: $(.venv/bin/python --version), jax $(.venv/bin/python -c 'import jax; print(jax.__version__)')"
