#!/usr/bin/env bash
# Create (or update) the CPU test venvs of this repo, one per supported SGLang release (all
# git-ignored): .venv (sglang 0.5.16) and .venvN (sglang 0.5.N, e.g. .venv23), the releases being
# those of pyproject.toml's sglang range. .venv gets torch 2.14.1 + torchvision 0.29.1, sglang with
# --no-deps and the pinned small dependencies of scripts/cpu_requirements.txt, then this project in
# editable mode. Every other venv is layered on .venv: a `_verify_graph_base.pth` file puts .venv's
# site-packages after its own, so it holds only its sglang (--no-deps) and this project, and torch
# (~6 GB with its CUDA libraries) is installed once (the same dependency set serves every release).
# pip runs with --no-cache-dir: nothing is downloaded twice, so a cache would only take disk (a CI
# run once died with "No space left on device"). No GPU needed. Used by .ci/run and by README.md.
#
# Usage: bash scripts/setup_cpu_env.sh
# Env:   SGLANG_VERSION  one supported release (0.5.16 ... 0.5.23), or "all" (default: every one)
#        PYTHON          interpreter for the venvs (default: python3; must be 3.10+, CI uses 3.11)
#        VENV            venv directory; only with a single SGLANG_VERSION
#                        (default: <repo>/.venv for 0.5.16, <repo>/.venvN for 0.5.N)
#        BASE_VENV       venv the later releases layer on (default: <repo>/.venv, built first when
#                        missing); BASE_VENV=none gives the venv its own full install
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

VERSIONS=$(bash "$ROOT/scripts/sglang_versions.sh")  # the supported releases, oldest first
FIRST=${VERSIONS%% *}

venv_for() {  # the default venv of an SGLang release
  bash "$ROOT/scripts/sglang_versions.sh" --venv "$1"
}

site_packages() {  # site_packages <venv>: its purelib directory
  "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

check_one() {  # check_one <sglang version> <venv>: the plugin is visible next to the right sglang
  EXPECT="$1" "$2/bin/python" - <<'PY'
import os
from importlib.metadata import entry_points, version
eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "verify_cuda_graph"]
assert eps, "entry point sglang.srt.plugins:verify_cuda_graph is not visible"
assert version("sglang") == os.environ["EXPECT"], (version("sglang"), os.environ["EXPECT"])
import sglang
assert sglang.__version__ == os.environ["EXPECT"], (sglang.__file__, sglang.__version__)
print(f"[setup {version('sglang')}] ok: sglang {version('sglang')} ({os.path.dirname(sglang.__file__)}), "
      f"torch {version('torch')}, entry point {eps[0].value}")
PY
}

setup_one() {  # setup_one <sglang version> <venv dir> [base venv to layer on]
  local version=$1 venv=$2 base=${3:-}
  if [ ! -x "$venv/bin/python" ]; then
    echo "[setup $version] creating $venv with $("$PYTHON" --version 2>&1)"
    # Layered: no pip/setuptools of its own (the venv's bundled setuptools would shadow the
    # base's, which the editable build below needs); pip and setuptools come from the base.
    "$PYTHON" -m venv ${base:+--without-pip} "$venv"
  fi
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
  if [ -n "$base" ]; then
    echo "[setup $version] layered on $base (torch and the pinned dependencies come from there)"
    site_packages "$base" > "$(site_packages "$venv")/_verify_graph_base.pth"
  else
    echo "[setup $version] torch, torchvision and pinned CPU dependencies"
    "${pip[@]}" install -q torch==2.14.1 torchvision==0.29.1 -r scripts/cpu_requirements.txt
  fi
  echo "[setup $version] sglang $version (--no-deps)"
  # Layered: pip sees the base's sglang and leaves it alone ("outside environment").
  "${pip[@]}" install -q --no-deps "sglang==$version"
  echo "[setup $version] this project (editable, --no-deps --no-build-isolation)"
  "${pip[@]}" install -q --no-deps --no-build-isolation -e .
  check_one "$version" "$venv"
}

setup_layered() {  # setup_layered <version> <venv>: layered on BASE_VENV unless BASE_VENV=none
  local base=${BASE_VENV:-$ROOT/.venv}
  if [ "$base" = none ]; then
    setup_one "$1" "$2"
    return
  fi
  if ! { [ -x "$base/bin/python" ] && "$base/bin/python" -c "import torch" 2>/dev/null; }; then
    setup_one "$FIRST" "$base"
  fi
  setup_one "$1" "$2" "$base"
}

setup_version() {  # setup_version <version> <venv>
  if [ "$1" = "$FIRST" ]; then setup_one "$1" "$2"; else setup_layered "$1" "$2"; fi
}

if [ "$SGLANG_VERSION" = all ]; then
  if [ -n "${VENV:-}" ]; then
    echo "setup_cpu_env.sh: VENV needs a single SGLANG_VERSION (one of: $VERSIONS)" >&2
    exit 2
  fi
  for v in $VERSIONS; do setup_version "$v" "$(venv_for "$v")"; done
else
  default=$(venv_for "$SGLANG_VERSION") || exit 2
  setup_version "$SGLANG_VERSION" "${VENV:-$default}"
fi
