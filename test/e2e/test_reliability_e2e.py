"""Server tier: KV accounting, feature mix and sampling under our verify graph. Servers run the
constructed pair of ``bench.models.accept_pair`` (deterministic greedy target: next token ``g(t)``;
a draft agreeing on ~70% of ids), so outputs can be checked exactly.

* **KV accounting** (sgl-project/sglang#31616: KV slots leak with page size > 1):
  1,000 requests with random lengths (the first six 63/64/65/127/128/129 tokens: page
  boundaries), shared prefixes (radix-cache hits), 10% aborted mid-way
  (``/abort_request``), at page size 1 and 64. Afterwards, idle: ``/flush_cache`` succeeds,
  ``/v1/loads`` reports 0 used tokens, the server is alive and its log has none of SGLang's own
  leak reports (``memory leak detected``, KV double free / use-after-free; the idle invariant
  check is strict by default; ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1`` runs the pool
  invariant while busy too, and ``SGLANG_CHECK_KV_PAGE_INVARIANTS=1`` adds the page checks to it;
  a hit there is SGLang's own assertion and crashes the scheduler, which the test reports);
  every verify step replayed our graph (buckets up to 24 = ``--max-running-requests``).
* **Feature mix** (sglang#24283: grammar / logprob requests crash the scheduler): one
  batch of JSON-schema requests (xgrammar), logprob + top-logprob requests and plain requests.
  Schemas hold; plain and logprob outputs equal the target's greedy chain (the run without the
  other requests); logprobs equal an eager-verify server's (``--disable-cuda-graph``) within
  1e-2.
* **Sampling** (avoidable top-p renormalization in the verify): temperature 4 (the pair's logit
  margin 32 becomes 8: p(g(t)) ~ 0.85, so the target is far from one-hot) and top-p 0.9, 48 requests
  on our server and on upstream's graph: the mean accept length and accept rate agree within four
  standard errors, and some drafts are accepted (rate > 0.05); then 16 requests at top-p 1.0 call no
  ``top_p_renorm_prob`` inside a verify step (the 0.9 phase must have called it). Not seeded: SGLang
  0.5.16 uses ``sampling_seed`` only with ``--enable-deterministic-inference``, which the verify
  graph refuses.

Env: ``E2E_MODELS_DIR``, ``E2E_LOG_DIR`` (server logs, reliab_results.json), ``RELIAB_REQUESTS``
(default 1000).
"""

import concurrent.futures as cf
import json
import math
import os
import random
import statistics
import sys
import threading
import time

import pytest
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import accept_pair as ap

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
N_REQUESTS = int(os.environ.get("RELIAB_REQUESTS", "1000"))
RESULTS = {}
RESULTS_FILE = "reliab_results.json"  # written by conftest._module_results
LEAK_MARKERS = ("memory leak detected", "KV double free", "use-after-free", "Traceback")
BASE_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
             "--cuda-graph-backend-prefill", "disabled", "--mem-fraction-static", "0.4",
             "--cuda-graph-max-bs-decode", "8", "--context-length", "4096", "--random-seed", "0"]


class _Server:
    def __init__(self, pair, name, extra, env_extra=None):
        from bench.lib.server import free_port, launch_server

        target, draft, _ = pair
        os.makedirs(LOG_DIR, exist_ok=True)
        self.base = f"http://127.0.0.1:{free_port()}"
        self.log = os.path.join(LOG_DIR, f"server_reliab_{name}.log")
        env = {k: v for k, v in os.environ.items() if k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"}
        env.update(env_extra or {})
        spec = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
                "--speculative-num-draft-tokens", "4"]
        self.proc = launch_server(target, self.base, BASE_ARGS + spec + extra, env=env,
                                  log_path=self.log)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        from bench.lib.server import stop_server

        stop_server(self.proc)

    def generate(self, body, timeout=300):
        from bench.lib.server import generate

        return generate(self.base, body, timeout)

    def state(self):
        from bench.lib.server import plugin_state

        return plugin_state(self.base)

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()


def _chain(maps, last, n):
    out = []
    for _ in range(n):
        last = maps["g"][last]
        out.append(last)
    return out


def _used_tokens(base):
    loads = requests.get(f"{base}/v1/loads", timeout=30).json()["loads"]
    return sum(int(x.get("num_used_tokens", x.get("core", {}).get("num_used_tokens", 0)))
               for x in loads), loads


def _wait_idle(base, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        loads = requests.get(f"{base}/v1/loads", timeout=30).json()["loads"]
        busy = sum(int(x.get("num_running_reqs", x.get("core", {}).get("num_running_reqs", 0)))
                   + int(x.get("num_waiting_reqs", x.get("core", {}).get("num_waiting_reqs", 0)))
                   for x in loads)
        if busy == 0:
            return
        time.sleep(1)
    raise AssertionError(f"server not idle after {timeout}s: {loads}")


@pytest.mark.parametrize("page_size", [1, 64])
def test_kv_accounting_after_aborts_and_prefix_hits(pair, page_size):
    maps = pair[2]
    rng = random.Random(page_size)
    prefixes = [[rng.randrange(10, ap.VOCAB - 10) for _ in range(rng.randrange(60, 200))]
                for _ in range(4)]
    jobs = []
    edges = [63, 64, 65, 127, 128, 129]  # prompt lengths around page boundaries (page 64)
    for i in range(N_REQUESTS):
        head = prefixes[i % 4] if rng.random() < 0.6 and i >= len(edges) else []
        n_tail = edges[i] if i < len(edges) else rng.randrange(1, 400)
        tail = [rng.randrange(10, ap.VOCAB - 10) for _ in range(n_tail)]
        # fixed width: SGLang aborts every rid that *starts with* the given one
        jobs.append((f"kv{page_size}-{i:05d}", head + tail, rng.randrange(1, 40), rng.random() < 0.1))
    # graphs up to 24 = max running requests: every verify step replays our graph (with
    # graphs captured up to 8 only, 520 of 535 verify steps fell back to eager verify)
    with _Server(pair, f"kv_page{page_size}", ["--enable-verify-cuda-graph", "--page-size",
                                                str(page_size), "--max-running-requests", "24",
                                                "--cuda-graph-max-bs-decode", "24"],
                 {"SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
                  "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1"}) as s:
        used0, _ = _used_tokens(s.base)
        wrong, aborted = [], []

        def run(job):
            rid, ids, n, abort = job
            if abort:
                threading.Timer(rng.uniform(0.0, 0.3), lambda: requests.post(
                    f"{s.base}/abort_request", json={"rid": rid}, timeout=30)).start()
            r = requests.post(f"{s.base}/generate", timeout=600, json={
                "rid": rid, "input_ids": ids,
                "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
            if abort:
                aborted.append(rid)
                return
            assert r.status_code == 200, r.text[:300]
            out = r.json()["output_ids"]
            if out != _chain(maps, ids[-1], n):
                wrong.append(rid)

        with cf.ThreadPoolExecutor(16) as pool:
            list(pool.map(run, jobs))
        _wait_idle(s.base)
        time.sleep(3)  # the scheduler's idle invariant check runs
        assert s.proc.poll() is None, "server died"
        flushed = requests.post(f"{s.base}/flush_cache", timeout=60)
        used1, loads = _used_tokens(s.base)
        st = s.state()
        log = s.log_text()
    RESULTS[f"kv_page{page_size}"] = {"used_before": used0, "used_after": used1, "loads": loads,
                                      "plugin": st, "aborted": len(aborted), "wrong": wrong[:5]}
    assert not wrong, f"{len(wrong)} outputs differ from the greedy chain: {wrong[:5]}"
    assert flushed.status_code == 200, flushed.text[:300]
    assert used0 == 0 and used1 == 0, (used0, used1, loads)
    leaks = [m for m in LEAK_MARKERS if m in log]
    assert not leaks, f"server log reports {leaks}"
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"]}


def _mix_bodies(rng):
    bodies = []
    for i in range(8):  # one batch within the largest captured bucket (8)
        ids = [rng.randrange(10, ap.VOCAB - 10) for _ in range(rng.randrange(8, 120))]
        sp = {"max_new_tokens": 32, "temperature": 0.0}
        body = {"input_ids": ids, "sampling_params": sp}
        if i % 3 == 0:
            sp["json_schema"] = json.dumps(SCHEMA)
        elif i % 3 == 1:
            body.update(return_logprob=True, top_logprobs_num=3)
            sp["ignore_eos"] = True
        else:
            sp["ignore_eos"] = True
        bodies.append(body)
    return bodies


def _run_mix(server, bodies):
    with cf.ThreadPoolExecutor(len(bodies)) as pool:  # one batch
        return list(pool.map(server.generate, bodies))


def _token_strings(target_dir):
    with open(os.path.join(target_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    return {i: t for t, i in vocab.items()}


def test_feature_mix_grammar_logprobs_plain(pair):
    target, _, maps = pair
    bodies = _mix_bodies(random.Random(5))
    grammar = ["--grammar-backend", "xgrammar"]
    with _Server(pair, "mix_ours", grammar + ["--enable-verify-cuda-graph"]) as s:
        ours = _run_mix(s, bodies)
        st = s.state()
    with _Server(pair, "mix_eager", grammar + ["--disable-cuda-graph"]) as s:
        eager = _run_mix(s, bodies)
    strings = _token_strings(target)
    RESULTS["mix"] = {"plugin": st, "ours": ours, "eager": eager}
    for i, (b, o, e) in enumerate(zip(bodies, ours, eager)):
        sp = b["sampling_params"]
        if "json_schema" in sp:
            text = "".join(strings.get(t, "") for t in o["output_ids"] if t > 2)
            doc = json.loads(text)  # raises if the schema's grammar did not hold
            assert doc["answer"] in ("yes", "no"), (i, text)
            assert o["output_ids"] == e["output_ids"], i
            continue
        assert o["output_ids"] == _chain(maps, b["input_ids"][-1], 32), i
        if b.get("return_logprob"):
            lo = [x[0] for x in o["meta_info"]["output_token_logprobs"]]
            le = [x[0] for x in e["meta_info"]["output_token_logprobs"]]
            assert max(abs(a - c) for a, c in zip(lo, le)) < 1e-2, (i, lo[:4], le[:4])
            to = o["meta_info"]["output_top_logprobs"]
            assert all(len(t) == 3 for t in to), i
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st


def _sampling_stats(server, n=48, tokens=48, top_p=0.9):
    rng = random.Random(9)

    def one(k):
        ids = [rng.randrange(10, ap.VOCAB - 10) for _ in range(32)]
        return server.generate({"input_ids": ids, "sampling_params": {
            "max_new_tokens": tokens, "temperature": 4.0, "top_p": top_p, "ignore_eos": True}})

    with cf.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(one, range(n)))
    lengths = [o["meta_info"]["spec_accept_length"] for o in outs]
    rates = [o["meta_info"]["spec_accept_rate"] for o in outs]
    return lengths, rates


def _kernel_calls(server):
    info = requests.get(f"{server.base}/get_server_info", timeout=30).json()
    check = info["internal_states"][0].get("verify_sync_check")
    assert check is not None, "SGLANG_VERIFY_GRAPH_SYNC_CHECK hooks not installed"
    return check["kernel_calls"]


def test_sampling_acceptance_matches_upstream(pair):
    """Also: with top_p = 1 the verify step runs no top-p renormalisation (sglang#6949): our
    server counts sgl_kernel's ``top_p_renorm_prob`` calls inside verify steps
    (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``, ``sync_check.SyncCheck.note``); the top_p 0.9 phase
    must call it (the counter works), a following top_p 1.0 phase must not."""
    with _Server(pair, "sampling_ours", ["--enable-verify-cuda-graph"],
                 {"SGLANG_VERIFY_GRAPH_SYNC_CHECK": "1"}) as s:
        ours = _sampling_stats(s)
        calls_p09 = _kernel_calls(s)
        _sampling_stats(s, n=16, top_p=1.0)
        calls_p10 = _kernel_calls(s)
        st = s.state()
    with _Server(pair, "sampling_upstream", []) as s:
        up = _sampling_stats(s)
    RESULTS["sampling"] = {"ours": ours, "upstream": up, "plugin": st,
                           "kernel_calls": {"after_top_p_0.9": calls_p09, "after_top_p_1.0": calls_p10}}
    assert calls_p09.get("top_p_renorm_prob", 0) > 0, calls_p09
    assert calls_p10.get("top_p_renorm_prob", 0) == calls_p09["top_p_renorm_prob"], (calls_p09, calls_p10)
    assert calls_p10.get("top_k_renorm_prob", 0) == 0, calls_p10  # top_k unset: no top-k renorm
    for name, a, b in (("accept_length", ours[0], up[0]), ("accept_rate", ours[1], up[1])):
        se = math.sqrt(statistics.pvariance(a) / len(a) + statistics.pvariance(b) / len(b))
        diff = abs(statistics.mean(a) - statistics.mean(b))
        assert diff <= 4 * se + 1e-9, (name, statistics.mean(a), statistics.mean(b), se)
    assert 0.05 < statistics.mean(ours[1]) < 0.95, ours[1][:8]  # neither all nor nothing accepted
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st
