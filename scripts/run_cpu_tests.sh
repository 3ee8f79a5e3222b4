#!/usr/bin/env bash
# Run the CPU test tier (no GPU): every test not marked gpu/server/multigpu, once per supported
# SGLang version: with .venv/bin/python (sglang 0.5.16) and .venv23/bin/python (sglang 0.5.23),
# both made by scripts/setup_cpu_env.sh. Extra arguments go to pytest.
#
# Env: SGLANG_VERSION  0.5.16, 0.5.23 or all (default: all)
#      PYTHON          run once with this interpreter instead (it must have torch, sglang and this
#                      project installed)
# Exit status: 0 only if every run passed; "no tests collected" (pytest 5) counts as a failure.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

run_one() {  # run_one <label> <python> [pytest args...]; prints pytest's summary line to $SUMMARY
  local label=$1 python=$2
  shift 2
  echo "=== CPU tier, $label ($python)"
  "$python" -m pytest -m "not gpu and not server and not multigpu" test "$@" | tee "$LOG"
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
    "$PYTHON" "$@"
  exit $?
fi

case "${SGLANG_VERSION:-all}" in
  all) versions=(0.5.16 0.5.23) ;;
  0.5.16 | 0.5.23) versions=("$SGLANG_VERSION") ;;
  *) echo "run_cpu_tests.sh: unsupported SGLANG_VERSION '$SGLANG_VERSION'" >&2; exit 2 ;;
esac

status=0
for v in "${versions[@]}"; do
  venv=$ROOT/.venv
  [ "$v" = 0.5.23 ] && venv=$ROOT/.venv23
  if [ ! -x "$venv/bin/python" ]; then
    echo "run_cpu_tests.sh: $venv missing; run: SGLANG_VERSION=$v bash scripts/setup_cpu_env.sh" >&2
    status=1
    continue
  fi
  run_one "sglang $v" "$venv/bin/python" "$@" || status=1
done

# One closing line for the whole tier (the sum of the per-version pytest summaries).
python3 - "$SUMMARY" "${#versions[@]}" <<'PY' || true
import re, sys
text = open(sys.argv[1]).read()
totals = {}
for key in ("passed", "failed", "skipped", "error"):
    totals[key] = sum(int(n) for n in re.findall(rf"(\d+) {key}", text))
runs = len(text.strip().splitlines())
print(f"cpu tier over {runs} of {sys.argv[2]} SGLang versions:")
print(f"cpu-tier: {totals['passed']} passed, {totals['failed'] + totals['error']} failed, "
      f"{totals['skipped']} skipped")
PY
exit "$status"
