#!/usr/bin/env bash
# Run the CPU test tier (no GPU): every test not marked gpu/server/multigpu.
# Needs the venv made by scripts/setup_cpu_env.sh (or set PYTHON to an interpreter that has
# torch, sglang 0.5.16 and this project installed). Extra arguments go to pytest.
# Exit status: pytest's; "no tests collected" (pytest 5) is reported and counts as a failure.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
"$PYTHON" -m pytest -m "not gpu and not server and not multigpu" test "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_cpu_tests.sh: pytest collected no tests (exit 5); treating as failure" >&2
fi
exit "$rc"
