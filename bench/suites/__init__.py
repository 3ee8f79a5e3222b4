"""The GPU test suites, declared by purpose: name, what it checks or measures, estimated time, stages.

    python3 -m bench.suites --list                 # suite, purpose, estimated time, stages
    python3 -m bench.suites --check NAME...        # check the names and settings; print the plan
    python3 -m bench.suites NAME...                # run (on the GPU machine, after the setup)

``scripts/gpu_job.sh`` sets up the GPU machine (bundle, kernel caches, plugin install, dummy
models), runs ``python3 -m bench.suites $SUITE`` and packs the logs and caches after. A NAME is a
suite of :data:`SUITES`, one stage of a suite (e.g. ``nan``, ``sanitizer``, ``accept``), ``wait``
(a barrier: wait for the stages running at once) or ``-NAME`` (leave it out: ``reliability
-sanitizer``). How the runner runs them (limits, budget, parallel mode, dry run, the summary and
the files in ``$OUT``): :mod:`bench.suites.runner`. Measurements that only differ by their
arguments (the Kimi-K2.5 shard sweeps, floors, captures) are not suites: they are the ``bench``,
``parts`` and ``capture`` suites with ``*_ARGS``, written out in ``docs/gpu_testing.md``.

Stdlib only: gpu_job.sh checks the names with it before the setup.
"""

from __future__ import annotations

from typing import Mapping

from . import stages as st
from .spec import WAIT, Stage, Suite, SuiteError  # noqa: F401 -- the names a caller needs

DEFAULT_SUITE = "kernel selftest e2e"
SHARD_BENCH_DOC = "docs/gpu_testing.md, 'Benchmark commands'"

SUITES: dict[str, Suite] = {
    # ---- correctness: the product on a real GPU
    "demo": Suite(
        "the main job: python -m bench demo (plain / upstream EAGLE-3 / ours on the "
        "stock server, concurrency 1 and 8, counters, one table; DEMO_ARGS, e.g. --model kimi-small)",
        250, (st.DEMO_ST,)),
    "kernel": Suite(
        "the chain verify attention kernel in bf16 on the real shapes (Llama-8B GQA, Kimi MLA) against "
        "a float64 reference: page edges, mixed lengths, 2-6 draft tokens, both row tilings", 45, (st.KERNEL_ST,)),
    "selftest": Suite(
        "the verify graph against the eager forward inside a real server, with poisoned buffers and "
        "padded buckets; then NaN in the padded rows with SGLang's NaN detection on", 215,
        (st.SELFTEST_ST, st.NAN_ST)),
    "e2e": Suite(
        "the stock server with the flag vs upstream's graph vs no speculation: counters, concurrency "
        "1-8, greedy parity (E2E_MODEL, E2E_STEPS, E2E_BACKEND)", 220, (st.E2E_ST,)),
    "mla": Suite(  # at once: the longest of 10 stages took 408 s, 551 s for the call (2026-12-01)
        "MLA targets: the self-test with the MLA drafter and the KimiK25 wrapper, our runner around "
        "flashmla / flashinfer's own verify, and the e2e tier per target x backend", 420,
        (st.MLA, st.NATIVE, st.E2E_MLA), parallel=True),
    "reliability": Suite(  # at once: the longest took 446 s; then compute-sanitizer alone, 148 s
        "accept length ours = upstream = eager (and at num_steps 1/2/5), KV accounting at page 1 and "
        "64, feature mix, sampling; then compute-sanitizer memcheck on kernel cases and a server", 600,
        (st.ACCEPT_ST, st.ACCEPT_SHAPE_ST, st.RELIAB_KV1, st.RELIAB_KV64, st.RELIAB_MIX, st.RELIAB_SAMPLING,
         st.SANITIZER), parallel=True, total_s=1000),
    "accept_attn": Suite(  # est (not measured): the longest stage (200 s) +80% for 9 stages at once
        "the attention pair (its greedy tokens go through the verify attention): greedy parity ours / "
        "upstream / plain with every accepted count at page 1 and 64, and ours under each chain-kernel "
        "test fault (SGLANG_VERIFY_GRAPH_TEST_FAULT) changing every output as simulated; the self-test's "
        "upstream reference on the pair, and seeing a test fault; the same parity and each verify test "
        "fault on the prefix-reading pair (1k-token prompts, outputs that read keys across the prefix); "
        "the draft-attention pair's accepted-draft histograms, clean and under each draft-extend test fault",
        360, (st.ACCEPT_ATTN_P1, st.ACCEPT_ATTN_P64, st.ACCEPT_ATTN_FAULT, st.SELFTEST_ATTN, st.SELFTEST_FAULT,
              st.PREFIX_PAIR, st.DRAFT_ATTN), parallel=True),
    "scenarios": Suite(  # est (not measured): the longest stage (340 s) +75% for 9 stages at once
        "serving situations that could corrupt KV, on the prefix-reading pair, every output token equal to "
        "the simulation, ours and upstream: 1,000 requests with mid-flight aborts (0 KV tokens used after "
        "/flush_cache), radix hits and eviction, forced and pool-pressure retraction, chunked prefill beside "
        "decoding, 1-2k-token outputs, greedy + sampled + logprob in one batch, no overlap scheduler, batches "
        "above the largest bucket (graph and eager verify mixed)", 600,
        (st.SCEN_KV_P1, st.SCEN_KV_P64, st.SCEN_RADIX, st.SCEN_FORCED, st.SCEN_POOL, st.SCEN_CHUNKED, st.SCEN_LONG,
         st.SCEN_MIXED, st.SCEN_OVERLAP), parallel=True, total_s=1000),
    "soak": Suite(
        "ten minutes (SOAK_S) at concurrency 32 on the prefix-reading pair, ours: mixed prompt lengths and "
        "radix hits, every output exact, 0 KV tokens used after /flush_cache, no leak report", 720,
        (st.SOAK_ST,), total_s=900),
    "profile": Suite(
        "the per-phase profile on a real server: profile lines, counters, /metrics, the advisor on "
        "the log (PROFILE_MODEL)", 165, (st.PROFILE_ST,)),
    # ---- measurements: one lab command each, its arguments from *_ARGS
    "bench": Suite(
        "verify / decode GPU time per replay for ours, upstream and plain engines (python -m bench verify "
        "--quick unless BENCH_ARGS is set; BENCH_MODE_TMO per engine)", 120, (st.BENCH_ST,)),
    "speedup": Suite(
        "measured EAGLE-3 speed-up with set accept lengths (1.5-3.0 at num_steps 3) on the Llama-3.1-8B-"
        "shape pair (python -m bench models pair --shape llama8b, built first): plain / upstream / ours "
        "tok/s at bs 1, 4, 16 x ctx 1k, 8k, and the advisor's prediction against it (SPEEDUP_ARGS)",
        440, (st.SPEEDUP_ST,), total_s=595),
    "kbench": Suite(
        "one verify layer's attention op: decode / upstream / ours in CUDA-graph replays (KBENCH_ARGS)",
        110, (st.KBENCH_ST,)),
    "parts": Suite(
        "one Kimi-K2.5 shard layer's parts (attention, routed MoE, dense) for verify vs decode in "
        "CUDA-graph replays (python -m bench parts; PARTS_ARGS, default --quick)", 40, (st.PARTS_ST,)),
    "capture": Suite(
        "verify-graph capture time and memory over repeated engine starts, ours vs upstream "
        "(CAPTURE_ARGS)", 320, (st.CAPTURE_ST,)),
    # ---- the Kimi-K2.5 TP-8 shard (72 GiB of dummy weights): one server at a time; estimates, not measured
    "shard_triton": Suite(
        "Kimi-K2.5 TP-8 shard, triton WNA16 MoE: the Marlin JIT build started in the background, then "
        "ours / upstream / plain on the stock server: parity 16 x 64, replays == verify steps at c=1-8",
        485, (st.SHARD_JIT_ST, st.SHARD_E2E_TRITON_ST), total_s=595),
    "shard_marlin": Suite(
        "Kimi-K2.5 TP-8 shard, default (Marlin WNA16) MoE: wait for the Marlin JIT build, then the same "
        "parity and counters", 430, (st.SHARD_MARLIN,), total_s=595),
    "shard_wrapped": Suite(
        "the KimiK25ForConditionalGeneration-wrapped shard through sglang.Engine: ours replays every "
        "verify step (python -m bench verify --require-replays)", 180, (st.SHARD_WRAPPED_ST,)),
    "shard": Suite(
        "the shard suites in one job (longer than a 10-minute call: raise TOTAL_S): triton, the wrapped "
        "shard while Marlin builds, Marlin", 485 + 180 + 430, ("shard_triton", "shard_wrapped", "shard_marlin"),
        total_s=1250),
}


def suite_stages(name: str, environ: Mapping[str, str]) -> list[Stage]:
    """The stages of suite ``name`` in run order (a suite named inside another expands in place)."""
    out: list[Stage] = []
    for p in SUITES[name].parts:
        out += suite_stages(p, environ) if isinstance(p, str) else p.stages(environ)
    return out


ALL = ("demo", "kernel", "selftest", "mla", "reliability", "accept_attn", "scenarios", "soak", "e2e", "profile",
       "kbench", "bench", "speedup")
SUITES["all"] = Suite(  # one stage at a time: the sum of the stages' estimates
    "every suite above, one stage at a time, except capture and parts (run them alone) and the shard "
    "suites (72 GiB models, their own calls); raise TOTAL_S",
    sum(s.est_s for n in ALL for s in suite_stages(n, {})), ALL)
UNITS = {p.name: p for s in SUITES.values() for p in s.parts if not isinstance(p, str)}
"""The stages, cases and groups of the suites, each addressable by its name."""
RENAMED = {"GPU_TMO": "KERNEL_TMO and SELFTEST_TMO (the kernel and selftest suites)",
           "RELIAB_ARGS": "a stage name (reliab_kv1, reliab_kv64, reliab_mix, reliab_sampling)",
           **{v: f"BENCH_ARGS with SUITE=bench ({SHARD_BENCH_DOC})" for v in (
               "SHARD_BENCH_ARGS", "SHARD_BENCH_LEAN_ARGS", "SHARD_FLOOR_ARGS", "SHARD_REST_WIDE_ARGS",
               "SHARD_REST_16K_ARGS", "SHARD_REST_16K_UP_ARGS", "SHARD_REST_16K_S3_ARGS")},
           "SHARD_PARTS_ARGS": f"PARTS_ARGS with SUITE=parts ({SHARD_BENCH_DOC})",
           "SHARD_CAPTURE_ARGS": f"CAPTURE_ARGS with SUITE=capture ({SHARD_BENCH_DOC})"}
"""Settings that are no longer read, each with what replaces it."""
MOVED = {n: SHARD_BENCH_DOC for n in ("shard_bench", "shard_bench_lean", "shard_floor", "shard_capture",
                                      "shard_rest_wide", "shard_rest_16k", "shard_rest_16k_up")}
"""Former suites that only fixed a lab command's arguments: now commands in the docs."""
