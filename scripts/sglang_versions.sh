#!/usr/bin/env bash
# Print the SGLang releases this project supports, oldest first, one line, space-separated: every
# 0.5.N in pyproject.toml's dependency range sglang>=0.5.A,<0.5.B (the adapter's SUPPORTED_RANGE,
# which test/cpu/test_sglang_versions.py checks against it). Used by setup_cpu_env.sh and
# run_cpu_tests.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
range=$(grep -o '"sglang>=0\.5\.[0-9]*,<0\.5\.[0-9]*"' "$ROOT/pyproject.toml") || {
  echo "sglang_versions.sh: no sglang>=0.5.A,<0.5.B dependency in pyproject.toml" >&2; exit 1; }
lo=$(echo "$range" | sed 's/.*>=0\.5\.\([0-9]*\),.*/\1/')
end=$(echo "$range" | sed 's/.*<0\.5\.\([0-9]*\)".*/\1/')
seq -f "0.5.%g" -s " " "$lo" "$((end - 1))"
