#!/bin/bash
# The GPU-machine job: set up the environment, then run the named test suites (python3 -m bench.suites).
# From the repo root on the H200, with the bundle carried and $OUT set:
#   run(command="bash scripts/gpu_job.sh", carry=[".device-bundle"], timeout_s=600)
#   SUITE="e2e" bash scripts/gpu_job.sh                  # one suite; BENCH_ARGS="--contexts 1024" etc.
#   python3 -m bench.suites --list                       # the suites: purpose, estimated time, stages
# Setup: untar .device-bundle/site_*.tar.xz into /tmp/site (SGLang 0.5.16 + pinned deps, ~5 s),
# restore .device-bundle/jitcache.tar.xz (kernel caches of the previous call) if present, install
# this project so its sglang.srt.plugins entry point is visible (pip -e offline; fallback: a
# minimal .dist-info in /tmp/site + python/ on PYTHONPATH), put the repo root on PYTHONPATH (the
# lab package bench, in every stage and its servers' children), write the dummy models
# (python3 -m bench models dummy /tmp/models), print versions + nvidia-smi. Then
# `python3 -m bench.suites $SUITE` runs the stages (each in its own process group with its own
# limit; budget TOTAL_S - RESERVE_S; PARALLEL=1; the sanitizer verdict; the summary lines and the
# result files in $OUT: see bench/suites/runner.py). Last, this script packs the kernel caches and logs.
# Setup takes 5-15 s with a warm kernel cache (a cold one adds ~60 s to the first SGLang start);
# packing 15-30 s. A plan with stage shard_jit (suites shard_triton, shard) starts the background
# build of the Marlin MoE JIT modules right after the environment setup (scripts/build_marlin_jit.py
# start, in its own session: it outlives this job on a warm machine; markers in $BASE/jitbuild,
# the modules in $TVM_FFI_CACHE_DIR), before the plugin install and the models.
# Env (all optional):
#   SUITE        suite or stage names (default "kernel selftest e2e", ~8 min: the default budget may
#                skip the last stage on a cold cache); "all" = every suite but capture, parts and the
#                shard (~100 min: raise TOTAL_S); STAGES is read when SUITE is unset
#   TOTAL_S      whole-job budget in s (default 550, one 10-minute call; a suite may declare more);
#                RESERVE_S kept for packing (default 40)
#   <STAGE>_TMO  per-stage limits (KERNEL_TMO, SELFTEST_TMO, NAN_TMO, E2E_TMO, BENCH_TMO, ...: the
#                table of `python3 -m bench.suites --list`); PARALLEL, PARALLEL_TMO, SHARED_GPU_TOKENS
#   BENCH_ARGS   `python3 -m bench verify` args (default --quick; "" for its full default; the shard
#                sweeps of docs/gpu_testing.md set it), BENCH_MODE_TMO, KBENCH_ARGS, PARTS_ARGS,
#                CAPTURE_ARGS, SPEEDUP_ARGS (`python3 -m bench speedup`: default its full grid; it builds
#                the Llama-3.1-8B-shape pair in $MODELS first, ~3.2 GiB); E2E_MODEL, E2E_STEPS, E2E_ARGS,
#                GPU_ARGS, PROFILE_MODEL, ... reach the tests
#   BUNDLE       bundle folder (default ./.device-bundle); JITCACHE_MAX_MB (default 7);
#                $BUNDLE/marlin_jit.tar.xz (a previous job's marlin_jit.tar.xz) is restored too
#   DRY_RUN=1    for a dev machine: no bundle/pip; everything under BASE=/tmp/gpujob_dry; stages only
#                collect tests (pytest --collect-only) and print what the benchmarks would run (--dry-run)
# Back in $OUT (<= 8 files): summary.txt, logs.tar.gz (all logs; logs/e2e/<stage>/ holds each stage's
# server logs and results), the stages' results JSON (bench_results.json, speedup_results.json,
# capture_results.json, kernel_results.json, parts_results.json, ...), e2e_results.json (stage e2e),
# stage_results.tar.gz (every stage's *_results.json), jitcache.tar.xz
# (copy into .device-bundle/ for next time; build intermediates left out; past JITCACHE_MAX_MB
# without Triton's IR text), marlin_jit.tar.xz (the Marlin MoE JIT .so files, kept out of
# jitcache.tar.xz when they get their own file: ~2.9 MiB as xz for sm_90a; the summary gives its
# size against the room the 64 MiB carry limit leaves beside tree and bundle).
# Exit status: the runner's (0 only when every stage ran and passed), 2 for a bad suite name or setting.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
DRY=${DRY_RUN:-0}
SUITE=${SUITE:-${STAGES:-kernel selftest e2e}}
# a bad suite name or setting stops here, before the setup, with one line
SUITES="python3 -m bench.suites"
$SUITES --check $SUITE || exit 2
if [ "$DRY" = 1 ]; then BASE=${BASE:-/tmp/gpujob_dry}; BUNDLE=${BUNDLE:-$BASE/no-bundle}; else BASE=${BASE:-/tmp}; fi
BUNDLE=${BUNDLE:-$ROOT/.device-bundle}
OUT=${OUT:-$BASE/gpujob_out}; mkdir -p "$OUT"
W=$BASE/gpujob; rm -rf "$W"; LOGS=$W/logs; mkdir -p "$LOGS"
SITE=$BASE/site; MODELS=$BASE/models
SUMMARY=$W/summary.txt; : > "$SUMMARY"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }
el() { echo $(( $(date +%s) - T0 )); }

# ---------------------------------------------------------------- environment
mkdir -p "$SITE"
if ls "$BUNDLE"/site_*.tar.xz >/dev/null 2>&1; then
  if [ ! -f "$SITE/.done" ]; then
    for t in "$BUNDLE"/site_*.tar.xz; do tar -xJf "$t" -C "$SITE" || { say "untar $t failed"; exit 2; }; done
    touch "$SITE/.done"
  fi
else
  say "WARNING: no $BUNDLE/site_*.tar.xz: using whatever sglang is installed"
fi
export PYTHONPATH=$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}  # the repo root: bench (the lab) everywhere
# caches: sglang JIT (tvm-ffi + nvcc), Triton, Inductor, FlashInfer JIT (norm), torch extensions, CUDA JIT
export TVM_FFI_CACHE_DIR=$BASE/jitcache TRITON_CACHE_DIR=$BASE/tritoncache TORCHINDUCTOR_CACHE_DIR=$BASE/inductorcache
export FLASHINFER_WORKSPACE_BASE=$BASE/fiws TORCH_EXTENSIONS_DIR=$BASE/torchext CUDA_CACHE_PATH=$BASE/nvcache
CACHES="jitcache tritoncache inductorcache fiws torchext nvcache"
if [ -f "$BUNDLE/jitcache.tar.xz" ] && [ ! -d "$BASE/jitcache" ]; then
  tar -xJf "$BUNDLE/jitcache.tar.xz" -C "$BASE" && say "restored kernel caches from $BUNDLE/jitcache.tar.xz"
fi
if [ -f "$BUNDLE/marlin_jit.tar.xz" ]; then
  tar -xJf "$BUNDLE/marlin_jit.tar.xz" -C "$BASE" --skip-old-files && say "restored the Marlin JIT modules from $BUNDLE/marlin_jit.tar.xz"
fi
export PATH="$(dirname "$(command -v python3)")${PATH:+:$PATH}"   # the venv's ninja (tvm-ffi JIT)
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
if ! command -v sglang >/dev/null; then  # console script for sglang.test's popen_launch_server (`sglang serve`)
  mkdir -p "$BASE/bin"; export PATH=$BASE/bin:$PATH
  printf '#!/bin/sh\nexec python3 -c "import sys; sys.argv[0] = \x27sglang\x27; from sglang.cli.main import main; sys.exit(main())" "$@"\n' > "$BASE/bin/sglang"
  chmod +x "$BASE/bin/sglang"
fi
command -v nvcc >/dev/null && export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export MODELS_DIR=$MODELS E2E_MODELS_DIR=$MODELS VERIFY_GRAPH_MODELS=$MODELS E2E_LOG_DIR=$LOGS/e2e
export JIT_BUILD_DIR=${JIT_BUILD_DIR:-$BASE/jitbuild}
# the Marlin MoE JIT build as early as possible (minutes of nvcc; the stage shard_jit finds it running)
if $SUITES --check $SUITE 2>/dev/null | grep -qw shard_jit; then
  python3 scripts/build_marlin_jit.py start "$JIT_BUILD_DIR" $([ "$DRY" = 1 ] && echo --dry-run) \
    > "$LOGS/jit_start.txt" 2>&1
  say "jit at $(el)s: $(grep '^JIT ' "$LOGS/jit_start.txt" | cut -c1-160 | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- install the plugin (entry point)
plugin_ok() {
  python3 - "$ROOT" <<'EOF' 2>>"$LOGS/install.txt"
import importlib.metadata as m, sys, os
eps = {e.name: e.value for e in m.entry_points(group="sglang.srt.plugins")}
import sglang_verify_graph as p
ok = "verify_cuda_graph" in eps and os.path.realpath(p.__file__).startswith(os.path.realpath(sys.argv[1]))
print(f"plugin entry points {eps}; sglang_verify_graph from {p.__file__}")
sys.exit(0 if ok else 1)
EOF
}
if [ "$DRY" = 1 ]; then echo "DRY_RUN: no pip" > "$LOGS/install.txt"; else
  env -u PYTHONPATH timeout 120 python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    > "$LOGS/install.txt" 2>&1; fi
if [ "$DRY" != 1 ] && plugin_ok >> "$LOGS/install.txt"; then
  say "install: pip -e ok ($(tail -1 "$LOGS/install.txt" | cut -c1-200))"
else
  [ "$DRY" = 1 ] && say "install: DRY_RUN, .dist-info fallback in $SITE" || \
    say "install: pip -e failed or not visible (see logs/install.txt); using .dist-info fallback in $SITE"
  DI=$SITE/sglang_verify_graph-0.1.0.dist-info; mkdir -p "$DI"
  printf 'Metadata-Version: 2.1\nName: sglang-verify-graph\nVersion: 0.1.0\n' > "$DI/METADATA"
  printf '[sglang.srt.plugins]\nverify_cuda_graph = sglang_verify_graph.plugin:register\n' > "$DI/entry_points.txt"
  export PYTHONPATH=$ROOT/python:$PYTHONPATH
  plugin_ok >> "$LOGS/install.txt" && say "install: fallback ok" || say "install: FALLBACK FAILED (see logs/install.txt)"
fi
# the dummy models (config-only folders for --load-format dummy); needs the plugin installed above
python3 -m bench models dummy "$MODELS" > "$LOGS/make_models.txt" 2>&1 || say "bench models dummy FAILED: $(tail -3 "$LOGS/make_models.txt")"
say "== setup done in $(el)s; CUDA_HOME=${CUDA_HOME:-none}; $(nvcc --version 2>/dev/null | tail -1)"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null | head -2 | tr '\n' ' ')"
say "cpu: $(nproc) x$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
say "$(python3 -c "
import importlib.metadata as m, sys
def v(p):
    try: return m.version(p)
    except Exception: return '-'
print('versions python=' + sys.version.split()[0], ' '.join(f'{p}={v(p)}' for p in ('torch','sglang','triton','transformers','sglang-kernel','flashinfer-python','sglang-verify-graph')))" 2>&1 | tail -1)"
nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1

# ---------------------------------------------------------------- the suites (bench/suites)
export GPUJOB_DIR=$W GPUJOB_T0=$T0 OUT DRY_RUN=$DRY
$SUITES $SUITE
RC=$?

# ---------------------------------------------------------------- pack (caches for the next call, logs)
PRESENT=$(cd "$BASE" && for c in $CACHES; do [ -d "$c" ] && echo "$c"; done)
(cd "$BASE" && du -sh $PRESENT 2>/dev/null | tr '\n' ' ') > "$LOGS/cache_sizes.txt"
MIB() { echo $(( $(stat -c %s "$1") / 1048576 )); }
# the Marlin MoE JIT modules (scripts/build_marlin_jit.py MODULES): .so files only, in marlin_jit.tar.xz
MARLIN_SO=$(cd "$BASE" && ls -d jitcache/sgl_kernel_jit_moe_wna16_marlin*/*.so jitcache/sgl_kernel_jit_gptq_marlin_repack*/*.so 2>/dev/null)
MARLIN_OUT=""
if [ -n "$MARLIN_SO" ] && [ "$(ls "$OUT" | wc -l)" -lt 5 ]; then  # + jitcache, marlin_jit, summary.txt, logs.tar.gz <= 8
  MARLIN_OUT=1
fi
if [ -n "$PRESENT" ]; then
  INTER="--exclude=*.o --exclude=build.ninja --exclude=.ninja_deps --exclude=.ninja_log"  # JIT build intermediates
  IR="--exclude=*.ttir --exclude=*.ttgir --exclude=*.llir --exclude=*.ptx --exclude=*.source --exclude=*.amdgcn"
  MARLIN_X=""
  [ -n "$MARLIN_OUT" ] && MARLIN_X="--exclude=sgl_kernel_jit_moe_wna16_marlin* --exclude=sgl_kernel_jit_gptq_marlin_repack*"
  XZ_OPT="-T0 -6" tar -cJf "$OUT/jitcache.tar.xz" -C "$BASE" $INTER $MARLIN_X $PRESENT 2>/dev/null
  if [ "$(MIB "$OUT/jitcache.tar.xz")" -ge "${JITCACHE_MAX_MB:-7}" ]; then  # keep it carriable: drop Triton IR text, keep cubins + metadata
    XZ_OPT="-T0 -6" tar -cJf "$OUT/jitcache.tar.xz" -C "$BASE" $INTER $MARLIN_X $IR $PRESENT 2>/dev/null
  fi
  say "jitcache.tar.xz $(MIB "$OUT/jitcache.tar.xz") MiB from: $(cat "$LOGS/cache_sizes.txt")"
fi
if [ -n "$MARLIN_SO" ]; then  # to carry in $BUNDLE where it fits: the next job skips minutes of nvcc
  (cd "$BASE" && du -b $MARLIN_SO | awk '{printf "%s %.1f MiB; ", $2, $1 / 1048576}') > "$LOGS/marlin_jit_sizes.txt"
  ROOM=$(( 64 - $(du -sb --exclude=.git --exclude=__pycache__ --exclude="*.egg-info" "$ROOT" | cut -f1) / 1048576 ))
  if [ -n "$MARLIN_OUT" ]; then
    XZ_OPT="-T0 -6" tar -cJf "$OUT/marlin_jit.tar.xz" -C "$BASE" $MARLIN_SO
    say "marlin_jit.tar.xz $(MIB "$OUT/marlin_jit.tar.xz") MiB (.so: $(cat "$LOGS/marlin_jit_sizes.txt")); the 64 MiB carry limit leaves ~$ROOM MiB beside this tree and bundle for jitcache.tar.xz + marlin_jit.tar.xz"
  else
    say "Marlin JIT .so: $(cat "$LOGS/marlin_jit_sizes.txt") kept in jitcache.tar.xz (no free file slot in \$OUT); carry room ~$ROOM MiB"
  fi
fi
say "== total $(el)s; exit $RC"
cp "$SUMMARY" "$OUT/summary.txt"
tar -czf "$OUT/logs.tar.gz" -C "$W" logs summary.txt
echo; echo "================ SUMMARY ================"
cat "$SUMMARY"
echo "OUT: $(cd "$OUT" && ls -l | awk 'NR>1{printf "%s(%d KiB) ", $9, $5/1024}')"
exit $RC
