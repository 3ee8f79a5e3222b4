"""Multi-GPU tier (8-GPU runner): the verify graph under tensor parallelism 2 / 4 / 8.

Run on a machine with >= TP GPUs (skipped cleanly elsewhere), e.g. in a user's 8-GPU CI:

    VERIFY_GRAPH_MODELS=/tmp/models python3 -m pytest -q -m multigpu test/multigpu

(``python -m bench.models.dummy_models /tmp/models`` writes the dummy-weight models first.) The target is the
reduced Kimi-K2.5-shaped ``kimi-small`` (DeepseekV3: MLA kv_lora 512 / rope 64, 8 heads, 128
routed experts top-8 + shared expert, 6 layers) with its Llama-style EAGLE-3 draft; triton.

Failure modes guarded: ranks taking different paths or buckets inside a verify step (NCCL hang,
caught here as a request timeout), an all-reduce captured outside ``graph_capture()``, fallbacks at
concurrency 1-8, greedy output diverging from upstream's graph or from no speculation, slow leaks
or crashes over a soak with aborts (duration ``VERIFY_GRAPH_SOAK_S``, default 60 s; 600 s nightly).

Runs on a machine with 2-8 GPUs only (``-m multigpu``); no GPU suite includes it.
"""

import concurrent.futures as cf
import os
import random
import time

import pytest
import requests

pytestmark = [pytest.mark.multigpu, pytest.mark.server]

MODELS = os.environ.get("VERIFY_GRAPH_MODELS", "/tmp/models")
PORT0 = int(os.environ.get("VERIFY_GRAPH_TP_PORT", "32100"))
SOAK_S = float(os.environ.get("VERIFY_GRAPH_SOAK_S", "60"))


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
         "--cuda-graph-max-bs-decode", "8", "--context-length", "8192", "--random-seed", "0"]
    if mode != "plain":
        a += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
              f"{MODELS}/kimi-small-eagle3", "--speculative-eagle-topk", "1",
              "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3"]
    if mode == "ours":
        a.append("--enable-verify-cuda-graph")
    return a


def _generate(base, ids, n, timeout=120):
    r = requests.post(f"{base}/generate", timeout=timeout, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
    r.raise_for_status()
    return r.json()


def _serve(tp, mode, port):
    from server_utils import launch_server

    log_dir = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
    os.makedirs(log_dir, exist_ok=True)
    return launch_server(f"{MODELS}/kimi-small", f"http://127.0.0.1:{port}", _args(tp, mode),
                         log_path=f"{log_dir}/tp{tp}_{mode}.log", timeout=900)


PROMPTS = [[random.Random(i).randrange(100, 32000) for _ in range(32 + 17 * i)] for i in range(16)]


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
            with cf.ThreadPoolExecutor(8) as pool:
                outs = list(pool.map(lambda ids: _generate(base, ids, 64), PROMPTS))
            outputs[mode] = [o["output_ids"] for o in outs]
            if mode != "ours":
                continue
            for conc in (1, 2, 4, 8):
                with cf.ThreadPoolExecutor(conc) as pool:
                    list(pool.map(lambda ids: _generate(base, ids, 48), PROMPTS[:conc]))
            states = requests.get(f"{base}/get_server_info", timeout=30).json()["internal_states"]
            for s in states:
                c = s["verify_cuda_graph"]
                assert c["fallback_total"] == 0 and c["replays"] == c["verify_steps"] > 0, c
            _soak(base)
        finally:
            stop_server(proc)
    assert outputs["ours"] == outputs["upstream"] == outputs["plain"]


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
