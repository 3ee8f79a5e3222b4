"""The stages of the GPU suites: one command each (pytest on one test file, or one lab command),
with its limit variable, default limit and measured estimate. ``bench.suites`` groups them into
suites by purpose. Stdlib only."""

from __future__ import annotations

from .spec import Arg, Cases, Group, Stage, bench_cmd, pytest_cmd

SELFTEST = "test/gpu/test_runner_selftest.py"
E2E = "test/e2e/test_server_e2e.py"
RELIAB = "test/e2e/test_reliability_e2e.py"
ACCEPT = "test/e2e/test_accept_length_e2e.py"
ACCEPT_ATTN = "test/e2e/test_accept_attention_e2e.py"
PREFIX_PAIR_E2E = "test/e2e/test_prefix_pair_e2e.py"
DRAFT_ATTN_E2E = "test/e2e/test_draft_attention_e2e.py"
MARLIN_JIT = "scripts/build_marlin_jit.py"

# ------------------------------------------------------------------------------ kernel, self-test
KERNEL_ST = Stage(  # 45 s warm (kernel cases only); a cold Triton cache compiles every tiling first
    "kernel", pytest_cmd("gpu", "test/gpu/test_chain_kernel_gpu.py"), "KERNEL_TMO", 150, 45,
    extra=Arg("GPU_ARGS"))
SELFTEST_ST = Stage(  # one self-test server on llama-small: 100 s warm; +60 s on a cold cache
    "selftest", pytest_cmd("gpu", SELFTEST), "SELFTEST_TMO", 200, 100, extra=Arg("GPU_ARGS"))
NAN_ST = Stage(  # NaN in the padded rows, SGLang's NaN detection on (SGLANG_ENABLE_ASYNC_ASSERT=1): 114 s
    "nan", pytest_cmd("gpu", SELFTEST), "NAN_TMO", 200, 114, needs_pair=True,
    env=(("VERIFY_GRAPH_SELFTEST_NAN", "1"), ("VERIFY_GRAPH_SELFTEST_MODEL", Arg("NAN_MODEL", "llama-pair")),
         ("VERIFY_GRAPH_SELFTEST_PORT", "31871")))


# ------------------------------------------------------------------------------ MLA targets
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

# ------------------------------------------------------------------------------ the stock server
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


def _prefix_pair(name: str, k: str, est_s: int) -> Stage:
    return Stage(name, pytest_cmd("server", PREFIX_PAIR_E2E, "-k", k, stop_first=False), "PREFIX_PAIR_TMO", 420,
                 est_s, needs_prefix_pair=True)


# the prefix-reading pair (1k-token prompts whose every output reads keys across the prefix), one
# test group each; est (not measured): ~60 s per server start and its 16 x 116 tokens, as the
# attention pair's stages
PREFIX_PAIR = Group("prefix_pair", (
    _prefix_pair("prefix_p1", "parity and not 64", 200),  # plain, upstream, ours at page 1
    _prefix_pair("prefix_p64", "parity and 64", 140),  # upstream, ours at page 64
    # ours under drop_first_split, drop_middle_split (concurrency 1: the bs-1 bucket's split count),
    # middle_page_entry
    _prefix_pair("prefix_fault_split_page", "fault and (split or page)", 200),
    _prefix_pair("prefix_fault_causal_layer", "fault and (causal or layer)", 200),  # causal +-1, wrong_layer_kv
))

def _draft_attn(name: str, k: str, est_s: int) -> Stage:
    return Stage(name, pytest_cmd("server", DRAFT_ATTN_E2E, "-k", k, stop_first=False), "DRAFT_ATTN_TMO", 420,
                 est_s)


# the draft-attention pair (the draft proposes through its own draft-extend attention; the test
# writes the pair when missing), one test group each; est (not measured): ~60 s per server start
# and its 16 x 96 tokens
DRAFT_ATTN = Group("draft_attn", (
    _draft_attn("draft_attn_parity", "parity", 150),  # ours and upstream at page 1, ours at page 64
    _draft_attn("draft_attn_fault", "fault", 200),  # ours under each of the 3 draft-extend test faults
))

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

SCENARIOS = "test/e2e/test_serving_scenarios_e2e.py"


def _scenario(name: str, k: str, est_s: int) -> Stage:
    """One group of test_serving_scenarios_e2e.py (on the prefix pair)."""
    return Stage(name, pytest_cmd("server", SCENARIOS, "-k", k, stop_first=False), "SCENARIOS_TMO", 480, est_s,
                 needs_prefix_pair=True)


# est (not measured): ~45-60 s per server start + its requests; ours and upstream at page 1 and 64
SCEN_KV_P1 = _scenario("scenarios_kv_p1", "kv_accounting and p1", 300)  # 1 server, 1000 requests, aborts
SCEN_KV_P64 = _scenario("scenarios_kv_p64", "kv_accounting and p64", 300)
SCEN_RADIX = _scenario("scenarios_radix", "radix", 280)  # 4 servers
SCEN_FORCED = _scenario("scenarios_forced_retraction", "forced_retraction", 340)  # 4 servers
SCEN_POOL = _scenario("scenarios_pool_pressure", "pool_pressure", 320)  # 4 servers
SCEN_CHUNKED = _scenario("scenarios_chunked", "chunked", 300)  # 4 servers
SCEN_LONG = _scenario("scenarios_long", "long_outputs", 280)  # 4 servers, 8 x 1-2k tokens
SCEN_MIXED = _scenario("scenarios_mixed", "one_batch or bucket", 300)  # 4 servers (mixed batch, bucket)
SCEN_OVERLAP = _scenario("scenarios_overlap", "overlap", 260)  # 4 servers
SOAK_ST = Stage(  # est (not measured): one server start + SOAK_S (600) s + the idle checks
    "soak", pytest_cmd("server", SCENARIOS, "-k", "soak"), "SOAK_TMO", 900, 720, needs_prefix_pair=True)

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

# ------------------------------------------------------------------------------ the lab's measurements
BENCH_ST = Stage(  # --quick (llama-small, 1k, bs 1, 32 tokens): 3 engine starts of ~30-40 s; the full
    # llama-8b default (BENCH_ARGS="") 210 s
    "bench", bench_cmd("verify", "--out", "{work}/bench_results.json", "--log-dir", "{logs}/bench",
                       "--models-dir", "{models}", "--mode-timeout", Arg("BENCH_MODE_TMO", "150")),
    "BENCH_TMO", 270, 120, kind="bench", extra=Arg("BENCH_ARGS", "--quick"), alone=True, report="bench",
    results="bench_results.json")
KBENCH_ST = Stage(  # one verify layer's attention op, CUDA-graph replays: 109 s for 18 Kimi MLA points with --block-rows 16 32
    "kbench", bench_cmd("kernel", "--out", "{work}/kernel_results.json"),
    "KBENCH_TMO", 240, 110, kind="bench", extra=Arg("KBENCH_ARGS"), alone=True, report="kbench",
    results="kernel_results.json")
PARTS_ST = Stage(  # est (not measured for --quick's 4 points): 39 s measured on the H200 for 11 timed points
    # of one shard layer (--batch-sizes 8 --contexts 1024,4096 --ndt 3); its full default grid is longer
    "parts", bench_cmd("parts", "--out", "{work}/parts_results.json"),
    "PARTS_TMO", 150, 40, kind="bench", extra=Arg("PARTS_ARGS", "--quick"), alone=True, results="parts_results.json")
CAPTURE_ST = Stage(  # repeated engine starts: 316 s for 3 repeats x 2 modes on llama-8b
    "capture", bench_cmd("capture", "--out", "{work}/capture_results.json", "--log-dir", "{logs}/capture",
                         "--mode-timeout", Arg("BENCH_MODE_TMO", "150"), "--models-dir", "{models}"),
    "CAPTURE_TMO", 300, 320, kind="bench", extra=Arg("CAPTURE_ARGS"), alone=True, report="capture",
    results="capture_results.json")
SPEEDUP_ST = Stage(  # est: measured 438 s on the H200 with a warm kernel cache (its own ESTIMATE for
    # the default grid: 463 s); a cold kernel cache adds ~60 s; SPEEDUP_ARGS="--repeats 1" for a third
    "speedup", bench_cmd("speedup", "--out", "{work}/speedup_results.json", "--md", "{logs}/speedup/speedup_table.md",
                         "--log-dir", "{logs}/speedup", "--pair-dir", "{models}",
                         "--mode-timeout", Arg("SPEEDUP_MODE_TMO", "300")),
    "SPEEDUP_TMO", 540, 440, kind="bench", extra=Arg("SPEEDUP_ARGS"), alone=True, report="speedup",
    results="speedup_results.json")
DEMO_ST = Stage(  # three server starts (~60-140 s each, the first compiles Triton on a cold cache) + ~10 s of requests each
    "demo", bench_cmd("demo", "--workdir", "{work}/demo", "--out", "{work}/demo_results.json"),
    "DEMO_TMO", 480, 250, kind="bench", extra=Arg("DEMO_ARGS"), alone=True, report="demo",
    results="demo_results.json")

# ------------------------------------------------------------------------------ the Kimi-K2.5 shard
SHARD = "kimi-k25-shard"
SHARD_E2E_COMMON = "--mem-fraction-static 0.7 --cuda-graph-bs-decode 1 4 8"
"""The shard's server flags beside the e2e tier's own: 71.7 GiB of weights leave 26 GiB of KV
pool (374k tokens) and 42 GiB for graphs and activations at 0.7 of an H200
(``shard_bytes.kv_tokens_at``); three decode buckets cover concurrency 1-8 (2 pads to 4, 5-7 to 8)."""
SHARD_JIT_ST = Stage(  # returns at once; the builds (~4 min of nvcc for moe_wna16_marlin, cold) run on in the background
    "shard_jit", ("python3", MARLIN_JIT, "start", "{jit}"), "SHARD_JIT_TMO", 60, 5, kind="bench", report="jit")
SHARD_JIT_WAIT_ST = Stage(  # 0 s when the build ended during the triton stage; a fresh machine builds here (~4 min)
    "shard_jit_wait", ("python3", MARLIN_JIT, "wait", "{jit}"), "SHARD_JIT_WAIT_TMO", 420, 10,
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
SHARD_WRAPPED_ST = Stage(  # est (not measured): one engine start ~120-150 s + 2 points; sglang.Engine, text model only
    "shard_wrapped", bench_cmd("verify", "--out", "{work}/shard_wrapped_results.json", "--log-dir",
                               "{logs}/shard_wrapped", "--models-dir", "{models}", "--mode-timeout", "400",
                               "--require-replays"),
    "SHARD_WRAPPED_TMO", 450, 180, kind="bench", alone=True, report="bench", results="shard_wrapped_results.json",
    extra=Arg("SHARD_WRAPPED_ARGS", "--model kimi-k25-shard-wrapped --modes ours --steps 3 --contexts 1024 "
              "--batch-sizes 1,8 --new-tokens 32 --mem 0.7 --moe-runner-backend triton --cuda-graph-bs 1,8"))
