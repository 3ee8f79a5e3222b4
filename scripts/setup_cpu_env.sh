#!/usr/bin/env bash
# Create (or update) the CPU test venvs of this repo, one per supported SGLang version (both
# git-ignored): .venv (sglang 0.5.16) and .venv23 (sglang 0.5.23). Each gets torch 2.14.1 +
# torchvision 0.29.1, sglang with --no-deps and the pinned small dependencies of
# scripts/cpu_requirements.txt (the same set serves both versions), then this project in editable
# mode. No GPU needed. Used by .ci/run and by README.md ("Run the tests").
#
# Usage: bash scripts/setup_cpu_env.sh
# Env:   SGLANG_VERSION  one of 0.5.16, 0.5.23, or "all" (default: all = both venvs)
#        PYTHON          interpreter for the venvs (default: python3; must be 3.10+, CI uses 3.11)
#        VENV            venv directory; only with a single SGLANG_VERSION
#                        (default: <repo>/.venv for 0.5.16, <repo>/.venv23 for 0.5.23)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
SGLANG_VERSION=${SGLANG_VERSION:-all}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"setup_cpu_env.sh: need Python >= 3.10, got {sys.version.split()[0]}")
PY

venv_for() {  # the default venv of an SGLang version
  case "$1" in
    0.5.16) echo "$ROOT/.venv" ;;
    0.5.23) echo "$ROOT/.venv23" ;;
    *) echo "setup_cpu_env.sh: unsupported SGLANG_VERSION '$1' (0.5.16, 0.5.23 or all)" >&2; return 1 ;;
  esac
}

setup_one() {  # setup_one <sglang version> <venv dir>
  local version=$1 venv=$2
  if [ ! -x "$venv/bin/python" ]; then
    echo "[setup $version] creating $venv with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$venv"
  fi
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  echo "[setup $version] torch, torchvision and pinned CPU dependencies"
  "${pip[@]}" install -q torch==2.14.1 torchvision==0.29.1 -r scripts/cpu_requirements.txt
  echo "[setup $version] sglang $version (--no-deps)"
  "${pip[@]}" install -q --no-deps "sglang==$version"
  echo "[setup $version] this project (editable, --no-deps --no-build-isolation)"
  "${pip[@]}" install -q --no-deps --no-build-isolation -e .

  # The plugin must be discoverable the way sglang discovers it, next to the right sglang.
  EXPECT="$version" "$venv/bin/python" - <<'PY'
import os
from importlib.metadata import entry_points, version
eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "verify_cuda_graph"]
assert eps, "entry point sglang.srt.plugins:verify_cuda_graph is not visible"
assert version("sglang") == os.environ["EXPECT"], (version("sglang"), os.environ["EXPECT"])
print(f"[setup {version('sglang')}] ok: sglang {version('sglang')}, torch {version('torch')}, "
      f"entry point {eps[0].value}")
PY
}

if [ "$SGLANG_VERSION" = all ]; then
  if [ -n "${VENV:-}" ]; then
    echo "setup_cpu_env.sh: VENV needs a single SGLANG_VERSION (0.5.16 or 0.5.23)" >&2
    exit 2
  fi
  for v in 0.5.16 0.5.23; do
    setup_one "$v" "$(venv_for "$v")"
  done
else
  setup_one "$SGLANG_VERSION" "${VENV:-$(venv_for "$SGLANG_VERSION")}"
fi
