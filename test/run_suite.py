#!/usr/bin/env python3
"""The GPU test suites, declared in one place by purpose, and the runner that runs them.

    python3 test/run_suite.py --list                 # suite, purpose, estimated time, stages
    python3 test/run_suite.py --check NAME...        # check the names and settings; print the plan
    python3 test/run_suite.py NAME...                # run (on the GPU machine, after the setup)

``scripts/gpu_job.sh`` sets up the GPU machine (bundle, kernel caches, plugin install, dummy
models) and then runs ``python3 test/run_suite.py $SUITE``; it packs the logs and caches after.

A NAME is a suite of ``SUITES`` (``demo``, ``kernel``, ``selftest``, ``e2e``, ``mla``, ``reliability``,
``profile``, ``accept_attn``, ``bench``, ``speedup``, ``kbench``, ``capture``, ``shard``, ``shard_triton``, ``shard_marlin``,
``shard_wrapped``, ``shard_bench``, ``shard_bench_lean``, ``shard_rest_*``, ``all``), one stage of a suite (e.g. ``nan``,
``sanitizer``, ``accept``), ``wait`` (a barrier: wait for the stages running at once; the rest run
one at a time) or ``-NAME`` (leave that suite's or stage's stages out: ``reliability -sanitizer``).

A stage is one command (pytest on one test file, or one benchmark script). Each runs in its own
process group under ``timeout`` with its own limit (its ``*_TMO`` variable, default in the
declaration); whatever it leaves running is killed after it. No stage runs past ``TOTAL_S -
RESERVE_S`` seconds after the job started (``GPUJOB_T0``); a stage with under 30 s left is
skipped (which fails the job). Parallel mode (``PARALLEL=1``; the default when a named suite is
declared ``parallel``) starts stages in the background, 4 s apart (``PARALLEL_STAGGER_S``),
with every test server's KV pool capped at ``SHARED_GPU_TOKENS`` (65536) tokens and a limit of
``PARALLEL_TMO`` (520 s, for the contention) unless the stage's own variable is set; a stage
declared ``alone`` (timing, compute-sanitizer) first waits for them, and everything after it runs
one at a time. ``DRY_RUN=1``: pytest stages only collect (``--collect-only``), benchmarks print
what they would run (``--dry-run``).

Results: ``$GPUJOB_DIR/logs/<stage>.log`` per stage, ``logs/e2e/<stage>/`` (``E2E_LOG_DIR``) with
its servers' logs and results JSON; lines appended to ``$GPUJOB_DIR/summary.txt``; into ``$OUT``:
``bench_results.json``, ``speedup_results.json``, ``kernel_results.json``, ``capture_results.json``, ``e2e_results.json``
(stage ``e2e``), ``stage_results.tar.gz`` (every stage's ``*_results.json``). Exit status 0 only
when every stage ran and returned 0 (or had nothing to run); 2 for a bad name or setting.

Background kernel builds: ``python3 test/run_suite.py --jit-build start|wait|run DIR`` builds
SGLang's JIT modules that the Marlin W4A16 MoE path loads (``JIT_MODULES``: ``moe_wna16_marlin``
for bf16, ``gptq_marlin_repack``; minutes of nvcc on a cold cache) into ``$TVM_FFI_CACHE_DIR``,
where a server finds them. ``start`` launches one ``run`` per module in its own session (setsid:
neither the stage's process-group kill nor the end of the calling command stops it) and returns;
``run`` builds, then writes ``DIR/<module>.json`` (rc, seconds, the ``.so`` size and its xz size,
errors) atomically; ``wait`` waits for every marker (building in the foreground what no live
builder is building) and exits non-zero if a build failed. ``DIR`` (``{jit}`` in a stage) is
``$JIT_BUILD_DIR``, else ``jitbuild`` beside ``$GPUJOB_DIR``, so it outlives one job on a machine.

This file is stdlib only (gpu_job.sh checks the names with it before the setup; the builder
imports SGLang inside ``run``) and is not a pytest module (``test/cpu/test_run_suite.py`` tests it).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAIT = "wait"
DEFAULT_SUITE = "kernel selftest e2e"
DEFAULT_TOTAL_S, DEFAULT_RESERVE_S = 550, 40  # one 10-minute call: setup + stages + packing
MIN_LEFT_S = 30  # a stage with less than this left of the budget is skipped


@dataclass(frozen=True)
class Arg:
    """Arguments read from the environment when the stage starts: ``shlex.split($var)``, or
    ``default`` when the variable is unset (set and empty: no arguments)."""

    var: str
    default: str = ""

    def expand(self, environ: Mapping[str, str]) -> list[str]:
        value = environ.get(self.var)
        return shlex.split(self.default if value is None else value)


Part = Union[str, Arg]


@dataclass(frozen=True)
class Stage:
    """One command of a suite.

    ``cmd``: argv; strings may hold ``{logs}``, ``{work}``, ``{models}``, ``{jit}``; :class:`Arg` items
    expand from the environment. ``kind`` ``pytest``: ``--collect-only`` in a dry run and its
    result line in the summary; ``bench``: ``--dry-run``. ``extra``: arguments after those.
    ``env``: variables set for the stage (a string, or an :class:`Arg`: its words joined).
    ``alone``: never beside other stages (timing; compute-sanitizer). ``memcheck`` ``kernel``:
    the command runs under compute-sanitizer; ``server``: the test servers do. ``needs_pair``:
    the constructed target/draft pair (``bench/models/accept_pair.py``, real weights) is made first;
    ``needs_attn_pair``: its attention pair (``accept_pair.py --attention``).
    ``report``: its benchmark lines for the summary (``bench``, ``speedup``, ``capture``, ``kbench``) and
    ``results``: the JSON it writes in ``{work}``, copied into ``$OUT``. ``e2e_report``: its
    ``e2e_results.json`` lines (startup, parity, concurrency, counters) in the summary.
    ``est_s``: measured seconds on the H200 with a warm kernel cache, the stage alone unless
    its comment says otherwise."""

    name: str
    cmd: tuple[Part, ...]
    tmo_env: str
    tmo_s: int
    est_s: int
    kind: str = "pytest"
    extra: Arg | None = None
    env: tuple[tuple[str, Part], ...] = ()
    alone: bool = False
    memcheck: str = ""
    needs_pair: bool = False
    needs_attn_pair: bool = False
    report: str = ""
    results: str = ""
    e2e_report: bool = False

    @property
    def files(self) -> list[str]:
        """The test files, scripts and package modules (``-m sglang_verify_graph.X``) the stage runs
        (paths relative to the repo root)."""
        files = [c for c in self.cmd if isinstance(c, str) and c.endswith(".py") and "/" in c]
        for flag, mod in zip(self.cmd, self.cmd[1:]):
            if flag == "-m" and isinstance(mod, str) and mod.startswith("sglang_verify_graph."):
                files.append("python/sglang_verify_graph/" + mod.split(".", 1)[1] + ".py")
        return files

    def stages(self, environ: Mapping[str, str]) -> list["Stage"]:
        return [self]


@dataclass(frozen=True)
class Cases:
    """Stages made per word of an environment list (``var``, default ``default``): one stage per
    case, each with its own name (own log, own server logs)."""

    name: str
    var: str
    default: str
    make: Callable[[str, int], Stage]
    doc: str = ""

    def stages(self, environ: Mapping[str, str]) -> list[Stage]:
        return [self.make(c, i) for i, c in enumerate(environ.get(self.var, self.default).split())]


@dataclass(frozen=True)
class Group:
    """A fixed list of stages under one name (run together, addressable by that name)."""

    name: str
    members: tuple[Stage, ...]

    def stages(self, environ: Mapping[str, str]) -> list[Stage]:
        return list(self.members)


@dataclass(frozen=True)
class Suite:
    """``parts``: stages, cases, groups or names of other suites, in run order. ``est_s``:
    seconds for the whole suite as it runs by default (at once when ``parallel``), measured on
    the H200 with a warm kernel cache. ``total_s``: the default ``TOTAL_S`` when this suite is
    named in full (nothing left out) and ``TOTAL_S`` is unset."""

    purpose: str
    est_s: int
    parts: tuple = ()
    parallel: bool = False
    total_s: int | None = None


def pytest_cmd(marker: str, path: str, *args: str, stop_first: bool = True) -> tuple[str, ...]:
    return ("python3", "-m", "pytest", *(("-x",) if stop_first else ()), "-q", "-rs", "-m", marker,
            path, *args, "-p", "no:cacheprovider")


SELFTEST = "test/gpu/test_runner_selftest.py"
E2E = "test/e2e/test_server_e2e.py"
RELIAB = "test/e2e/test_reliability_e2e.py"
ACCEPT = "test/e2e/test_accept_length_e2e.py"
ACCEPT_ATTN = "test/e2e/test_accept_attention_e2e.py"

# ------------------------------------------------------------------------------ the stages
KERNEL_ST = Stage(  # 45 s warm (kernel cases only); a cold Triton cache compiles every tiling first
    "kernel", pytest_cmd("gpu", "test/gpu/test_chain_kernel_gpu.py"), "KERNEL_TMO", 150, 45,
    extra=Arg("GPU_ARGS"))
SELFTEST_ST = Stage(  # one self-test server on llama-small: 100 s warm; +60 s on a cold cache
    "selftest", pytest_cmd("gpu", SELFTEST), "SELFTEST_TMO", 200, 100, extra=Arg("GPU_ARGS"))
NAN_ST = Stage(  # NaN in the padded rows, SGLang's NaN detection on (SGLANG_ENABLE_ASYNC_ASSERT=1): 114 s
    "nan", pytest_cmd("gpu", SELFTEST), "NAN_TMO", 200, 114, needs_pair=True,
    env=(("VERIFY_GRAPH_SELFTEST_NAN", "1"), ("VERIFY_GRAPH_SELFTEST_MODEL", Arg("NAN_MODEL", "llama-pair")),
         ("VERIFY_GRAPH_SELFTEST_PORT", "31871")))


def _mla_case(model: str, i: int) -> Stage:
    """The self-test on an MLA target; ``kimi-k25-small`` (the KimiK25 multimodal wrapper)
    through ``sglang.Engine`` (the CLI server would load its remote-code HF processor)."""
    if model == "kimi-k25-small":  # est: passed at once with 9 other stages, within their 415 s
        return Stage(f"mla_{model}", pytest_cmd("gpu", "test/gpu/test_kimi_k25_engine.py"), "MLA_TMO", 220, 150)
    return Stage(  # kimi-small-mla (MLA drafter): 154 s at once with 9 other stages
        f"mla_{model}", pytest_cmd("gpu", SELFTEST, "-k", "graph_equals or page_boundary"), "MLA_TMO", 220, 150,
        env=(("VERIFY_GRAPH_SELFTEST_MODEL", model), ("VERIFY_GRAPH_SELFTEST_PORT", "31872")))


def _native_case(case: str, i: int) -> Stage:
    """Our runner around a backend's own verify kernel (``model:backend``); one port per case.
    fa3 needs sgl_kernel's flash_ops (1.1 GB, not in the bundle): only where it is installed."""
    model, _, backend = case.partition(":")
    return Stage(  # flashmla / flashinfer: 237 / 238 s at once with 8 other stages (FlashInfer MLA JIT)
        f"native_{model}_{backend}", pytest_cmd("gpu", SELFTEST, "-k", "graph_equals or falls_back or page_boundary"),
        "NATIVE_TMO", 400, 240,
        env=(("VERIFY_GRAPH_SELFTEST_MODEL", model), ("VERIFY_GRAPH_SELFTEST_BACKEND", backend),
             ("VERIFY_GRAPH_SELFTEST_PORT", str(31875 + i))))


def _e2e_mla_case(case: str, i: int) -> Stage:
    """The server e2e tier on an MLA target: ``model:backend[:draft_backend]``."""
    model, backend, draft = (case.split(":") + ["", ""])[:3]
    return Stage(  # 316-408 s at once with 8 other stages; ~220 s alone, like stage e2e
        f"e2e_{model}_{backend}" + (f"_draft_{draft}" if draft else ""), pytest_cmd("server", E2E), "E2E_TMO", 240, 240,
        extra=Arg("E2E_ARGS"), e2e_report=True,
        env=(("E2E_MODEL", model), ("E2E_BACKEND", backend), ("E2E_DRAFT_BACKEND", draft)))


MLA = Cases("mla", "MLA_MODELS", "kimi-small-mla kimi-k25-small", _mla_case,
            "the self-test per MLA target (MLA_MODELS)")
NATIVE = Cases("native", "NATIVE_CASES", "kimi-small-mla:flashmla kimi-small-mla:flashinfer", _native_case,
               "the self-test around a backend's own verify (NATIVE_CASES model:backend)")
E2E_MLA = Cases("e2e_mla", "E2E_MLA_CASES",
                "kimi-small:triton kimi-small:flashmla:triton kimi-small:flashinfer "
                "kimi-small-mla:triton kimi-small-mla:flashmla kimi-small-mla:flashinfer", _e2e_mla_case,
                "the e2e tier per MLA target x backend (E2E_MLA_CASES model:backend[:draft_backend])")

E2E_ST = Stage(  # 3 server starts (~55-60 s each) + 16 x 128-token parity x 3 + concurrency: 219 s
    "e2e", pytest_cmd("server", E2E), "E2E_TMO", 240, 220, extra=Arg("E2E_ARGS"), e2e_report=True)
PROFILE_ST = Stage(  # llama-8b: 164 s
    "profile", pytest_cmd("server", "test/e2e/test_profile_e2e.py", stop_first=False), "PROFILE_TMO", 240, 165,
    env=(("PROFILE_MODEL", Arg("PROFILE_MODEL", "llama-8b")),))
ACCEPT_ST = Stage(  # ours / upstream / eager accept lengths on the constructed pair: 199 s
    "accept", pytest_cmd("server", ACCEPT, stop_first=False), "ACCEPT_TMO", 300, 200, needs_pair=True)
ACCEPT_SHAPE_ST = Stage(  # num_steps 1, 2, 5 on ours (3 servers): 446 s at once with 9 other stages
    "accept_shape", pytest_cmd("server", ACCEPT, stop_first=False), "ACCEPT_TMO", 300, 200, needs_pair=True,
    env=(("ACCEPT_STEPS", "1 2 5"),))


def _accept_attn(name: str, k: str, est_s: int) -> Stage:
    return Stage(name, pytest_cmd("server", ACCEPT_ATTN, "-k", k, stop_first=False), "ACCEPT_ATTN_TMO", 420,
                 est_s, needs_attn_pair=True)


# the attention pair, one test group each (so they run at once); est (not measured): ~60 s per server
# start and its 16 x 96 tokens, as in stage accept
ACCEPT_ATTN_P1 = _accept_attn("accept_attn_p1", "parity and not 64", 200)  # plain, upstream, ours at page 1
ACCEPT_ATTN_P64 = _accept_attn("accept_attn_p64", "parity and 64", 140)  # upstream, ours at page 64
ACCEPT_ATTN_FAULT = _accept_attn("accept_attn_fault", "fault", 200)  # ours with each of the 3 test faults
# the self-test's upstream reference on the attention pair (attention reaches the logits), then
# with a test fault in our kernel: the reference must see it (est, not measured: ~100 s each)
SELFTEST_ATTN = Stage(
    "selftest_attn", pytest_cmd("gpu", SELFTEST, "-k", "graph_equals or page_boundary"), "SELFTEST_TMO", 240,
    100, needs_attn_pair=True,
    env=(("VERIFY_GRAPH_SELFTEST_MODEL", "llama-pair-attn"), ("VERIFY_GRAPH_SELFTEST_PORT", "31877")))
SELFTEST_FAULT = Stage(
    "selftest_fault", pytest_cmd("gpu", SELFTEST, "-k", "upstream"), "SELFTEST_TMO", 240, 100,
    needs_attn_pair=True,
    env=(("VERIFY_GRAPH_SELFTEST_MODEL", "llama-pair-attn"), ("VERIFY_GRAPH_SELFTEST_PORT", "31878"),
         ("SGLANG_VERIFY_GRAPH_TEST_FAULT", Arg("SELFTEST_FAULT", "causal_plus_one"))))


def _reliab(name: str, k: str, est_s: int) -> Stage:
    return Stage(name, pytest_cmd("server", RELIAB, "-k", k, stop_first=False), "RELIAB_TMO", 300, est_s,
                 needs_pair=True)


# one test of test_reliability_e2e.py each (so they can run at once); est: at once with 9 others
RELIAB_KV1 = _reliab("reliab_kv1", "kv and not 64", 250)     # KV accounting, page size 1: 252 s
RELIAB_KV64 = _reliab("reliab_kv64", "kv and 64", 265)       # page size 64: 265 s
RELIAB_MIX = _reliab("reliab_mix", "mix", 340)               # feature mix: 338 s
RELIAB_SAMPLING = _reliab("reliab_sampling", "sampling", 300)  # sampling: over 300 s on a cold FlashInfer cache

_SAN_KERNEL = Stage(  # memcheck on 4 kernel cases: page-edge lengths 63..129 and mixed lengths, ndt 3, both shapes
    "sanitizer_kernel",
    pytest_cmd("gpu", "test/gpu/test_chain_kernel_gpu.py", "-k", "(seq_lens2 or seq_lens3) and (3-llama8b or 3-kimi_tp8)"),
    "SANITIZER_KERNEL_TMO", 200, 60, alone=True, memcheck="kernel")
_SAN_SERVER = Stage(  # the self-test server with every process under memcheck, a 4..32-token burst (~1.5 s per verify step)
    "sanitizer_server", pytest_cmd("gpu", SELFTEST, "-k", "graph_equals or page_boundary"),
    "SANITIZER_SERVER_TMO", 480, 90, alone=True, memcheck="server",
    env=(("VERIFY_GRAPH_SERVER_TIMEOUT", Arg("SANITIZER_SERVER_WAIT", "420")),
         ("VERIFY_GRAPH_SELFTEST_TOKENS", Arg("SANITIZER_TOKENS", "4")),
         ("VERIFY_GRAPH_SELFTEST_REQ_TIMEOUT", "900"), ("VERIFY_GRAPH_SELFTEST_PORT", "31873")))
SANITIZER = Group("sanitizer", (_SAN_KERNEL, _SAN_SERVER))  # both: 148 s alone

BENCH_ST = Stage(  # --quick (llama-small, 1k, bs 1, 32 tokens): 3 engine starts of ~30-40 s; the full
    # llama-8b default (BENCH_ARGS="") 210 s
    "bench", ("python3", "bench/verify.py", "--out", "{work}/bench_results.json", "--log-dir", "{logs}/bench",
              "--models-dir", "{models}", "--mode-timeout", Arg("BENCH_MODE_TMO", "150")),
    "BENCH_TMO", 270, 120, kind="bench", extra=Arg("BENCH_ARGS", "--quick"), alone=True, report="bench",
    results="bench_results.json")
KBENCH_ST = Stage(  # one verify layer's attention op, CUDA-graph replays: 109 s for 18 Kimi MLA points with --block-rows 16 32
    "kbench", ("python3", "bench/kernel.py", "--out", "{work}/kernel_results.json"),
    "KBENCH_TMO", 240, 110, kind="bench", extra=Arg("KBENCH_ARGS"), alone=True, report="kbench",
    results="kernel_results.json")
CAPTURE_ST = Stage(  # repeated engine starts: 316 s for 3 repeats x 2 modes on llama-8b
    "capture", ("python3", "bench/capture.py", "--out", "{work}/capture_results.json", "--log-dir",
                "{logs}/capture", "--mode-timeout", Arg("BENCH_MODE_TMO", "150"), "--models-dir", "{models}"),
    "CAPTURE_TMO", 300, 320, kind="bench", extra=Arg("CAPTURE_ARGS"), alone=True, report="capture",
    results="capture_results.json")

SPEEDUP_ST = Stage(  # est: measured 438 s on the H200 with a warm kernel cache (bench_speedup.py's own
    # ESTIMATE for its default grid: 463 s); a cold kernel cache adds ~60 s; SPEEDUP_ARGS="--repeats 1"
    # for a third of the points' time
    "speedup", ("python3", "bench/speedup.py", "--out", "{work}/speedup_results.json", "--md",
                "{logs}/speedup/speedup_table.md", "--log-dir", "{logs}/speedup", "--pair-dir", "{models}",
                "--mode-timeout", Arg("SPEEDUP_MODE_TMO", "300")),
    "SPEEDUP_TMO", 540, 440, kind="bench", extra=Arg("SPEEDUP_ARGS"), alone=True, report="speedup",
    results="speedup_results.json")

DEMO_ST = Stage(  # three server starts (~60-140 s each, the first compiles Triton on a cold cache) + ~10 s of requests each
    "demo", ("python3", "-m", "bench.demo.cli", "--workdir", "{work}/demo", "--out",
             "{work}/demo_results.json"),
    "DEMO_TMO", 480, 250, kind="bench", extra=Arg("DEMO_ARGS"), alone=True, report="demo",
    results="demo_results.json")

# ------------------------------------------------------------------------------ the Kimi-K2.5 shard
SHARD = "kimi-k25-shard"
SHARD_E2E_COMMON = "--mem-fraction-static 0.7 --cuda-graph-bs-decode 1 4 8"
"""The shard's server flags beside the e2e tier's own: 71.7 GiB of weights leave 26 GiB of KV
pool (374k tokens) and 42 GiB for graphs and activations at 0.7 of an H200
(``shard_bytes.kv_tokens_at``); three decode buckets cover concurrency 1-8 (2 pads to 4, 5-7 to 8)."""
SHARD_JIT_ST = Stage(  # returns at once; the builds (~4 min of nvcc for moe_wna16_marlin, cold) run on in the background
    "shard_jit", ("python3", "test/run_suite.py", "--jit-build", "start", "{jit}"), "SHARD_JIT_TMO", 60, 5,
    kind="bench", report="jit")
SHARD_JIT_WAIT_ST = Stage(  # 0 s when the build ended during the triton stage; a fresh machine builds here (~4 min)
    "shard_jit_wait", ("python3", "test/run_suite.py", "--jit-build", "wait", "{jit}"), "SHARD_JIT_WAIT_TMO", 420, 10,
    kind="bench", report="jit", alone=True)


def _shard_e2e(name: str, moe_args: str, est_s: int) -> Stage:
    """The e2e tier (ours / upstream / plain, counters at concurrency 1-8, greedy parity 16 prompts x
    64 tokens) on kimi-k25-shard with num_steps 3 (4 draft tokens), one server at a time."""
    return Stage(
        name, pytest_cmd("server", E2E), "SHARD_E2E_TMO", 545, est_s, extra=Arg("E2E_ARGS"), e2e_report=True,
        alone=True, env=(("E2E_MODEL", Arg("SHARD_MODEL", SHARD)), ("E2E_VOCAB", "20480"),
                         ("E2E_STEPS", Arg("SHARD_STEPS", "3")), ("E2E_PARITY_TOKENS", Arg("SHARD_TOKENS", "64")),
                         ("E2E_LAUNCH_TIMEOUT", Arg("SHARD_LAUNCH_TMO", "400")),
                         ("E2E_PARITY_TIE_TOL", Arg("SHARD_TIE_TOL", "0")),
                         ("E2E_SERVER_ARGS", Arg(f"{name.upper()}_ARGS", f"{moe_args} {SHARD_E2E_COMMON}".strip()))))


# est (not measured): 3 server starts of ~90-150 s each (dummy init is quick; capture of 61 layers x
# 3 buckets for decode, verify, draft, draft-extend; the first start of a job compiles Triton's
# kernels, +60-90 s cold) + ~60 s of requests (parity 3 x 16 x 64 tokens, concurrency 1-8)
SHARD_E2E_TRITON_ST = _shard_e2e("shard_e2e_triton", "--moe-runner-backend triton", 480)
SHARD_E2E_MARLIN_ST = _shard_e2e("shard_e2e_marlin", "", 420)  # default MoE backend: Marlin WNA16
SHARD_MARLIN = Group("shard_marlin_e2e", (SHARD_JIT_WAIT_ST, SHARD_E2E_MARLIN_ST))

SHARD_SWEEP = ("--model kimi-k25-shard --steps 2,3 --contexts 1024,4096,16384 --batch-sizes 1,4,8,16,32 "
               "--prefix-cache --mem 0.85 --moe-runner-backend triton --cuda-graph-bs 1,4,8,16,32")
"""The full per-phase sweep: plain once, upstream and ours per num_steps (5 engines); 16k x bs 32
needs 32 x 16.4k tokens of pool (0.85: 676k tokens)."""
SHARD_SWEEP_LEAN = ("--model kimi-k25-shard --steps 3 --contexts 1024,16384 --batch-sizes 1,32 --new-tokens 32 "
                    "--prefix-cache --mem 0.85 --moe-runner-backend triton --cuda-graph-bs 1,32")
"""The same at num_steps 3, the corner points only (3 engines, one 10-minute call)."""


def _shard_bench(name: str, args: str, tmo_s: int, est_s: int, mode_tmo: str) -> Stage:
    return Stage(
        name, ("python3", "bench/verify.py", "--out", f"{{work}}/{name}_results.json", "--log-dir",
               f"{{logs}}/{name}", "--models-dir", "{models}", "--mode-timeout", Arg("SHARD_BENCH_MODE_TMO", mode_tmo)),
        f"{name.upper()}_TMO", tmo_s, est_s, kind="bench", extra=Arg(f"{name.upper()}_ARGS", args), alone=True,
        report="bench", results=f"{name}_results.json")


# est (not measured): per engine ~90-150 s to start (5 buckets) + prefill of 32 prompts per context
# (688k tokens for 1k/4k/16k) + 15 points x ~70 tokens; the sweep does not fit one 10-minute call
SHARD_BENCH_ST = _shard_bench("shard_bench", SHARD_SWEEP, 1500, 1080, "600")
SHARD_BENCH_LEAN_ST = _shard_bench("shard_bench_lean", SHARD_SWEEP_LEAN, 545, 480, "300")
SHARD_WRAPPED_ST = Stage(  # est (not measured): one engine start ~120-150 s + 2 points; sglang.Engine, text model only
    "shard_wrapped", ("python3", "bench/verify.py", "--out", "{work}/shard_wrapped_results.json",
                      "--log-dir", "{logs}/shard_wrapped", "--models-dir", "{models}", "--mode-timeout", "400",
                      "--require-replays"),
    "SHARD_WRAPPED_TMO", 450, 180, kind="bench", alone=True, report="bench", results="shard_wrapped_results.json",
    extra=Arg("SHARD_WRAPPED_ARGS", "--model kimi-k25-shard-wrapped --modes ours --steps 3 --contexts 1024 "
              "--batch-sizes 1,8 --new-tokens 32 --mem 0.7 --moe-runner-backend triton --cuda-graph-bs 1,8"))

SHARD_FLOOR_ARGS = ("--model kimi-k25-shard --modes plain,ours --steps 2 --contexts 1024,4096 --batch-sizes 8,24 "
                    "--new-tokens 48 --prefix-cache --mem 0.85 --moe-runner-backend triton --cuda-graph-bs 8,24")
"""3 draft tokens at bs 8 against plain decode at bs 8 and at bs 24: a decode step over the verify's
24 tokens (the same GEMM and MoE rows, decode's attention) measured in the same run."""
# est: measured 210 s on the H200 (2 engines: 111 and 96 s, starts of 53 and 41 s)
SHARD_FLOOR_ST = _shard_bench("shard_floor", SHARD_FLOOR_ARGS, 480, 210, "230")
SHARD_PARTS_ST = Stage(  # est: measured 39 s on the H200 (one shard layer, 11 timed points of 60 replays)
    "shard_parts", ("python3", "bench/parts.py", "--out", "{work}/shard_parts_results.json"),
    "SHARD_PARTS_TMO", 150, 40, kind="bench", alone=True, results="shard_parts_results.json",
    extra=Arg("SHARD_PARTS_ARGS", "--batch-sizes 8 --contexts 1024,4096 --ndt 3"))
SHARD_CAPTURE_ARGS = ("--model kimi-k25-shard --repeats 3 --steps 2 --batch-sizes 1,4,8,16,32 "
                      "--cuda-graph-bs 1,4,8,16,32 --mem 0.85 --moe-runner-backend triton")
"""Capture time of the shard's verify graphs, ours vs upstream, over alternating engine starts
(the buckets of the shard sweep)."""
# est: measured 435 s on the H200 (6 engine starts of 58-84 s: dummy init of 72 GiB, 61-layer captures)
SHARD_CAPTURE_ST = Stage(
    "shard_capture", ("python3", "bench/capture.py", "--out", "{work}/shard_capture_results.json",
                      "--log-dir", "{logs}/shard_capture", "--mode-timeout", "200", "--models-dir", "{models}"),
    "SHARD_CAPTURE_TMO", 520, 450, kind="bench", alone=True, report="capture",
    results="shard_capture_results.json", extra=Arg("SHARD_CAPTURE_ARGS", SHARD_CAPTURE_ARGS))

_SHARD_REST = ("--model kimi-k25-shard --new-tokens 48 --prefix-cache --mem 0.85 --moe-runner-backend triton "
               "--cuda-graph-bs 16,32 --batch-sizes 16,32")
"""The shard sweep at bs 16 and 32 (docs/benchmarks.md section 7.6), one 10-minute call each; merge
the results with ``bench_verify.py --merge``."""
# est: measured 273 s on the H200 (3 engines of 88-94 s, starts of 33-37 s)
SHARD_REST_WIDE_ST = _shard_bench("shard_rest_wide", "--steps 2 --contexts 1024,4096 " + _SHARD_REST, 545, 275, "180")
# est: measured 503 s on the H200, ours 230 s; plain reached its 270 s limit at bs 32 with a cold capture
# (44.8 s), warm it reads ~230 s (ours' time; a plain bs-32-only engine took 135 s)
SHARD_REST_16K_ST = _shard_bench("shard_rest_16k", "--steps 2 --contexts 16384 --modes plain,ours " + _SHARD_REST,
                                 545, 470, "270")
# est: measured 244 s (upstream at num_steps 2) and 228 s (ours at num_steps 3) on the H200
SHARD_REST_16K_UP_ST = _shard_bench("shard_rest_16k_up", "--steps 2 --contexts 16384 --modes upstream " + _SHARD_REST,
                                    280, 245, "270")
SHARD_REST_16K_S3_ST = _shard_bench("shard_rest_16k_s3", "--steps 3 --contexts 16384 --modes ours " + _SHARD_REST,
                                    280, 230, "270")

# ------------------------------------------------------------------------------ the suites
SUITES: dict[str, Suite] = {
    "demo": Suite(
        "the main job: python -m bench demo (plain / upstream EAGLE-3 / ours on the "
        "stock server, concurrency 1 and 8, counters, one table; DEMO_ARGS, e.g. --model kimi-small)",
        250, (DEMO_ST,)),
    "kernel": Suite(
        "the chain verify attention kernel in bf16 on the real shapes (Llama-8B GQA, Kimi MLA) against "
        "a float64 reference: page edges, mixed lengths, 2-6 draft tokens, both row tilings", 45, (KERNEL_ST,)),
    "selftest": Suite(
        "the verify graph against the eager forward inside a real server, with poisoned buffers and "
        "padded buckets; then NaN in the padded rows with SGLang's NaN detection on", 215, (SELFTEST_ST, NAN_ST)),
    "e2e": Suite(
        "the stock server with the flag vs upstream's graph vs no speculation: counters, concurrency "
        "1-8, greedy parity (E2E_MODEL, E2E_STEPS, E2E_BACKEND)", 220, (E2E_ST,)),
    "mla": Suite(  # at once: the longest of 10 stages took 408 s, 551 s for the call (2026-12-01)
        "MLA targets: the self-test with the MLA drafter and the KimiK25 wrapper, our runner around "
        "flashmla / flashinfer's own verify, and the e2e tier per target x backend", 420,
        (MLA, NATIVE, E2E_MLA), parallel=True),
    "reliability": Suite(  # at once: the longest took 446 s; then compute-sanitizer alone, 148 s
        "accept length ours = upstream = eager (and at num_steps 1/2/5), KV accounting at page 1 and "
        "64, feature mix, sampling; then compute-sanitizer memcheck on kernel cases and a server", 600,
        (ACCEPT_ST, ACCEPT_SHAPE_ST, RELIAB_KV1, RELIAB_KV64, RELIAB_MIX, RELIAB_SAMPLING, SANITIZER),
        parallel=True, total_s=1000),
    "accept_attn": Suite(  # est (not measured): the longest of the 3 stages, +50% for running at once
        "the attention pair (its greedy tokens go through the verify attention): greedy parity ours / "
        "upstream / plain with every accepted count at page 1 and 64, and ours under each chain-kernel "
        "test fault (SGLANG_VERIFY_GRAPH_TEST_FAULT) changing every output as simulated; the self-test's "
        "upstream reference on the pair, and seeing a test fault", 300,
        (ACCEPT_ATTN_P1, ACCEPT_ATTN_P64, ACCEPT_ATTN_FAULT, SELFTEST_ATTN, SELFTEST_FAULT), parallel=True),
    "profile": Suite(
        "the per-phase profile on a real server: profile lines, counters, /metrics, the advisor on "
        "the log (PROFILE_MODEL)", 165, (PROFILE_ST,)),
    "bench": Suite(
        "verify / decode GPU time per replay for ours, upstream and plain engines (bench_verify.py "
        "--quick unless BENCH_ARGS is set)", 120, (BENCH_ST,)),
    "speedup": Suite(
        "measured EAGLE-3 speed-up with set accept lengths (1.5-3.0 at num_steps 3) on the Llama-3.1-8B-"
        "shape pair (bench/models/accept_pair.py --shape llama8b, built first): plain / upstream / ours "
        "tok/s at bs 1, 4, 16 x ctx 1k, 8k, and the advisor's prediction against it (SPEEDUP_ARGS)",
        440, (SPEEDUP_ST,), total_s=595),
    "kbench": Suite(
        "one verify layer's attention op: decode / upstream / ours in CUDA-graph replays (KBENCH_ARGS)",
        110, (KBENCH_ST,)),
    "capture": Suite(
        "verify-graph capture time and memory over repeated engine starts, ours vs upstream "
        "(CAPTURE_ARGS)", 320, (CAPTURE_ST,)),
    # the Kimi-K2.5 TP-8 shard (72 GiB of dummy weights): one server at a time; estimates, not measured
    "shard_triton": Suite(
        "Kimi-K2.5 TP-8 shard, triton WNA16 MoE: the Marlin JIT build started in the background, then "
        "ours / upstream / plain on the stock server: parity 16 x 64, replays == verify steps at c=1-8",
        485, (SHARD_JIT_ST, SHARD_E2E_TRITON_ST), total_s=595),
    "shard_marlin": Suite(
        "Kimi-K2.5 TP-8 shard, default (Marlin WNA16) MoE: wait for the Marlin JIT build, then the same "
        "parity and counters", 430, (SHARD_MARLIN,), total_s=595),
    "shard_wrapped": Suite(
        "the KimiK25ForConditionalGeneration-wrapped shard through sglang.Engine: ours replays every "
        "verify step (bench_verify.py --require-replays)", 180, (SHARD_WRAPPED_ST,)),
    "shard": Suite(
        "the shard suites in one job (longer than a 10-minute call: raise TOTAL_S): triton, the wrapped "
        "shard while Marlin builds, Marlin", 485 + 180 + 430, ("shard_triton", "shard_wrapped", "shard_marlin"),
        total_s=1250),
    "shard_bench": Suite(
        "per-phase GPU time on the shard, plain / upstream / ours, num_steps 2 and 3, bs 1-32 x ctx "
        "1k-16k (SHARD_BENCH_ARGS; longer than a 10-minute call)", 1080, (SHARD_BENCH_ST,), total_s=1600),
    "shard_floor": Suite(
        "3 draft tokens at bs 8 on the shard against plain decode at bs 8 and 24 (the verify's token "
        "count), then one shard layer's parts (attention, routed MoE, dense) at bs 8, ctx 1k and 4k",
        210 + 40, (SHARD_FLOOR_ST, SHARD_PARTS_ST), total_s=595),
    "shard_capture": Suite(
        "capture time and memory of the shard's verify graphs, ours vs upstream, 3 alternating starts "
        "each (SHARD_CAPTURE_ARGS)", 450, (SHARD_CAPTURE_ST,), total_s=595),
    "shard_rest_wide": Suite(
        "the shard sweep at bs 16 and 32, 1: num_steps 2 x ctx 1k and 4k, plain / upstream / ours "
        "(SHARD_REST_WIDE_ARGS)", 275, (SHARD_REST_WIDE_ST,), total_s=595),
    "shard_rest_16k": Suite(
        "the shard sweep at bs 16 and 32, 2: num_steps 2 x ctx 16k, plain and ours "
        "(SHARD_REST_16K_ARGS)", 470, (SHARD_REST_16K_ST,), total_s=595),
    "shard_rest_16k_up": Suite(
        "the shard sweep at bs 16 and 32, 3: upstream at num_steps 2 and ours at num_steps 3, ctx 16k", 475, (SHARD_REST_16K_UP_ST, SHARD_REST_16K_S3_ST), total_s=595),
    "shard_bench_lean": Suite(
        "per-phase GPU time on the shard, num_steps 3, bs 1 and 32 x ctx 1k and 16k (SHARD_BENCH_LEAN_ARGS)",
        480, (SHARD_BENCH_LEAN_ST,), total_s=595),
}


class SuiteError(ValueError):
    """A bad suite name or setting: the message is the one line to print."""


def _suite_stages(name: str, environ: Mapping[str, str]) -> list[Stage]:
    out: list[Stage] = []
    for p in SUITES[name].parts:
        out += _suite_stages(p, environ) if isinstance(p, str) else p.stages(environ)
    return out


_ALL = ("demo", "kernel", "selftest", "mla", "reliability", "accept_attn", "e2e", "profile", "kbench", "bench",
        "speedup")
SUITES["all"] = Suite(  # one stage at a time: the sum of the stages' estimates
    "every suite above, one stage at a time, except capture (repeated engine starts: run it alone) "
    "and the shard suites (72 GiB models, their own calls); raise TOTAL_S",
    sum(s.est_s for n in _ALL for s in _suite_stages(n, {})), _ALL)
# the stages, cases and groups of the suites, each addressable by its name
_UNITS = {p.name: p for s in SUITES.values() for p in s.parts if not isinstance(p, str)}
# settings that are no longer read, each with what replaces it
RENAMED = {"GPU_TMO": "KERNEL_TMO and SELFTEST_TMO (the kernel and selftest suites)",
           "RELIAB_ARGS": "a stage name (reliab_kv1, reliab_kv64, reliab_mix, reliab_sampling)"}


def valid_names_line() -> str:
    return (f"valid suites: {', '.join(SUITES)}; stages: {', '.join(_UNITS)}; '{WAIT}' (barrier); "
            "'-NAME' leaves a suite or stage out")


def expand(names: list[str], environ: Mapping[str, str]) -> list:
    """Stages (and WAIT barriers) in run order, each stage once, ``-NAME`` ones left out."""
    plan: list = []
    excluded: set[str] = set()
    for raw in names:
        name = raw[1:] if raw.startswith("-") else raw
        if name in SUITES:
            stages = _suite_stages(name, environ)
        elif name in _UNITS:
            stages = _UNITS[name].stages(environ)
        elif name == WAIT and not raw.startswith("-"):
            plan.append(WAIT)
            continue
        else:
            raise SuiteError(f"unknown suite '{raw}' (SUITE=\"{' '.join(names)}\"): {valid_names_line()}")
        if raw.startswith("-"):
            excluded |= {s.name for s in stages}
        else:
            plan += stages
    seen: set[str] = set()
    out = []
    for s in plan:
        if s == WAIT or (s.name not in seen and s.name not in excluded):
            out.append(s)
            if s != WAIT:
                seen.add(s.name)
    if not any(s != WAIT for s in out):
        raise SuiteError(f"SUITE=\"{' '.join(names)}\" leaves no stage to run: {valid_names_line()}")
    return out


def _int_env(environ: Mapping[str, str], var: str, default: int, lo: int = 0) -> int:
    raw = environ.get(var)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        v = lo - 1
    if v < lo:
        raise SuiteError(f"{var}={raw!r}: want a whole number >= {lo} (seconds); fix: set {var} to e.g. {default}")
    return v


@dataclass
class Settings:
    names: list[str]
    plan: list
    dry: bool
    parallel: bool
    total_s: int
    reserve_s: int
    parallel_tmo: int
    stagger_s: int
    shared_tokens: int
    limits: dict[str, int] = field(default_factory=dict)  # stage name -> its *_TMO value when set


def settings(names: list[str], environ: Mapping[str, str]) -> Settings:
    """Check the names and every setting the plan reads; :class:`SuiteError` names the first bad one."""
    for var, instead in RENAMED.items():
        if environ.get(var):
            raise SuiteError(f"{var} is no longer read: use {instead}")
    plan = expand(names, environ)
    stages = [s for s in plan if s != WAIT]
    par_raw = environ.get("PARALLEL", "")
    if par_raw not in ("", "0", "1"):
        raise SuiteError(f"PARALLEL={par_raw!r}: want 1 (stages at once) or 0 (one at a time)")
    named = [n for n in names if n in SUITES]
    parallel = par_raw == "1" or (par_raw == "" and any(SUITES[n].parallel for n in named))
    whole = not any(n.startswith("-") for n in names)
    suite_total = max([SUITES[n].total_s or 0 for n in named] + [0]) if whole else 0
    st = Settings(
        names, plan, environ.get("DRY_RUN") == "1", parallel,
        _int_env(environ, "TOTAL_S", suite_total or DEFAULT_TOTAL_S, 1),
        _int_env(environ, "RESERVE_S", DEFAULT_RESERVE_S),
        _int_env(environ, "PARALLEL_TMO", 520, 1), _int_env(environ, "PARALLEL_STAGGER_S", 4),
        _int_env(environ, "SHARED_GPU_TOKENS", 65536, 1))
    for s in stages:
        if environ.get(s.tmo_env):
            st.limits[s.name] = _int_env(environ, s.tmo_env, s.tmo_s, 1)
    return st


def estimate_s(st: Settings) -> int:
    """The selection's estimated seconds: a suite named in full counts its own estimate (at once
    where it is parallel); any other stage its own, the longest one for stages started at once."""
    covered: set[str] = set()
    total = 0
    if all(not n.startswith("-") for n in st.names):
        for n in st.names:
            if n in SUITES:
                members = {s.name for s in _suite_stages(n, {})}
                if not members & covered:
                    total += SUITES[n].est_s
                covered |= members
    together, par = 0, st.parallel
    for s in st.plan:
        if s == WAIT or (par and s.alone):
            total, together, par = total + together, 0, False
        if s == WAIT or s.name in covered:
            continue
        if par:
            together = max(together, s.est_s)
        else:
            total += s.est_s
    return total + together


def _minutes(s: int) -> str:
    return f"~{s // 60} min" if s >= 60 else f"~{s} s"


def table() -> str:
    lines = [f"{'suite':<12} {'est':>8}  purpose / stages (limit variable, default s)"]
    for name, s in SUITES.items():
        lines.append(f"{name:<12} {_minutes(s.est_s):>8}  {s.purpose}" + (" [stages at once]" if s.parallel else ""))
        for p in s.parts:
            if isinstance(p, str):
                continue
            if isinstance(p, Cases):
                lines.append(f"{'':<23}{p.name}: {p.doc}, default {p.default}")
                continue
            for x in p.stages({}):
                env = " ".join(f"{k}={v if isinstance(v, str) else '$' + v.var}" for k, v in x.env)
                lines.append(f"{'':<23}{x.name}: {env + ' ' if env else ''}"
                             f"{' '.join(a if isinstance(a, str) else '$' + a.var for a in x.cmd)}"
                             f"{' $' + x.extra.var if x.extra else ''} ({x.tmo_env} {x.tmo_s}; est {x.est_s} s)")
        if all(isinstance(p, str) for p in s.parts):
            lines.append(f"{'':<23}= {' '.join(s.parts)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the runner
class Runner:
    def __init__(self, st: Settings, environ: Mapping[str, str]):
        self.st, self.environ = st, dict(environ)
        self.work = environ.get("GPUJOB_DIR") or "/tmp/gpujob"
        self.logs = os.path.join(self.work, "logs")
        self.out = environ.get("OUT") or "/tmp/gpujob_out"
        self.models = environ.get("MODELS_DIR") or "/tmp/models"
        self.jit = environ.get("JIT_BUILD_DIR") or os.path.join(os.path.dirname(self.work), "jitbuild")
        self.t0 = float(environ.get("GPUJOB_T0") or time.time())
        self.summary = os.path.join(self.work, "summary.txt")
        self.rc: dict[str, object] = {}
        self.order: list[str] = []
        self.background: list[threading.Thread] = []
        self.parallel = st.parallel
        self.lock = threading.Lock()
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.out, exist_ok=True)

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            with open(self.summary, "a") as f:
                f.write(text + "\n")

    def elapsed(self) -> int:
        return int(time.time() - self.t0)

    def fmt(self, s: str) -> str:
        return s.format(logs=self.logs, work=self.work, models=self.models, jit=self.jit)

    def argv(self, s: Stage) -> list[str]:
        out: list[str] = []
        for c in s.cmd:
            out += c.expand(self.environ) if isinstance(c, Arg) else [self.fmt(c)]
        if self.st.dry:
            out.append("--collect-only" if s.kind == "pytest" else "--dry-run")
        return out + (s.extra.expand(self.environ) if s.extra else [])

    def stage_env(self, s: Stage, shared: bool) -> dict[str, str]:
        env = dict(self.environ, E2E_LOG_DIR=os.path.join(self.logs, "e2e", s.name), PYTHONUNBUFFERED="1")
        env.pop("VERIFY_GRAPH_SHARED_GPU_TOKENS", None)
        if shared:  # stages share the GPU: cap each test server's KV pool (test/server_utils.py)
            env["VERIFY_GRAPH_SHARED_GPU_TOKENS"] = str(self.st.shared_tokens)
        for k, v in s.env:
            env[k] = " ".join(v.expand(self.environ)) if isinstance(v, Arg) else self.fmt(v)
        return env

    # -- one stage
    def _body(self, s: Stage, argv: list[str], env: dict, tmo: int) -> None:
        t1 = time.time()
        set_env = " ".join(f"{k}={shlex.quote(env.get(k, ''))}" for k, _ in s.env)
        print(f"== stage {s.name} (limit {tmo}s): {set_env + ' ' if set_env else ''}{' '.join(argv)}", flush=True)
        with open(os.path.join(self.logs, f"{s.name}.log"), "w") as log:
            if set_env:  # what the stage's own variables came to (the tests read them)
                log.write(f"env: {set_env}\n")
                log.flush()
            p = subprocess.Popen(["timeout", "-k", "15", str(tmo), *argv], stdout=log, stderr=subprocess.STDOUT,
                                 env=env, cwd=ROOT, start_new_session=True)  # own process group
            rc = p.wait()
        try:  # whatever the stage left running (its process group)
            os.killpg(p.pid, signal.SIGKILL)
            time.sleep(3)
        except (ProcessLookupError, PermissionError):
            pass
        self.rc[s.name] = rc
        self.say(f"== stage {s.name}: rc={rc} in {int(time.time() - t1)}s (limit {tmo}s)"
                 + (" TIMED OUT" if rc == 124 else ""))

    def run_stage(self, s: Stage) -> None:
        self.order.append(s.name)
        if s.alone:
            self.barrier()
        missing = [f for f in s.files if not os.path.exists(os.path.join(ROOT, f))]
        if missing:
            self.rc[s.name] = "absent"
            self.say(f"== stage {s.name}: SKIPPED (no {', '.join(missing)})")
            return
        argv = self.argv(s)
        if s.memcheck:
            san = shutil.which("compute-sanitizer") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))), "")
            if not san:
                self.rc[s.name] = "absent"
                self.say(f"== stage {s.name}: SKIPPED (compute-sanitizer not found)")
                return
            wrap = [san, "--tool", "memcheck", "--target-processes", "all", "--error-exitcode", "99",
                    "--log-file", os.path.join(self.logs, f"memcheck_{s.memcheck}.%p.txt")]
        left = int(self.t0 + self.st.total_s - self.st.reserve_s - time.time())
        if left < MIN_LEFT_S:
            self.rc[s.name] = "skipped"
            self.say(f"== stage {s.name}: SKIPPED ({left}s left of TOTAL_S={self.st.total_s})")
            return
        tmo = self.st.limits.get(s.name) or (self.st.parallel_tmo if self.parallel else s.tmo_s)
        tmo = min(tmo, left)
        env = self.stage_env(s, shared=self.parallel)
        if s.memcheck == "kernel":
            argv = wrap + argv
        elif s.memcheck == "server":
            env["VERIFY_GRAPH_SERVER_WRAPPER"] = " ".join(wrap)
        if self.parallel:
            t = threading.Thread(target=self._body, args=(s, argv, env, tmo))
            t.start()
            self.background.append(t)
            time.sleep(self.st.stagger_s)
        else:
            self._body(s, argv, env, tmo)

    def barrier(self) -> None:
        """Wait for the stages running at once; every later stage runs alone."""
        if not self.parallel:
            return
        self.say(f"== PARALLEL=1: {len(self.background)} stages running at once "
                 f"(KV pools capped at {self.st.shared_tokens} tokens per server)")
        for t in self.background:
            t.join()
        self.background, self.parallel = [], False

    # -- the whole plan
    def make_pair(self) -> None:
        """The constructed-agreement pairs (real weights, ~100 MB each) for the stages that need
        them: the plain pair, the attention pair (``--attention``)."""
        for flag, extra in (("needs_pair", []), ("needs_attn_pair", ["--attention"])):
            if not any(s != WAIT and getattr(s, flag) for s in self.st.plan):
                continue
            with open(os.path.join(self.logs, "make_models.txt"), "a") as log:
                r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "accept_pair.py"), self.models,
                                    *extra], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            if r.returncode:
                tail = open(os.path.join(self.logs, "make_models.txt"), errors="replace").read().splitlines()[-3:]
                self.say(f"accept_pair {' '.join(extra)} FAILED: {' '.join(tail)}".replace("  ", " "))

    def run(self) -> int:
        st = self.st
        left = int(self.t0 + st.total_s - st.reserve_s - time.time())
        est = estimate_s(st)
        stages = [s.name for s in st.plan if s != WAIT]
        self.say(f"== suites {' '.join(st.names)}: {len(stages)} stages, estimated {_minutes(est)} ({est} s, warm "
                 f"kernel cache); {left}s left of TOTAL_S={st.total_s} - RESERVE_S={st.reserve_s}"
                 + ("; stages at once (PARALLEL=1)" if st.parallel else ""))
        if est > left:
            self.say(f"   WARNING: the estimate exceeds the budget: stages past it are skipped; raise TOTAL_S or "
                     f"run fewer suites")
        self.make_pair()
        for s in st.plan:
            if s == WAIT:
                self.barrier()
            else:
                self.run_stage(s)
        self.barrier()
        self.memcheck_verdicts()
        self.report()
        self.say(f"== {' '.join(st.names)}: done at {self.elapsed()}s; stages: "
                 + " ".join(f"{k}={self.rc.get(k)}" for k in self.order))
        return 0 if all(self.rc.get(k) in (0, "absent") for k in self.order) else 1

    def memcheck_verdicts(self) -> None:
        """A passing sanitizer stage also needs every memcheck report to hold ``ERROR SUMMARY: 0
        errors``: a frontend killed with its server writes none."""
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        import memcheck_verdict

        for s in (x for x in self.st.plan if x != WAIT and x.memcheck):
            if self.rc.get(s.name) != 0:
                continue
            v, detail = memcheck_verdict.verdict(os.path.join(self.logs, f"memcheck_{s.memcheck}"))
            self.say(f"-- {s.name} memcheck: {v}: {detail}")
            if v == "absent" and self.st.dry:  # a dry run starts no server
                continue
            if v != "ok":
                self.rc[s.name] = f"memcheck_{v}"

    def report(self) -> None:
        byname = {s.name: s for s in self.st.plan if s != WAIT}
        for name in self.order:
            s, log = byname[name], os.path.join(self.logs, f"{name}.log")
            if s.kind != "pytest" or not os.path.exists(log):
                continue
            lines = open(log, errors="replace").read().splitlines()
            res = [ln for ln in lines if re.search(r"(passed|failed|error|skipped|no tests ran|collected|deselected)", ln)
                   and re.search(r" in [0-9.]+s", ln)]
            self.say(f"-- {name}: {res[-1] if res else ''}")
            for ln in [ln for ln in lines if re.match(r"(FAILED|ERROR) ", ln)][:8]:
                self.say(f"   {ln[:300]}")
            for ln in [ln for ln in lines if ln.startswith("E  ")][:6]:
                self.say(f"   {ln[:400]}")
        e2e_dir = os.path.join(self.logs, "e2e")
        for name in self.order:
            path = os.path.join(e2e_dir, name, "e2e_results.json")
            if not (byname[name].e2e_report and os.path.exists(path)):
                continue
            if name == "e2e":
                shutil.copy(path, self.out)
            self.say("\n".join(e2e_lines(path, name)[:12]))
        results = sorted(glob.glob(os.path.join(e2e_dir, "*", "*_results.json")))
        if results:  # every stage's results in one file ($OUT takes 8)
            with tarfile.open(os.path.join(self.out, "stage_results.tar.gz"), "w:gz") as tar:
                for r in results:
                    tar.add(r, arcname=os.path.relpath(r, e2e_dir))
        for name in self.order:
            s, log = byname[name], os.path.join(self.logs, f"{name}.log")
            if s.report and os.path.exists(log):
                self.bench_lines(s.report, open(log, errors="replace").read().splitlines())
            if s.results and os.path.exists(os.path.join(self.work, s.results)):
                shutil.copy(os.path.join(self.work, s.results), self.out)

    def bench_lines(self, report: str, lines: list[str]) -> None:
        def to_summary(ls):
            with self.lock, open(self.summary, "a") as f:
                f.writelines(ln + "\n" for ln in ls)

        if report in ("bench", "speedup"):  # mode status lines; the result tables with mode and meta lines
            for ln in [ln for ln in lines if ln.startswith(("BENCH mode ", "ESTIMATE "))]:
                self.say(ln[:300])
            keep = 90 if report == "bench" else 200  # speedup: its speed-up and advisor tables whole
            to_summary([ln[:400] for ln in lines if ln.startswith("RESULT ")][-keep:])
        elif report == "capture":  # one line per engine as it finished (kept if the stage timed out)
            for ln in [ln for ln in lines if ln.startswith("CAPTURE run ")]:
                self.say(ln[:300])
            to_summary([ln[:400] for ln in lines if ln.startswith("RESULT ")][-30:])
        elif report == "demo":  # the counters and the table (from the first counter line on)
            start = next((i for i, ln in enumerate(lines) if ln.startswith("counters ")), len(lines))
            to_summary([ln[:300] for ln in lines[start:]][-30:])
        elif report == "kbench":  # the kernel tables (everything after the per-point KERNEL lines)
            to_summary([ln[:300] for ln in lines if not ln.startswith("KERNEL {")][-60:])
        elif report == "jit":  # one line per module: started / built / failed, seconds, sizes
            for ln in [ln for ln in lines if ln.startswith("JIT ")]:
                self.say(ln[:300])


def e2e_lines(path: str, stage: str) -> list[str]:
    """Startup, parity, concurrency and counter lines of one e2e stage's ``e2e_results.json``."""
    try:
        r = json.load(open(path))
        out = [f"-- {stage} startup_s {r.get('startup_s')}"]
        for k, v in (r.get("parity") or {}).items():
            out.append(f"-- {stage} parity {k}: {v['identical']}/16 identical, {len(v['ties'])} near-ties; "
                       + (v["fails"] + v["ties"] + [""])[0][:300])
        for c, v in (r.get("concurrency") or {}).items():
            out.append(f"-- {stage} concurrency {c}: delta {v['delta']} spec_verify_ct sum {sum(v['spec_verify_ct'])}")
        s = r.get("ours_after_parity") or r.get("ours_at_start")
        if s:
            keys = ("runner", "capture_bs", "replays", "verify_steps", "fallback_total", "fallbacks")
            out.append(f"-- {stage} ours counters {({k: s.get(k) for k in keys})}")
        return out
    except Exception as ex:  # a malformed file: say so, keep the job going
        return [f"-- {stage} e2e_results.json unreadable: {type(ex).__name__}: {ex}"[:300]]


# ------------------------------------------------------------------------------ background JIT builds
JIT_MODULES = ("moe_wna16_marlin", "gptq_marlin_repack")
"""SGLang's JIT modules on the Marlin W4A16 MoE path (``jit_kernel/moe_wna16_marlin.py``, built per
activation dtype, here bf16: ``fused_marlin_moe``; ``jit_kernel/gptq_marlin_repack.py``: the
weight repack of ``CompressedTensorsWNA16MoE.process_weights_after_loading``). Loading the module
is what compiles it (``load_jit``: nvcc through tvm-ffi into ``$TVM_FFI_CACHE_DIR/<name>__arch_..``);
no op needs to run."""


def _jit_marker(d: str, module: str) -> str:
    return os.path.join(d, f"{module}.json")


def _jit_read(d: str, module: str) -> dict | None:
    try:
        with open(_jit_marker(d, module)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _jit_alive(d: str, module: str) -> bool:
    try:
        with open(os.path.join(d, f"{module}.pid")) as f:
            os.kill(int(f.read().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def _jit_line(module: str, m: dict) -> str:
    if m.get("rc") != 0:
        return f"JIT {module}: FAILED after {m.get('seconds')}s: {m.get('error', '')[:200]}"
    so = m.get("so") or {}
    mib = lambda b: f"{b / 2**20:.1f} MiB" if isinstance(b, (int, float)) else "?"  # noqa: E731
    return (f"JIT {module}: {'cached' if m.get('cached') else 'built'} in {m.get('seconds')}s; .so "
            f"{mib(so.get('bytes'))} (xz {mib(so.get('xz_bytes'))}) at {so.get('path')}")


def _jit_build_one(d: str, module: str) -> int:
    """Build one module in this process; write its marker (atomically, last)."""
    import glob as _glob
    import lzma
    import traceback

    t0 = time.time()
    res: dict = {"module": module, "started": t0, "cache_dir": os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")}
    try:
        if module not in JIT_MODULES:
            raise ValueError(f"unknown JIT module {module!r}; known: {', '.join(JIT_MODULES)}")
        cache = os.path.expanduser(res["cache_dir"])
        before = set(_glob.glob(os.path.join(cache, f"sgl_kernel_jit_{module}*", "*.so")))
        import torch

        if module == "moe_wna16_marlin":
            from sglang.jit_kernel.moe_wna16_marlin import _jit_moe_wna16_marlin_module

            build = lambda: _jit_moe_wna16_marlin_module(torch.bfloat16)  # noqa: E731
        else:
            from sglang.jit_kernel.gptq_marlin_repack import _jit_gptq_marlin_repack_module

            build = _jit_gptq_marlin_repack_module
        try:
            build()
        except Exception as ex:  # e.g. a carried .so that does not load here: clean build once more
            print(f"JIT {module}: {type(ex).__name__}: {str(ex)[:300]}; removing its build dirs, building again",
                  flush=True)
            for bd in _glob.glob(os.path.join(cache, f"sgl_kernel_jit_{module}*")):
                shutil.rmtree(bd, ignore_errors=True)
            before = set()
            build()
        sos = sorted(_glob.glob(os.path.join(cache, f"sgl_kernel_jit_{module}*", "*.so")), key=os.path.getmtime)
        res["cached"] = bool(sos) and sos[-1] in before
        if sos:
            with open(sos[-1], "rb") as f:
                data = f.read()
            res["so"] = {"path": sos[-1], "bytes": len(data), "xz_bytes": len(lzma.compress(data, preset=6))}
        res["rc"] = 0
    except BaseException as ex:  # noqa: BLE001 -- the marker must say why
        res["rc"] = 1
        res["error"] = f"{type(ex).__name__}: {ex}"[:1500]
        traceback.print_exc()
    res["seconds"] = round(time.time() - t0, 1)
    tmp = _jit_marker(d, module) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f, indent=1)
    os.replace(tmp, _jit_marker(d, module))
    print(_jit_line(module, res), flush=True)
    return res["rc"]


def jit_build(args: list[str]) -> int:
    """``--jit-build start|wait|run DIR [MODULE] [--dry-run]``: see the module docstring."""
    dry = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    if len(args) < 2 or args[0] not in ("start", "wait", "run"):
        print("usage: run_suite.py --jit-build start|wait|run DIR [MODULE] [--dry-run]", file=sys.stderr)
        return 2
    action, d = args[0], args[1]
    modules = args[2:] or list(JIT_MODULES)
    os.makedirs(d, exist_ok=True)
    if action == "run":
        return max(_jit_build_one(d, m) for m in modules)
    if dry:
        for m in modules:
            print(f"JIT {m}: DRY_RUN: would {action} {sys.executable} {os.path.abspath(__file__)} --jit-build run {d} {m}"
                  f" (setsid; log {os.path.join(d, m + '.log')}, marker {_jit_marker(d, m)})", flush=True)
        return 0
    if action == "start":
        for m in modules:
            done = _jit_read(d, m)
            if done and done.get("rc") == 0:
                print(_jit_line(m, done) + " (marker from an earlier job)", flush=True)
                continue
            if _jit_alive(d, m):
                print(f"JIT {m}: already building (pid file {os.path.join(d, m + '.pid')})", flush=True)
                continue
            if done:
                os.remove(_jit_marker(d, m))  # a failed build: try again
            with open(os.path.join(d, f"{m}.log"), "w") as log:
                p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--jit-build", "run", d, m],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=ROOT)
            with open(os.path.join(d, f"{m}.pid"), "w") as f:
                f.write(str(p.pid))
            print(f"JIT {m}: started pid {p.pid} in its own session; log {os.path.join(d, m + '.log')}", flush=True)
        return 0
    rc, t0 = 0, time.time()  # wait
    for m in modules:
        while _jit_read(d, m) is None and _jit_alive(d, m):
            time.sleep(2)
        done = _jit_read(d, m)
        if done is None:  # nobody built it here: build it now
            print(f"JIT {m}: no marker and no builder: building in the foreground", flush=True)
            _jit_build_one(d, m)
            done = _jit_read(d, m) or {"rc": 1, "error": "no marker written"}
        print(_jit_line(m, done) + f" (waited {int(time.time() - t0)}s)", flush=True)
        rc = rc or (0 if done.get("rc") == 0 else 1)
    return rc


def main(argv: list[str]) -> int:
    args = list(argv)
    if args[:1] == ["--jit-build"]:
        return jit_build(args[1:])
    if args[:1] == ["--list"]:
        print(table())
        return 0
    check = args[:1] == ["--check"]
    names = (args[1:] if check else args) or DEFAULT_SUITE.split()
    try:
        st = settings(names, os.environ)
    except SuiteError as ex:
        print(f"run_suite.py: {ex}", file=sys.stderr)
        return 2
    if check:
        print(f"suites {' '.join(names)} -> stages {' '.join(s if s == WAIT else s.name for s in st.plan)} "
              f"(estimated {_minutes(estimate_s(st))})")
        return 0
    return Runner(st, os.environ).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
