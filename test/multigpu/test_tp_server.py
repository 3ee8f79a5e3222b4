"""Multi-GPU tier (8-GPU runner): the verify graph under tensor parallelism 2 / 4 / 8.

Run on a machine with >= TP GPUs (skipped cleanly elsewhere), e.g. in a user's 8-GPU CI:

    VERIFY_GRAPH_MODELS=/tmp/models python3 -m pytest -q -m multigpu test/multigpu

(``python -m bench.models.dummy_models /tmp/models`` writes the dummy-weight models first.) The target is the
reduced Kimi-K2.5-shaped ``kimi-small`` (DeepseekV3: MLA kv_lora 512 / rope 64, 8 heads, 128
routed experts top-8 + shared expert, 6 layers; 4 / 2 / 1 heads per rank at TP 2 / 4 / 8) with
its Llama-style EAGLE-3 draft; triton.

Failure modes guarded: ranks taking different paths or buckets inside a verify step (NCCL hang,
caught here as a request timeout, and as TP ranks whose verify counters differ), an all-reduce
captured outside ``graph_capture()``, fallbacks at concurrency 1-8 on any rank, greedy output
diverging from upstream's graph or from no speculation, slow leaks or crashes over a soak with
aborts (duration ``VERIFY_GRAPH_SOAK_S``, default 60 s; 600 s nightly).

Counters: ``/get_server_info`` serves TP rank 0's ``internal_state`` only; the plugin gathers
every rank's counters into it (``verify_cuda_graph_tp_ranks``), read with
``server_utils.verify_graph_tp_states``. Each rank must report replays == verify steps > 0 and no
fallback after concurrency 1-8; after the soak (bursts of up to 12 requests over the largest
bucket, 8) replays + fallbacks == verify steps with every fallback above the largest bucket; and
at both points every rank holds rank 0's counts (``server_utils.rank_disagreement``).

Greedy parity: the 16 prompts x 64 tokens one request at a time on each server, with the near-tie
rule of the 1-GPU tier (``greedy_parity``: token-identical, or a divergence whose top-2 logprob gap
is below ``E2E_PARITY_TIE_TOL``, default 0: strict).

Runs on a machine with 2-8 GPUs only (``-m multigpu``); no GPU suite includes it.
"""

import concurrent.futures as cf
import os
import random
import time

import pytest
import requests

from greedy_parity import TOP2_LOGPROBS, compare, tie_tolerance

pytestmark = [pytest.mark.multigpu, pytest.mark.server]

MODELS = os.environ.get("VERIFY_GRAPH_MODELS", "/tmp/models")
PORT0 = int(os.environ.get("VERIFY_GRAPH_TP_PORT", "32100"))
SOAK_S = float(os.environ.get("VERIFY_GRAPH_SOAK_S", "60"))
PARITY_TOKENS = 64
MAX_BUCKET = 8  # --cuda-graph-max-bs-decode
TIE_TOL = tie_tolerance()


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def _args(tp: int, mode: str) -> list[str]:
    a = ["--tp-size", str(tp), "--load-format", "dummy", "--attention-backend", "triton",
         "--sampling-backend", "pytorch", "--cuda-graph-backend-prefill", "disabled",
         "--skip-tokenizer-init", "--grammar-backend", "none", "--mem-fraction-static", "0.6",
         "--cuda-graph-max-bs-decode", str(MAX_BUCKET), "--context-length", "8192", "--random-seed", "0"]
    if mode != "plain":
        a += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
              f"{MODELS}/kimi-small-eagle3", "--speculative-eagle-topk", "1",
              "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3"]
    if mode == "ours":
        a.append("--enable-verify-cuda-graph")
    return a


def _generate(base, ids, n, timeout=120, logprobs=False):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
    if logprobs:
        body.update(TOP2_LOGPROBS)
    r = requests.post(f"{base}/generate", timeout=timeout, json=body)
    r.raise_for_status()
    return r.json()


def _serve(tp, mode, port):
    from server_utils import launch_server

    log_dir = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
    os.makedirs(log_dir, exist_ok=True)
    return launch_server(f"{MODELS}/kimi-small", f"http://127.0.0.1:{port}", _args(tp, mode),
                         log_path=f"{log_dir}/tp{tp}_{mode}.log", timeout=900)


PROMPTS = [[random.Random(i).randrange(100, 32000) for _ in range(32 + 17 * i)] for i in range(16)]


def _every_rank(base, tp, after_soak):
    """Every TP rank's verify counters (one DP rank): present on all ``tp`` ranks, equal to rank
    0's, and replayed (no fallback before the soak; after it, only fallbacks above the largest
    bucket, each counted as a verify step)."""
    from server_utils import rank_disagreement, verify_graph_tp_states

    groups = verify_graph_tp_states(base)
    assert len(groups) == 1 and len(groups[0]) == tp, f"expected {tp} TP ranks' counters: {groups}"
    ranks = groups[0]
    problem = rank_disagreement(ranks)
    assert problem is None, problem
    for rank, c in enumerate(ranks):
        if after_soak:
            assert c["replays"] + c["fallback_total"] == c["verify_steps"] > 0, (rank, c)
            assert set(c["fallbacks"]) <= {"batch_size_above_max_captured"}, (rank, c["fallbacks"])
        else:
            assert c["fallback_total"] == 0 and c["replays"] == c["verify_steps"] > 0, (rank, c)
    return ranks


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_parity_fallbacks_and_soak(tp):
    if _gpus() < tp:
        pytest.skip(f"needs {tp} GPUs")
    from server_utils import stop_server

    outputs = {}
    for k, mode in enumerate(("ours", "upstream", "plain")):
        port = PORT0 + 10 * tp + k
        base = f"http://127.0.0.1:{port}"
        proc = _serve(tp, mode, port)
        try:
            # one request at a time: every server decodes each prompt at batch size 1
            outputs[mode] = [_generate(base, ids, PARITY_TOKENS, logprobs=True) for ids in PROMPTS]
            if mode != "ours":
                continue
            for conc in (1, 2, 4, 8):
                with cf.ThreadPoolExecutor(conc) as pool:
                    outs = list(pool.map(lambda ids: _generate(base, ids, 48), PROMPTS[:conc]))
                assert [len(o["output_ids"]) for o in outs] == [48] * conc, f"concurrency {conc}"
            _every_rank(base, tp, after_soak=False)
            _soak(base)
            _every_rank(base, tp, after_soak=True)
        finally:
            stop_server(proc)
    fails = []
    for a, b in (("ours", "upstream"), ("ours", "plain"), ("upstream", "plain")):
        assert all(len(r["output_ids"]) == PARITY_TOKENS for r in outputs[a]), f"{a}: wrong lengths"
        f, ties = compare(a, outputs[a], b, outputs[b], PROMPTS, TIE_TOL)
        print(f"TP {tp} PARITY {a} vs {b}: {len(PROMPTS) - len(f) - len(ties)}/{len(PROMPTS)} identical, "
              f"{len(ties)} near-tie divergences")
        for m in f[:2] + ties[:2]:
            print("  " + m)
        fails += f[:1]
    assert not fails, "greedy outputs differ:\n" + "\n".join(fails)


def _soak(base):
    """Mixed batch sizes, random lengths and aborts for SOAK_S seconds; the server must stay
    healthy (no NCCL timeout, no crash) and keep answering."""
    rng = random.Random(7)
    deadline = time.time() + SOAK_S
    with cf.ThreadPoolExecutor(12) as pool:
        while time.time() < deadline:
            n = rng.randrange(1, 13)
            futs = [pool.submit(_generate, base, rng.choice(PROMPTS), rng.randrange(8, 200), 300)
                    for _ in range(n)]
            if rng.random() < 0.3:
                time.sleep(rng.random())
                requests.post(f"{base}/abort_request", json={"rid": "", "abort_all": True}, timeout=30)
            for f in futs:
                try:
                    f.result()
                except requests.HTTPError:
                    pass  # aborted requests may answer with an error status
    assert requests.get(f"{base}/health_generate", timeout=120).status_code == 200
