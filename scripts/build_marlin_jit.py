#!/usr/bin/env python3
"""Build SGLang's JIT modules that the Marlin W4A16 MoE path loads, in the background.

    python3 scripts/build_marlin_jit.py start|wait|run DIR [MODULE...] [--dry-run]

``MODULES``: ``moe_wna16_marlin`` (bf16) and ``gptq_marlin_repack``; minutes of nvcc on a cold
cache, built into ``$TVM_FFI_CACHE_DIR``, where a server finds them. ``start`` launches one
``run`` per module in its own session (setsid: neither a stage's process-group kill nor the end
of the calling command stops it) and returns; ``run`` builds, then writes ``DIR/<module>.json``
(rc, seconds, the ``.so`` size and its xz size, errors) atomically; ``wait`` waits for every
marker (building in the foreground what no live builder is building) and exits non-zero if a
build failed. ``--dry-run``: print what ``start``/``wait`` would launch. ``scripts/gpu_job.sh``
starts it right after the environment setup when the plan has stage ``shard_jit``
(``python3 -m bench.suites --list``); ``DIR`` is ``$JIT_BUILD_DIR`` (``$BASE/jitbuild``), so it
outlives one job on a machine. Stdlib only until ``run`` imports SGLang.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ("moe_wna16_marlin", "gptq_marlin_repack")
"""SGLang's JIT modules on the Marlin W4A16 MoE path (``jit_kernel/moe_wna16_marlin.py``, built per
activation dtype, here bf16: ``fused_marlin_moe``; ``jit_kernel/gptq_marlin_repack.py``: the
weight repack of ``CompressedTensorsWNA16MoE.process_weights_after_loading``). Loading the module
is what compiles it (``load_jit``: nvcc through tvm-ffi into ``$TVM_FFI_CACHE_DIR/<name>__arch_..``);
no op needs to run."""


def marker(d: str, module: str) -> str:
    return os.path.join(d, f"{module}.json")


def read_marker(d: str, module: str) -> dict | None:
    try:
        with open(marker(d, module)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def builder_alive(d: str, module: str) -> bool:
    try:
        with open(os.path.join(d, f"{module}.pid")) as f:
            os.kill(int(f.read().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def line(module: str, m: dict) -> str:
    """The one ``JIT <module>: ...`` line the summary takes."""
    if m.get("rc") != 0:
        return f"JIT {module}: FAILED after {m.get('seconds')}s: {m.get('error', '')[:200]}"
    so = m.get("so") or {}
    mib = lambda b: f"{b / 2**20:.1f} MiB" if isinstance(b, (int, float)) else "?"  # noqa: E731
    return (f"JIT {module}: {'cached' if m.get('cached') else 'built'} in {m.get('seconds')}s; .so "
            f"{mib(so.get('bytes'))} (xz {mib(so.get('xz_bytes'))}) at {so.get('path')}")


def _loader(module: str):
    import torch

    if module == "moe_wna16_marlin":
        from sglang.jit_kernel.moe_wna16_marlin import _jit_moe_wna16_marlin_module

        return lambda: _jit_moe_wna16_marlin_module(torch.bfloat16)
    from sglang.jit_kernel.gptq_marlin_repack import _jit_gptq_marlin_repack_module

    return _jit_gptq_marlin_repack_module


def build_one(d: str, module: str) -> int:
    """Build one module in this process; write its marker (atomically, last)."""
    import lzma
    import traceback

    t0 = time.time()
    res: dict = {"module": module, "started": t0, "cache_dir": os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")}
    try:
        if module not in MODULES:
            raise ValueError(f"unknown JIT module {module!r}; known: {', '.join(MODULES)}")
        cache = os.path.expanduser(res["cache_dir"])
        sos = lambda: glob.glob(os.path.join(cache, f"sgl_kernel_jit_{module}*", "*.so"))  # noqa: E731
        before = set(sos())
        build = _loader(module)
        try:
            build()
        except Exception as ex:  # e.g. a carried .so that does not load here: clean build once more
            print(f"JIT {module}: {type(ex).__name__}: {str(ex)[:300]}; removing its build dirs, building again",
                  flush=True)
            for bd in glob.glob(os.path.join(cache, f"sgl_kernel_jit_{module}*")):
                shutil.rmtree(bd, ignore_errors=True)
            before = set()
            build()
        built = sorted(sos(), key=os.path.getmtime)
        res["cached"] = bool(built) and built[-1] in before
        if built:
            with open(built[-1], "rb") as f:
                data = f.read()
            res["so"] = {"path": built[-1], "bytes": len(data), "xz_bytes": len(lzma.compress(data, preset=6))}
        res["rc"] = 0
    except BaseException as ex:  # noqa: BLE001 -- the marker must say why
        res["rc"] = 1
        res["error"] = f"{type(ex).__name__}: {ex}"[:1500]
        traceback.print_exc()
    res["seconds"] = round(time.time() - t0, 1)
    tmp = marker(d, module) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, marker(d, module))
    print(line(module, res), flush=True)
    return res["rc"]


def start(d: str, modules: list[str]) -> int:
    for m in modules:
        done = read_marker(d, m)
        if done and done.get("rc") == 0:
            print(line(m, done) + " (marker from an earlier job)", flush=True)
            continue
        if builder_alive(d, m):
            print(f"JIT {m}: already building (pid file {os.path.join(d, m + '.pid')})", flush=True)
            continue
        if done:
            os.remove(marker(d, m))  # a failed build: try again
        with open(os.path.join(d, f"{m}.log"), "w") as log:
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "run", d, m],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, cwd=ROOT)
        with open(os.path.join(d, f"{m}.pid"), "w") as f:
            f.write(str(p.pid))
        print(f"JIT {m}: started pid {p.pid} in its own session; log {os.path.join(d, m + '.log')}", flush=True)
    return 0


def wait(d: str, modules: list[str]) -> int:
    rc, t0 = 0, time.time()
    for m in modules:
        while read_marker(d, m) is None and builder_alive(d, m):
            time.sleep(2)
        done = read_marker(d, m)
        if done is None:  # nobody built it here: build it now
            print(f"JIT {m}: no marker and no builder: building in the foreground", flush=True)
            build_one(d, m)
            done = read_marker(d, m) or {"rc": 1, "error": "no marker written"}
        print(line(m, done) + f" (waited {int(time.time() - t0)}s)", flush=True)
        rc = rc or (0 if done.get("rc") == 0 else 1)
    return rc


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    args = [a for a in argv if a != "--dry-run"]
    if len(args) < 2 or args[0] not in ("start", "wait", "run"):
        print("usage: build_marlin_jit.py start|wait|run DIR [MODULE...] [--dry-run]", file=sys.stderr)
        return 2
    action, d = args[0], args[1]
    modules = args[2:] or list(MODULES)
    os.makedirs(d, exist_ok=True)
    if action == "run":
        return max(build_one(d, m) for m in modules)
    if dry:
        for m in modules:
            print(f"JIT {m}: DRY_RUN: would {action} {sys.executable} {os.path.abspath(__file__)} run {d} {m}"
                  f" (setsid; log {os.path.join(d, m + '.log')}, marker {marker(d, m)})", flush=True)
        return 0
    return start(d, modules) if action == "start" else wait(d, modules)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
