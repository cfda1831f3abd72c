#!/usr/bin/env bash
# Set up a virtual environment with the CPU build of torch and this package (+ dev extras).
# Usage: bash scripts/setup.sh [venv-dir]   (default: .venv)
# GPU users: install a CUDA build of torch first (see README "GPU install"), then run this;
# pip keeps the torch already installed because 2.13.0 satisfies the package's requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# pip, quietly: show its output only when it fails (local mirrors print harmless location warnings).
pip_q() {
  local log
  log=$(mktemp)
  if ! "$PY" -m pip install -q "$@" >"$log" 2>&1; then cat "$log" >&2; rm -f "$log"; return 1; fi
  rm -f "$log"
}
# Pin torch first: an unpinned torch would pull several GB of CUDA packages on a CPU machine.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  pip_q "torch==2.13.0"
fi
pip_q -e ".[dev]"
echo "environment ready: $VENV"
