#!/usr/bin/env bash
# Create (or update) the CPU test venv of this repo: .venv (git-ignored) with
# torch 2.14.1 + torchvision 0.29.1, sglang 0.5.16 (--no-deps) and the pinned small
# dependencies of scripts/cpu_requirements.txt, then this project in editable mode.
# No GPU needed. Used by .ci/run and by README.md ("Run the tests").
#
# Usage: bash scripts/setup_cpu_env.sh
# Env:   PYTHON  interpreter for the venv (default: python3; must be 3.10+, CI uses 3.11)
#        VENV    venv directory (default: <repo>/.venv)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
VENV=${VENV:-$ROOT/.venv}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"setup_cpu_env.sh: need Python >= 3.10, got {sys.version.split()[0]}")
PY

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

echo "[setup] torch, torchvision and pinned CPU dependencies"
"${PIP[@]}" install -q torch==2.14.1 torchvision==0.29.1 -r scripts/cpu_requirements.txt
echo "[setup] sglang 0.5.16 (--no-deps)"
"${PIP[@]}" install -q --no-deps sglang==0.5.16
echo "[setup] this project (editable, --no-deps --no-build-isolation)"
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .

# The plugin must be discoverable the way sglang discovers it.
"$VENV/bin/python" - <<'PY'
from importlib.metadata import entry_points, version
eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "verify_cuda_graph"]
assert eps, "entry point sglang.srt.plugins:verify_cuda_graph is not visible"
print(f"[setup] ok: sglang {version('sglang')}, torch {version('torch')}, "
      f"entry point {eps[0].value}")
PY
