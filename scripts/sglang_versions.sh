#!/usr/bin/env bash
# The SGLang releases this project supports: every 0.5.N in pyproject.toml's dependency range
# sglang>=0.5.A,<0.5.B (the adapter's SUPPORTED_RANGE, which test/cpu/test_sglang_versions.py
# checks against it). Used by setup_cpu_env.sh and run_cpu_tests.sh.
#
# Usage: bash scripts/sglang_versions.sh                  the releases, oldest first, one line
#        bash scripts/sglang_versions.sh --venv RELEASE   its CPU test venv: <repo>/.venv for the
#                                                         oldest, <repo>/.venvN for 0.5.N (exit 2
#                                                         with one line for an unsupported RELEASE)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
range=$(grep -o '"sglang>=0\.5\.[0-9]*,<0\.5\.[0-9]*"' "$ROOT/pyproject.toml") || {
  echo "sglang_versions.sh: no sglang>=0.5.A,<0.5.B dependency in pyproject.toml" >&2; exit 1; }
lo=$(echo "$range" | sed 's/.*>=0\.5\.\([0-9]*\),.*/\1/')
end=$(echo "$range" | sed 's/.*<0\.5\.\([0-9]*\)".*/\1/')
versions=$(seq -f "0.5.%g" -s " " "$lo" "$((end - 1))")
if [ "${1:-}" = --venv ]; then
  case " $versions " in
    *" ${2:-} "*) [ "$2" = "0.5.$lo" ] && echo "$ROOT/.venv" || echo "$ROOT/.venv${2##*.}" ;;
    *) echo "sglang_versions.sh: unsupported SGLANG_VERSION '${2:-}' (one of: $versions; or all)" >&2; exit 2 ;;
  esac
else
  echo "$versions"
fi
