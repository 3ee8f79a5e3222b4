#!/usr/bin/env bash
# Run the CPU test tier (no GPU): every test not marked gpu/server/multigpu, on the first and the
# last supported SGLang release (.venv: 0.5.16, .venv23: 0.5.23), and the tests marked sglang_api
# (what moves between releases: test/conftest.py) on every release between them (.venv17 ...
# .venv22); the venvs are made by scripts/setup_cpu_env.sh. Extra arguments go to pytest.
#
# Env: SGLANG_VERSION  one supported release, or all (default: all)
#      PYTHON          run the whole tier once with this interpreter instead (it must have torch,
#                      sglang and this project installed)
# Exit status: 0 only if every run passed; "no tests collected" (pytest 5) counts as a failure.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CPU="not gpu and not server and not multigpu"
VERSIONS=$(bash scripts/sglang_versions.sh) || exit 2
FIRST=${VERSIONS%% *}
LAST=${VERSIONS##* }

run_one() {  # run_one <label> <python> <marker expression> [pytest args...]; summary line to $SUMMARY
  local label=$1 python=$2 marks=$3
  shift 3
  echo "=== CPU tier, $label ($python): -m \"$marks\""
  "$python" -m pytest -m "$marks" test "$@" | tee "$LOG"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 5 ]; then
    echo "run_cpu_tests.sh: pytest collected no tests (exit 5); treating as failure" >&2
  fi
  grep -E "^=+ .*(passed|failed|error).* in [0-9.]+s" "$LOG" | tail -1 >> "$SUMMARY"
  return "$rc"
}

LOG=$(mktemp)
SUMMARY=$(mktemp)
trap 'rm -f "$LOG" "$SUMMARY"' EXIT

if [ -n "${PYTHON:-}" ]; then
  run_one "$("$PYTHON" -c 'import sglang; print("sglang", sglang.__version__)' 2>/dev/null || echo "$PYTHON")" \
    "$PYTHON" "$CPU" "$@"
  exit $?
fi

if [ "${SGLANG_VERSION:-all}" = all ]; then
  versions=($VERSIONS)
else
  bash scripts/sglang_versions.sh --venv "$SGLANG_VERSION" > /dev/null || exit 2
  versions=("$SGLANG_VERSION")
fi

status=0
for v in "${versions[@]}"; do
  venv=$(bash scripts/sglang_versions.sh --venv "$v")
  if [ ! -x "$venv/bin/python" ]; then
    echo "run_cpu_tests.sh: $venv missing; run: SGLANG_VERSION=$v bash scripts/setup_cpu_env.sh" >&2
    status=1
    continue
  fi
  if [ "$v" = "$FIRST" ] || [ "$v" = "$LAST" ]; then
    run_one "sglang $v, whole tier" "$venv/bin/python" "$CPU" "$@" || status=1
  else
    run_one "sglang $v, sglang_api subset" "$venv/bin/python" "sglang_api and $CPU" "$@" || status=1
  fi
done

# One closing line for the whole tier (the sum of the per-release pytest summaries).
python3 - "$SUMMARY" "${#versions[@]}" <<'PY' || true
import re, sys
text = open(sys.argv[1]).read()
totals = {}
for key in ("passed", "failed", "skipped", "error"):
    totals[key] = sum(int(n) for n in re.findall(rf"(\d+) {key}", text))
runs = len(text.strip().splitlines())
print(f"cpu tier over {runs} of {sys.argv[2]} SGLang releases:")
print(f"cpu-tier: {totals['passed']} passed, {totals['failed'] + totals['error']} failed, "
      f"{totals['skipped']} skipped")
PY
exit "$status"
