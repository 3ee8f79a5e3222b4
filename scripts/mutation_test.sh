#!/usr/bin/env bash
# Mutation testing of the package's modules with mutmut 3, against the CPU tier: every mutant of
# a module named should make a CPU test fail. mutmut imports mutants from mutants/src, so this
# stages the package as src/ in a work folder (the checkout is left untouched), copies the tests
# and what they read, and runs there.
#
#   bash scripts/mutation_test.sh [module ...]      # default: the six policy modules (config,
#                                                   # backends, counters, buffers, runner, plugin)
#   bash scripts/mutation_test.sh chain_backend debug/selftest plan compat/sglang_adapter \
#       kernel/chain_verify_attention               # the kernel-side five
#   A module is its path under python/sglang_verify_graph without ".py" (debug/selftest or
#   debug.selftest). kernel/triton_chain holds only the two @triton.jit programs, which mutmut
#   never mutates (it skips decorated functions): naming it adds no mutant.
#   MUTATION_DIR=/tmp/verify_graph_mutation  PYTHON=.venv/bin/python  MUTATION_CHILDREN=2
#   MUTATION_TESTS="test/cpu/test_static_buffers.py ..."   # test selection (default: test/cpu)
#   MUTATION_DESELECT="test/cpu/x.py::test_y ..."         # tests left out (one that fails unmutated
#                                                         # stops mutmut before any mutant runs)
#   MUTATION_KEEP=1   # reuse $MUTATION_DIR, brought up to the checkout: mutmut re-mutates changed
#                     # modules, runs only mutants not checked yet (or named below) and collects
#                     # stats only for tests it has not seen
#   MUTATION_MUTANTS="sglang_verify_graph.buffers.*"   # re-run these mutants (mutmut globs);
#                     # "survived": every mutant not killed in the last run (after adding tests)
#
# Needs mutmut >= 3.8 in $PYTHON ($PYTHON -m pip install mutmut). Time on 2 cores, 2 children:
# mutmut runs the selected tests three times before any mutant (stats, clean, forced fail: ~15 min
# with the default selection), then each of the ~1,500 mutants runs, fastest first and with -x,
# only the tests that reached its function (~25 min): a full run is ~40 min; a MUTATION_KEEP=1
# re-run of the survivors a few minutes. Prints one line per mutant that was not killed, then per
# module and in all: killed / total and the score (killed + timeout) / total. Mutants that survive
# on purpose (equivalent, or unreachable on CPU) are listed in docs/testing.md; they are counted as
# not killed here. $MUTATION_DIR/raw.txt is the run's record, kept as docs/runs/mutation/*.txt
# (rendered into docs/testing.md by `python -m bench report`). The kernel-side five: ~2,000
# mutants, ~75 min. Only in-process calls count: mutmut associates a test with a mutant by the
# functions it ran in the pytest process, so a test that reaches a module only in a fresh
# interpreter never runs against its mutants.
#
# The package is mutated as one tree (source_paths = the package folder; only_mutate picks the
# modules), so every module of the package is importable from mutants/src. The project's
# serve-help .pth imports sglang_verify_graph when the interpreter starts (before mutants/src is on
# sys.path): those modules are dropped before mutmut starts. Tests that start a fresh interpreter
# get mutants/src on PYTHONPATH, so a mutant is active in the child too.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
W=${MUTATION_DIR:-/tmp/verify_graph_mutation}
MODULES=$(for m in ${*:-config backends counters buffers runner plugin}; do m=${m%.py}; echo "${m//.//}"; done)
for m in $MODULES; do
  [ -f "$ROOT/python/sglang_verify_graph/$m.py" ] || { echo "mutation_test.sh: no module python/sglang_verify_graph/$m.py" >&2; exit 2; }
done
TESTS=${MUTATION_TESTS:-test/cpu}
# Test files that reach none of a group's modules in-process (mutmut's stats run over the whole
# tier recorded no hit from them: they test other modules, benches, scripts, or start a fresh
# interpreter, where mutmut cannot see which functions ran). mutmut runs the whole selection three
# times before any mutant (stats, clean run, forced-fail run), and for the policy group these
# files are ~20 of the tier's ~25 minutes on 2 cores. A run leaves out the files that every module
# named lists (a module of no group keeps the whole tier). MUTATION_IGNORE="" keeps them all
# (re-check the lists after moving tests between files).
IGNORE_POLICY="test_accept_pair test_advisor test_bench_baseline test_bench_capture
  test_bench_merge test_bench_profile test_bench_verify_parts test_capture_log test_chain_backend_layers
  test_chain_backend_refusals test_chain_backend_test_fault test_chain_kernel_arch_fit
  test_chain_kernel_interpret test_chain_kernel_test_fault test_chain_shape test_demo
  test_flag_sources test_gpu_job_parallel
  test_hook_installation test_kernel_launcher_checks test_make_models test_marlin_jit_build
  test_package_layers test_profile test_run_suite test_sanitizer_reports test_serve_help
  test_shard_quant_config test_suite_declarations test_upstream_patch"
IGNORE_KERNEL_SIDE="test_accept_pair test_advisor test_bench_baseline test_bench_capture
  test_bench_merge test_bench_profile test_bench_verify_parts test_capture_log
  test_chain_kernel_interpret test_demo test_gpu_job_parallel test_hook_installation
  test_kernel_launcher_checks test_make_models test_marlin_jit_build test_package_layers
  test_run_suite test_sanitizer_reports test_shard_quant_config test_suite_declarations"
ignore_of() {  # ignore_of <module>: the test files (basenames) its group leaves out
  case $1 in
    config|backends|counters|buffers|runner|plugin) echo $IGNORE_POLICY ;;
    chain_backend|debug/selftest|plan|compat/sglang_adapter|kernel/chain_verify_attention|kernel/triton_chain)
      echo $IGNORE_KERNEL_SIDE ;;
  esac
}
if [ -z "${MUTATION_IGNORE+set}" ]; then
  IGNORE=$(ignore_of "${MODULES%%$'\n'*}")
  for m in $MODULES; do
    IGNORE=$(comm -12 <(tr ' ' '\n' <<<"$IGNORE" | grep . | sort -u) <(ignore_of "$m" | tr ' ' '\n' | grep . | sort -u) | tr '\n' ' ')
  done
else
  IGNORE=$MUTATION_IGNORE
fi
"$PY" -c "import mutmut" 2>/dev/null || { echo "mutation_test.sh: mutmut missing in $PY; fix: $PY -m pip install mutmut" >&2; exit 2; }

if [ "${MUTATION_KEEP:-0}" = 1 ] && [ -d "$W/mutants" ]; then
  # Bring the snapshot up to the checkout: a changed module is copied (mutmut then re-mutates it
  # and forgets the results of its changed functions), everything else the tests read replaced.
  (cd "$ROOT/python" && find sglang_verify_graph -name '*.py') | while read -r f; do
    cmp -s "$ROOT/python/$f" "$W/src/$f" || { mkdir -p "$W/src/$(dirname "$f")"; cp "$ROOT/python/$f" "$W/src/$f"; }
  done
  for dest in "$W" "$W/mutants"; do
    rm -rf "$dest/test" "$dest/bench" "$dest/scripts" "$dest/docs" "$dest/python"
    cp -r "$ROOT/test" "$ROOT/bench" "$ROOT/scripts" "$ROOT/docs" "$ROOT/README.md" "$dest/"
    mkdir -p "$dest/python"; cp -r "$ROOT/python/sglang_verify_graph" "$dest/python/"
    find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  done
else
  rm -rf "$W"; mkdir -p "$W/src"
  cp -r "$ROOT/python/sglang_verify_graph" "$W/src/"
  mkdir -p "$W/python"; cp -r "$ROOT/python/sglang_verify_graph" "$W/python/"  # tests that read the source tree
  cp -r "$ROOT/test" "$ROOT/bench" "$ROOT/scripts" "$ROOT/docs" "$W/"
  cp "$ROOT/README.md" "$W/"
  find "$W" -name __pycache__ -type d -prune -exec rm -rf {} +
fi
ONLY=$(for m in $MODULES; do printf '"src/sglang_verify_graph/%s.py", ' "$m"; done)
SEL=$(for t in $TESTS; do printf '"%s", ' "$t"; done)
DESEL=$(for t in ${MUTATION_DESELECT:-}; do printf ', "--deselect", "%s"' "$t"; done
        for f in $IGNORE; do printf ', "--ignore", "test/cpu/%s.py"' "$f"; done)
{
  cat "$ROOT/pyproject.toml"
  cat <<TOML

[tool.mutmut]
source_paths = ["src/sglang_verify_graph"]
only_mutate = [${ONLY%, }]
also_copy = ["python/", "bench/", "scripts/", "docs/", "README.md"]
pytest_add_cli_args = ["-m", "not gpu and not server and not multigpu", "-p", "no:cacheprovider"$DESEL]
pytest_add_cli_args_test_selection = [${SEL%, }]
process_isolation = "forkserver"
debug = ${MUTATION_DEBUG:-false}
TOML
} > "$W/pyproject.toml"
[ -d "$W/mutants" ] && cp "$W/pyproject.toml" "$W/mutants/pyproject.toml"
cd "$W"
if [ "${MUTATION_MUTANTS:-}" = survived ]; then
  MUTATION_MUTANTS=$("$PY" -m mutmut results 2>/dev/null | sed -n 's/^ *\(sglang_verify_graph\.[^:]*\): .*/\1/p' | tr '\n' ' ')
  [ -n "$MUTATION_MUTANTS" ] || { echo "mutation_test.sh: no surviving mutants to re-run" >&2; exit 0; }
fi
# PYTHONPATH is set from inside the interpreter: a sys.path entry that does not exist yet when the
# interpreter starts (mutants/src, made by mutmut) is cached as "no importer" in
# sys.path_importer_cache, and mutmut's own insertion of the same path string then imports nothing
# from it: the tests would import the unmutated package and no test would reach any mutant.
"$PY" -c 'import os, sys
for m in [m for m in sys.modules if m.split(".")[0] == "sglang_verify_graph"]:
    del sys.modules[m]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath("mutants/src"), os.environ.get("PYTHONPATH")]))
from mutmut.__main__ import cli
sys.argv = ["mutmut", "run", "--max-children", sys.argv[1]] + sys.argv[2:]
cli()' "${MUTATION_CHILDREN:-2}" ${MUTATION_MUTANTS:-}
"$PY" -m mutmut results --all true > "$W/results.txt" 2>&1
# raw.txt: the run (versions, commit, command) as '#' lines, then results.txt: what
# docs/runs/mutation/*.txt keep and `python -m bench report` renders into docs/testing.md.
{
  "$PY" -c 'import importlib.metadata as m, platform, sglang
print("# mutmut %s; SGLang %s; torch %s; Python %s" % (m.version("mutmut"), sglang.__version__,
      m.version("torch"), platform.python_version()))'
  dirty=$(git -C "$ROOT" status --porcelain -- python/sglang_verify_graph test/cpu scripts/mutation_test.sh 2>/dev/null | head -1)
  echo "# commit $(git -C "$ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)${dirty:+ (package or CPU tests changed since)}"
  echo "# bash scripts/mutation_test.sh $(echo $MODULES)${MUTATION_MUTANTS:+ (MUTATION_KEEP=1: a re-run of $(echo $MUTATION_MUTANTS | wc -w) mutants)}"
  cat "$W/results.txt"
} > "$W/raw.txt"
grep -v ": killed$" "$W/results.txt" || true
"$PY" - "$W/results.txt" <<'PYEOF'
import collections, re, sys
per = collections.defaultdict(collections.Counter)
for line in open(sys.argv[1], encoding="utf-8"):
    # sglang_verify_graph.<module, dotted>.x_<function>__mutmut_N or .xǁ<class>ǁ<method>__mutmut_N
    m = re.match(r"\s*sglang_verify_graph\.([\w.]+)\.x[_ǁ]\S*: (\w[\w ]*)$", line.rstrip())
    if m:
        per[m.group(1)][m.group(2)] += 1
def line(name, c):
    total = sum(c.values())
    score = 100.0 * (c["killed"] + c["timeout"]) / total if total else 0.0
    rest = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "killed")
    return f"mutation {name}: {c['killed']} killed / {total} mutants, score {score:.1f}%" + (f" ({rest})" if rest else "")
for mod in sorted(per):
    print(line(mod, per[mod]))
print(line("all", sum(per.values(), collections.Counter())))
if not per:
    sys.exit("mutation_test.sh: no mutant results")
PYEOF
