"""GPU tier, in a real server: the verify graph against the eager forward, with poisoned buffers.

Starts the stock ``python -m sglang.launch_server`` (small dummy Llama + EAGLE-3 draft, triton)
with ``--enable-verify-cuda-graph`` and ``SGLANG_VERIFY_GRAPH_SELFTEST=1`` and captures buckets
{1, 2, 4, 8} only, so batches of 3, 5, 6 and 7 requests replay a padded bucket. Requests of
different lengths make the running batch shrink from 8 to 1 (and a burst of 12 goes above the
largest bucket). Inside the scheduler, for every replay the self-test (``selftest.py``)

* fills every static input buffer with 2**40 before ``load_batch`` (stale padded rows would index
  out of range: sgl-project/sglang#10892, #25512),
* re-runs the batch eagerly and compares real rows' logits and EAGLE-3 aux hidden states,
  with our kernel and with SGLang's own TARGET_VERIFY attention (per row, per draft position),
* checks the static buffers' addresses never moved since capture;
* for the draft's DRAFT_EXTEND_V2 graph (chain kernel), poisons its static inputs and compares
  every replay with SGLang's own draft-extend attention run eagerly.

Failure modes guarded: graph != eager; padded rows not neutralised (device assert); buffers
re-allocated after capture (stale graph pointers); a batch above the largest bucket crashing or
falling back silently (vllm#54933 class): it must fall back with a logged, counted reason.

``VERIFY_GRAPH_SELFTEST_NAN=1`` (gpu_job stage ``nan``) runs the same server with SGLang's NaN
detection on and ``SGLANG_VERIFY_GRAPH_SELFTEST_NAN=1``: every padded row carries NaN through
every layer of each padded replay; real rows must stay finite and equal to
eager, and SGLang's NaN detection must never fire.

Env for slow runs (gpu_job stage ``sanitizer``: every kernel under compute-sanitizer memcheck, ~1.5 s
per verify step on the H200): ``VERIFY_GRAPH_SELFTEST_TOKENS`` (tokens per request step of the
shrinking burst, default 24: requests get 24, 48, ..., 192 tokens; 4 still walks every batch size
8 -> 1) and ``VERIFY_GRAPH_SELFTEST_REQ_TIMEOUT`` (s per request, default 300). SGLang 0.5.16 has no ``--enable-nan-detection``
flag any more: its NaN detection is ``SGLANG_ENABLE_ASYNC_ASSERT=1`` (``utils/async_probe.py``:
device-side asserts on the verify logits, ``eagle_worker_common.py``, and on the draft's logits
and top-k probabilities), which would crash the scheduler on a leaked NaN.
"""

import concurrent.futures as cf
import json
import os
import random

import pytest
import requests

pytestmark = [pytest.mark.gpu, pytest.mark.server]

MODELS = os.environ.get("VERIFY_GRAPH_MODELS", "/tmp/models")
MODEL = os.environ.get("VERIFY_GRAPH_SELFTEST_MODEL", "llama-small")  # or kimi-small (MLA + MoE)
# kimi-small-mla / kimi-k25-small (dummy_models.py); llama-pair (accept_pair.py: real weights, so no
# --load-format dummy; its ids never reach the padding token 0, which the NaN mode needs)
REAL_WEIGHTS = os.path.isfile(os.path.join(MODELS, MODEL, "model.safetensors"))
# triton (the chain kernel) or a native backend of backends.py: fa3, flashmla, flashinfer (MLA targets)
BACKEND = os.environ.get("VERIFY_GRAPH_SELFTEST_BACKEND", "triton")


def _vocab() -> int:
    import json

    with open(os.path.join(MODELS, MODEL, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg)["vocab_size"]
PORT = int(os.environ.get("VERIFY_GRAPH_SELFTEST_PORT", "31870"))
NAN = os.environ.get("VERIFY_GRAPH_SELFTEST_NAN") == "1"
FAULT = os.environ.get("SGLANG_VERIFY_GRAPH_TEST_FAULT")  # a chain-kernel test fault in the server
LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
LOG = f"{LOG_DIR}/server_selftest_{MODEL}_{BACKEND}{'_nan' if NAN else ''}.log"
TOKENS = int(os.environ.get("VERIFY_GRAPH_SELFTEST_TOKENS", "24"))
REQ_TIMEOUT = float(os.environ.get("VERIFY_GRAPH_SELFTEST_REQ_TIMEOUT", "300"))
BASE = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def server():
    from server_utils import launch_server, stop_server

    args = [
        *([] if REAL_WEIGHTS else ["--load-format", "dummy"]),
        "--attention-backend", BACKEND, "--sampling-backend", "pytorch",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{MODELS}/{MODEL}-eagle3",
        "--speculative-eagle-topk", "1", "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3",
        "--enable-verify-cuda-graph", "--cuda-graph-bs-decode", "1", "2", "4", "8",
        "--max-running-requests", "12", "--cuda-graph-backend-prefill", "disabled",
        "--disable-radix-cache", "--skip-tokenizer-init", "--grammar-backend", "none",
        "--mem-fraction-static", "0.5", "--context-length", "4096", "--random-seed", "0",
    ]
    env = dict(os.environ, SGLANG_VERIFY_GRAPH_SELFTEST="1")
    if NAN:
        env.update(SGLANG_VERIFY_GRAPH_SELFTEST_NAN="1", SGLANG_ENABLE_ASYNC_ASSERT="1")
    os.makedirs(LOG_DIR, exist_ok=True)
    proc = launch_server(f"{MODELS}/{MODEL}", BASE, args, env=env, log_path=LOG)
    try:
        yield proc
    finally:
        try:  # the counters and self-test figures of the run, beside the server log
            with open(LOG.replace(".log", "_results.json"), "w") as f:
                json.dump(_state(), f, indent=1)
        except Exception as e:  # noqa: BLE001 (a server that died has no state to give)
            print(f"selftest results not written: {e!r}")
        stop_server(proc)


def _generate(ids, n):
    r = requests.post(f"{BASE}/generate", timeout=REQ_TIMEOUT, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()


def _state():
    info = requests.get(f"{BASE}/get_server_info", timeout=30).json()
    return info["internal_states"][0]["verify_cuda_graph"]


def _burst(n_requests, lengths, prompt_lens=None):
    rng = random.Random(n_requests)
    vocab = _vocab()
    prompt_lens = prompt_lens or [rng.randrange(16, 300) for _ in range(n_requests)]
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(n)] for n in prompt_lens]
    with cf.ThreadPoolExecutor(n_requests) as pool:
        outs = list(pool.map(_generate, prompts, lengths))
    for o, n in zip(outs, lengths):
        assert len(o["output_ids"]) == n
    return outs


def test_graph_equals_eager_on_every_bucket_with_poisoned_padding(server):
    _burst(8, [TOKENS * (i + 1) for i in range(8)])  # running batch shrinks 8 -> 1
    s = _state()
    st = s["selftest"]
    assert st["checks"] > 0 and st["checks"] == s["replays"]
    raw = {int(k) for k in st["raw_bs_seen"]}
    assert set(range(1, 9)) <= raw, f"batch sizes seen: {sorted(raw)}"
    assert {int(k) for k in st["bs_seen"]} <= {1, 2, 4, 8}
    assert s["padded_rows"] > 0, "no padded replay happened"
    # bf16 GEMMs of a padded (graph) vs unpadded (eager) batch may round differently, which can
    # flip an argmax on a near-tie of random-weight logits; allow at most 0.5% of rows.
    assert st["argmax_mismatch"] <= 0.005 * st["rows"], st
    assert st["logits_max_rel_err"] < 1e-2, st
    assert st["hidden_max_rel_err"] < 1e-2, st
    assert st.get("hidden_missing", 0) == 0
    assert st["addresses_stable"]
    assert s["fallback_total"] == 0 and s["replays"] == s["verify_steps"]


def test_graph_equals_upstreams_target_verify_at_every_draft_position(server):
    """Every replay against SGLang's own TARGET_VERIFY attention (the triton backend's
    ``extend_attention_fwd`` with the chain's full tree mask), run eagerly on the same batch: an
    independent reference for the chain kernel. Bound per row (each token's logits and aux hidden
    states), reported per draft position."""
    if FAULT:
        pytest.skip(f"SGLANG_VERIFY_GRAPH_TEST_FAULT={FAULT}: test_upstream_reference_sees_a_kernel_fault")
    _burst(8, [TOKENS // 2 * (i + 1) for i in range(8)])  # 8 -> 1 running, padded buckets
    s = _state()
    if BACKEND != "triton":
        pytest.skip(f"--attention-backend {BACKEND} serves the verify with its own kernel")
    u = s["selftest"]["upstream"]
    ndt = s["num_draft_tokens"]
    assert u["checks"] == s["selftest"]["checks"] == s["replays"] > 0, u
    assert len(u["logits_row_max_rel_err"]) == ndt and len(u["hidden_row_max_rel_err"]) == ndt, u
    assert max(u["logits_row_max_rel_err"]) < 2e-2, u
    assert max(u["hidden_row_max_rel_err"]) < 2e-2, u
    assert u["nonfinite_rows"] == 0, u
    assert u["argmax_mismatch"] <= 0.005 * u["rows"], u


@pytest.mark.skipif(not FAULT, reason="SGLANG_VERIFY_GRAPH_TEST_FAULT only")
def test_upstream_reference_sees_a_kernel_fault(server):
    """With a test fault in our kernel (``causal_plus_one``: each draft row also sees the next
    one) on a target whose logits go through its attention (``llama-pair-attn``), our graph still
    equals our eager forward, but SGLang's own TARGET_VERIFY attention disagrees at every draft
    position the fault reaches (all but the last) and not at the last."""
    _burst(8, [TOKENS // 2 * (i + 1) for i in range(8)])
    s = _state()
    st, u = s["selftest"], s["selftest"]["upstream"]
    assert st["logits_max_rel_err"] < 1e-2 and st["argmax_mismatch"] == 0, st
    err = u["logits_row_max_rel_err"]
    assert u["checks"] == s["replays"] > 0 and u["argmax_mismatch"] > 0, u
    if FAULT == "causal_plus_one":
        assert min(err[:-1]) > 0.1 and err[-1] < 2e-2, u
    else:
        assert max(err) > 0.1, u


def test_draft_extend_graph_equals_upstreams_path(server):
    """The draft's DRAFT_EXTEND_V2 graph (the chain kernel, ``ChainDraftExtendTritonBackend``)
    against SGLang's own draft-extend attention (``extend_attention_fwd`` over a fresh
    ``kv_indices``) run eagerly on the same batch, for every replay, with the runner's static
    ``seq_lens`` / ``out_cache_loc`` / ``positions`` / ``req_pool_indices`` poisoned to 2**40 and
    the chain scratch to NaN before each one (``selftest.DraftExtendSelfTest``)."""
    _burst(6, [TOKENS * (i + 1) for i in range(6)])
    s = _state()
    if BACKEND != "triton" and "draft_extend" not in s:
        pytest.skip(f"the draft-extend backend of --attention-backend {BACKEND} is not triton")
    de, st = s["draft_extend"], s["selftest"]["draft_extend"]
    assert de["attention"].startswith("chain"), de
    assert de["replays"] > 0 and de["eager"] <= s["fallback_total"], de
    # one draft extend follows every verify step (counted apart: graph execute vs eager dispatch)
    assert de["replays"] + de["eager"] == s["verify_steps"], (de, s["verify_steps"])
    assert st["checks"] == de["replays"], st
    assert {int(k) for k in st["raw_bs_seen"]} >= set(range(1, 7)), st
    assert de["padded_rows"] > 0, de
    assert st["argmax_mismatch"] <= 0.005 * st["rows"], st
    assert st["logits_max_rel_err"] < 1e-2 and st["hidden_max_rel_err"] < 1e-2, st
    assert st["nonfinite_rows"] == 0, st


PAGE_EDGES = [63, 64, 65, 127, 128, 129]


def test_page_boundary_lengths_equal_eager(server):
    """Page size 64 on flashmla, every page size on the others: prompts of
    63/64/65/127/128/129 tokens, so the first verify windows (prefix + num_draft_tokens) straddle
    a page edge; 6 requests run in the padded bucket 8. The self-test compares every replay with
    the eager forward."""
    before = _state()
    _burst(len(PAGE_EDGES), [8] * len(PAGE_EDGES), prompt_lens=PAGE_EDGES)
    s = _state()
    st, st0 = s["selftest"], before["selftest"]
    assert st["checks"] > st0["checks"] and st["checks"] == s["replays"], (st0, st)
    # /get_server_info is JSON: raw_bs_seen maps "6" (a string) to replays at raw bs 6
    assert st["raw_bs_seen"].get("6", 0) > st0["raw_bs_seen"].get("6", 0), (st0, st)
    assert st["logits_max_rel_err"] < 1e-2 and st["hidden_max_rel_err"] < 1e-2, st
    assert st["nonfinite_rows"] == 0, st
    assert s["fallback_total"] == before["fallback_total"], s["fallbacks"]


def test_batch_above_largest_bucket_falls_back_with_reason(server):
    before = _state()
    _burst(12, [40] * 12)
    after = _state()
    assert after["fallbacks"].get("batch_size_above_max_captured", 0) > before["fallbacks"].get(
        "batch_size_above_max_captured", 0)
    assert after["verify_steps"] == after["replays"] + after["fallback_total"]
    with open(LOG, errors="replace") as f:  # announced at start-up (counters.eager_cliff_warning)
        assert "requests will run eagerly (largest captured bucket 8;" in f.read()


@pytest.mark.skipif(not NAN, reason="VERIFY_GRAPH_SELFTEST_NAN=1 only")
def test_nan_in_padded_rows_stays_there(server):
    _burst(7, [20 + 9 * i for i in range(7)])  # 7, 6, 5, 3 running: padded buckets 8 and 4
    st = _state()["selftest"]
    assert st["nan_injected_replays"] > 0, st
    assert st.get("nan_skipped_real_pad_token", 0) == 0, st  # llama-pair never emits token 0
    assert st["nonfinite_rows"] == 0, st
    assert st["logits_max_rel_err"] < 1e-2 and st["hidden_max_rel_err"] < 1e-2, st
    with open(LOG, errors="replace") as f:
        log = f.read()
    assert "NaN detected" not in log and "device-side assert" not in log
