"""Server tier: the stock ``python -m sglang.launch_server`` with ``--enable-verify-cuda-graph``.

Starts real SGLang 0.5.16 servers (one at a time: GPU memory) on a dummy-weight Llama target and its
EAGLE-3 draft (``python -m bench models dummy``; ``E2E_MODEL``: ``llama-small`` by default, ``llama-8b`` for the
Llama-3.1-8B shape; ``kimi-small`` / ``kimi-small-mla`` for the Kimi-K2.5-shaped MLA +
MoE target with the Llama-style / MLA drafter), EAGLE-3 topk 1, ``E2E_STEPS`` steps (default 2: 3 draft tokens),
attention backend
``E2E_BACKEND`` (default triton):

* ``ours``      the same server with ``--enable-verify-cuda-graph`` (the plugin's runner);
* ``upstream``  the same server without it (upstream's TARGET_VERIFY graph);
* ``plain``     no speculation.

Checks: ours serves /generate (``input_ids``) at concurrency 1, 2, 4, 8 with exactly the requested
number of tokens, and ``/get_server_info`` ``internal_states[0]["verify_cuda_graph"]`` reports
replays == verify_steps > 0 and no fallbacks (``verify_steps``: SGLang's worker entering its verify,
counted apart from the replays), the requests of those steps summed equal to the replays' ``raw_bs``
summed, and that sum equal to the responses' ``spec_verify_ct`` plus one overlap-scheduler step per
request;
greedy parity: 16 fixed prompts x 128 tokens (temperature 0, ignore_eos) give token-identical
``output_ids`` on all three servers; the first differing request/position is printed otherwise,
with each server's top-2 logprobs there (dummy random weights have near-ties; accept length is 1.0).

SGLang's kit: ``kill_process_tree`` (sglang.srt.utils) stops each server tree. Its
``popen_launch_server`` is not used: in 0.5.16 it runs the ``sglang serve`` console script and
appends ``--device``, while this tier must exercise the stock ``python -m sglang.launch_server``
(and ``sglang.test.test_utils`` imports ``sglang.benchmark`` -> ``datasets``).

Env: ``E2E_MODEL`` (target folder name under the models dir, with ``<name>-eagle3`` as the draft;
default ``llama-small``), ``E2E_LOG_DIR`` (server logs + e2e_results.json, default /tmp/e2e_logs), ``E2E_MODELS_DIR``
(default /tmp/models; made in a temp folder when missing), ``E2E_LAUNCH_TIMEOUT`` (s, default 300),
``E2E_BACKEND`` (``--attention-backend``, default triton; flashmla and flashinfer on the MLA targets),
``E2E_DRAFT_BACKEND`` (``--speculative-draft-attention-backend``, unset by default; the Llama-style draft
on flashmla needs ``triton``), ``E2E_PARITY_TOKENS`` (default 128), ``E2E_PARITY_LOGPROBS`` (1: ask top-2 logprobs, default 1),
``E2E_STEPS`` (``--speculative-num-steps``, default 2), ``E2E_PARITY_TIE_TOL`` (default 0 = strict; > 0 accepts a divergence where the
two servers' top-2 logprob gap (min of the two) at the first differing position is below it: ``greedy_parity``), ``E2E_SERVER_ARGS`` (more server flags for all three servers, after the
tier's own: the last value of a flag wins, e.g. ``--moe-runner-backend triton --mem-fraction-static 0.7``), ``E2E_VOCAB``
(prompt token ids are drawn below it, default 32000; a target with a smaller vocabulary needs it, e.g. 20480 for kimi-k25-shard).
"""

import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time

import pytest

from greedy_parity import TOP2_LOGPROBS, compare, tie_tolerance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
LAUNCH_TIMEOUT = float(os.environ.get("E2E_LAUNCH_TIMEOUT", "300"))
PARITY_TOKENS = int(os.environ.get("E2E_PARITY_TOKENS", "128"))
PARITY_LOGPROBS = os.environ.get("E2E_PARITY_LOGPROBS", "1") == "1"
TIE_TOL = tie_tolerance()
MODEL = os.environ.get("E2E_MODEL", "llama-small")
VOCAB = int(os.environ.get("E2E_VOCAB", "32000"))
SERVER_ARGS = shlex.split(os.environ.get("E2E_SERVER_ARGS", ""))
PLUGIN_ENV = "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
RESULTS = {}


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


pytestmark = [pytest.mark.server, pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")]

BACKEND = os.environ.get("E2E_BACKEND", "triton")
DRAFT_BACKEND = os.environ.get("E2E_DRAFT_BACKEND", "")
# a triton draft-extend backend runs DRAFT_EXTEND_V2 on the chain kernel unless
# SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream
DRAFT_EXTEND_CHAIN = ((DRAFT_BACKEND or BACKEND) == "triton" and
                      os.environ.get("SGLANG_VERIFY_GRAPH_DRAFT_EXTEND", "chain").strip().lower() != "upstream")
# --speculative-num-steps of the ours/upstream servers (num_draft_tokens = STEPS + 1); 5 runs the
# kernel's 16-row tiling on an MLA target (48 rows per latent head at 6 draft tokens)
STEPS = int(os.environ.get("E2E_STEPS", "2"))
COMMON = ["--load-format", "dummy", "--attention-backend", BACKEND, "--sampling-backend", "pytorch",
          "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache", "--skip-tokenizer-init",
          "--grammar-backend", "none", "--mem-fraction-static", "0.5", "--cuda-graph-max-bs-decode", "8",
          "--context-length", "4096", "--random-seed", "0"]


def spec_args(draft):
    draft_backend = ["--speculative-draft-attention-backend", DRAFT_BACKEND] if DRAFT_BACKEND else []
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-eagle-topk", "1", "--speculative-num-steps", str(STEPS),
            "--speculative-num-draft-tokens", str(STEPS + 1), *draft_backend]


def _free_port() -> int:
    rng = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        port = rng.randrange(21000, 39000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


def _kill_tree(proc):
    try:
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(proc.pid, wait_timeout=60)
    except Exception as ex:
        print(f"kill_process_tree failed ({ex!r}); killing pid {proc.pid} and its children")
        try:
            import psutil

            for q in psutil.Process(proc.pid).children(recursive=True):
                q.kill()
        except Exception:
            pass
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(path, n=40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-n:])
    except OSError:
        return "(no log)"


class Server:
    """One ``python -m sglang.launch_server`` process tree; log in LOG_DIR/server_<name>.log."""

    def __init__(self, name, model, extra):
        import requests

        self.requests, self.name = requests, name
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(LOG_DIR, f"server_{name}.log")
        from bench.lib.server import shared_gpu_args

        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, *COMMON, *extra,
                    *SERVER_ARGS, "--host", "127.0.0.1", "--port", str(self.port), *shared_gpu_args()]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop(PLUGIN_ENV, None)  # only the CLI flag enables the plugin here
        t0 = time.time()
        with open(self.log_path, "w") as log:
            log.write("command: " + " ".join(self.cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {name} exited rc={self.proc.returncode}; log tail:\n{_tail(self.log_path)}")
            try:
                if requests.get(self.base + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() - t0 > LAUNCH_TIMEOUT:
                self.stop()
                raise RuntimeError(f"server {name} not healthy after {LAUNCH_TIMEOUT:.0f}s; log tail:\n{_tail(self.log_path)}")
            time.sleep(2)
        self.startup_s = round(time.time() - t0, 1)
        RESULTS.setdefault("startup_s", {})[name] = self.startup_s
        print(f"server {name} up in {self.startup_s}s on port {self.port}")

    def generate(self, ids, n, logprobs=False, timeout=300):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}}
        if logprobs:
            body.update(TOP2_LOGPROBS)
        r = self.requests.post(self.base + "/generate", json=body, timeout=timeout)
        assert r.status_code == 200, f"{self.name}: HTTP {r.status_code}: {r.text[:500]}"
        return r.json()

    def plugin_state(self):
        st = self.requests.get(self.base + "/get_server_info", timeout=30).json()["internal_states"]
        assert isinstance(st, list) and st, f"internal_states is {type(st).__name__}: {str(st)[:200]}"
        return st[0].get("verify_cuda_graph")

    def stop(self):
        _kill_tree(self.proc)


class Servers:
    """Starts the named server on demand, stopping the previous one first (one GPU)."""

    def __init__(self, models):
        self.models, self.cur, self.failed, self.outputs = models, None, {}, {}

    def get(self, name) -> Server:
        if name in self.failed:
            pytest.fail(f"server {name} failed earlier: {self.failed[name][:3000]}")
        if self.cur is not None and self.cur.name == name:
            return self.cur
        self.close()
        target = os.path.join(self.models, MODEL)
        extra = {"ours": spec_args(target + "-eagle3") + ["--enable-verify-cuda-graph"],
                 "upstream": spec_args(target + "-eagle3"), "plain": []}[name]
        try:
            self.cur = Server(name, target, extra)
        except Exception as ex:
            self.failed[name] = str(ex)
            pytest.fail(str(ex)[:6000])
        return self.cur

    def parity_outputs(self, name):
        """Greedy outputs of the 16 parity prompts, one request at a time (fixed batch composition)."""
        if name not in self.outputs:
            s = self.get(name)
            outs = [s.generate(ids, PARITY_TOKENS, logprobs=PARITY_LOGPROBS) for ids in PARITY_PROMPTS]
            self.outputs[name] = outs
            if name == "ours":
                RESULTS["ours_after_parity"] = s.plugin_state()
        return self.outputs[name]

    def close(self):
        if self.cur is not None:
            self.cur.stop()
            self.cur = None


_rng = random.Random(2024)
PARITY_PROMPTS = [[_rng.randrange(10, VOCAB - 10) for _ in range(16 + 13 * i)] for i in range(16)]


def _dump_results():
    os.makedirs(LOG_DIR, exist_ok=True)
    with open(os.path.join(LOG_DIR, "e2e_results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    os.makedirs(LOG_DIR, exist_ok=True)
    models = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
    if not os.path.isfile(os.path.join(models, MODEL + "-eagle3", "config.json")):
        models = str(tmp_path_factory.mktemp("models"))
        subprocess.run([sys.executable, "-m", "bench", "models", "dummy", models, "--only", MODEL],
                       check=True, cwd=ROOT)
    RESULTS["model"] = MODEL
    RESULTS["attention_backend"] = BACKEND
    RESULTS["draft_attention_backend"] = DRAFT_BACKEND or None
    sv = Servers(models)
    try:
        yield sv
    finally:
        sv.close()
        _dump_results()


def test_ours_reports_verify_runner(servers):
    st = servers.get("ours").plugin_state()
    RESULTS["ours_at_start"] = st
    assert st is not None, "internal_states[0] has no 'verify_cuda_graph': plugin not loaded or flag not applied"
    assert st["runner"] == "VerifyCudaGraphRunner", st
    assert st["num_draft_tokens"] == STEPS + 1, st
    assert 1 in st["capture_bs"] and max(st["capture_bs"]) >= 8, st
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"], st
    if DRAFT_EXTEND_CHAIN:
        assert st["draft_extend"]["attention"].startswith("chain"), st


@pytest.mark.parametrize("concurrency", [1, 2, 4, 8])
def test_ours_concurrent_generate(servers, concurrency):
    s = servers.get("ours")
    before = s.plugin_state()
    rng = random.Random(concurrency)
    jobs = [([rng.randrange(10, VOCAB - 10) for _ in range(rng.randrange(8, 300))], 16 + 7 * (i % 5))
            for i in range(2 * concurrency)]
    results, errors = [None] * len(jobs), []

    def worker(k):
        for j in range(k, len(jobs), concurrency):  # each thread sends its requests back to back
            try:
                results[j] = s.generate(*jobs[j], timeout=120)
            except Exception as ex:  # noqa: BLE001
                errors.append(f"request {j}: {ex!r}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for j, ((ids, n), r) in enumerate(zip(jobs, results)):
        assert r is not None, f"request {j} got no response"
        assert len(r["output_ids"]) == n, f"request {j}: {len(r['output_ids'])} tokens, asked {n}"
        assert r["meta_info"]["completion_tokens"] == n, r["meta_info"]
    after = s.plugin_state()
    vct = [r["meta_info"].get("spec_verify_ct") or 0 for r in results]
    d = {k: after[k] - before[k] for k in ("replays", "verify_steps", "fallback_total",
                                           "replayed_requests", "verify_requests", "eager_requests")}
    if DRAFT_EXTEND_CHAIN:  # one draft extend per verify step, counted where it runs
        d.update({f"draft_extend_{k}": after["draft_extend"][k] - before["draft_extend"][k]
                  for k in ("replays", "eager")})
    RESULTS.setdefault("concurrency", {})[concurrency] = {"delta": d, "spec_verify_ct": vct, "after": after}
    _dump_results()
    assert after["fallback_total"] == 0, f"fallbacks: {after['fallbacks']}"
    assert d["replays"] == d["verify_steps"] > 0, d
    if DRAFT_EXTEND_CHAIN:
        assert d["draft_extend_replays"] == d["verify_steps"] and d["draft_extend_eager"] == 0, d
    # SGLang's worker counted every verify step and request; each replayed our graph
    assert d["replayed_requests"] == d["verify_requests"] and d["eager_requests"] == 0, d
    # SGLang's per-request spec_verify_ct counts the committed verifies; under the overlap
    # scheduler each request rides along in one more verify step after its last one
    assert d["replayed_requests"] == sum(vct) + len(jobs), (d, vct)


def test_greedy_parity_ours_upstream_plain(servers):
    outs = {n: servers.parity_outputs(n) for n in ("ours", "upstream", "plain")}
    for n, o in outs.items():
        assert all(len(r["output_ids"]) == PARITY_TOKENS for r in o), f"{n}: wrong lengths {[len(r['output_ids']) for r in o]}"
    report, all_fails = {}, []
    for a, b in (("ours", "upstream"), ("ours", "plain"), ("upstream", "plain")):
        fails, ties = compare(a, outs[a], b, outs[b], PARITY_PROMPTS, TIE_TOL)
        report[f"{a}_vs_{b}"] = {"identical": 16 - len(fails) - len(ties), "fails": fails, "ties": ties}
        print(f"PARITY {a} vs {b}: {16 - len(fails) - len(ties)}/16 identical, {len(ties)} near-tie divergences")
        for m in fails[:2] + ties[:2]:
            print("  " + m)
        all_fails += fails[:1]
    RESULTS["parity"] = report
    RESULTS["parity_output_ids"] = {n: [r["output_ids"] for r in o] for n, o in outs.items()}
    _dump_results()
    st = RESULTS.get("ours_after_parity")
    assert st and st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st
    assert not all_fails, "greedy outputs differ:\n" + "\n".join(all_fails)
