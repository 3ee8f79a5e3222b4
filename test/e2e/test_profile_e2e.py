"""Server tier: the per-phase profile on a real server.

Failure modes guarded: the profile prints nothing or garbage on a real server (hooks on moved
SGLang methods, events never drained); its cycle count or accept length disagreeing with
SGLang's own counters; the Prometheus metrics missing from ``/metrics``; the phases covering much
less than the GPU's timeline (a phase missed); the advisor unable to read a real log.

Runs ``PROFILE_MODEL`` (default ``llama-8b``, dummy weights: GPU-bound, so the cycles fill the
GPU timeline; ``llama-small`` is host-bound on the H200 and its cycles cover only ~70% of it)
twice:
``plain`` (no speculation: wall ms per decode step, the advisor's ``--decode-ms``) and ``ours``
with ``--verify-graph-profile-every 10 --enable-metrics``. Checks: ``verify_graph_profile`` lines
in the log (8 requests x 128 tokens in one batch); summed ``cycles`` <= the verify counter and
more than half of it; ``replay_pct`` 100;
accept length within 10% of SGLang's ``avg_spec_accept_length``; phase sum (``cycle_mean_ms``)
>= 90% of the device span per cycle (``1000 * tokens / tok_s / cycles``) in every window after
the first (whose span holds the prefills); ``/metrics`` serves
``sglang_verify_graph_phase_ms`` and ``sglang_verify_graph_replays_total``;
``python -m sglang_verify_graph.advisor --from-log`` on the log exits 0 with a recommendation.
The profile's overhead is measured by ``bench/verify.py --modes ours,ours_profile``.
"""

import concurrent.futures as cf
import os
import random
import subprocess
import sys
import time

import pytest
import requests

from bench.verify.parent import profile_lines

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
MODEL = os.environ.get("PROFILE_MODEL", "llama-8b")
RESULTS = {}
RESULTS_FILE = "profile_results.json"  # written by conftest._module_results
COMMON = ["--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend",
          "pytorch", "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache",
          "--skip-tokenizer-init", "--grammar-backend", "none", "--mem-fraction-static", "0.5",
          "--cuda-graph-max-bs-decode", "8", "--context-length", "4096", "--random-seed", "0"]
SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
        "--speculative-num-steps", "2", "--speculative-num-draft-tokens", "3"]


def _body(ids, n):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0,
                                                  "ignore_eos": True}}


def _serve(name, extra):
    from bench.lib.server import free_port, launch_server

    os.makedirs(LOG_DIR, exist_ok=True)
    base = f"http://127.0.0.1:{free_port()}"
    log = os.path.join(LOG_DIR, f"server_profile_{name}.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_VERIFY_GRAPH_")
           and k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"}
    proc = launch_server(os.path.join(MODELS, MODEL), base, COMMON + extra, env=env,
                         log_path=log)
    return proc, base, log


def _decode_ms():
    from bench.lib.server import generate, stop_server

    proc, base, _ = _serve("plain", [])
    try:
        ids = [random.Random(1).randrange(100, 31000) for _ in range(256)]
        generate(base, _body(ids, 8))  # warm-up
        t = time.perf_counter()
        generate(base, _body(ids, 1))
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        generate(base, _body(ids, 129))
        return 1000 * (time.perf_counter() - t - t1) / 128
    finally:
        stop_server(proc)


def test_profile_lines_metrics_and_advisor():
    from bench.lib.server import generate, plugin_state, stop_server

    decode_ms = _decode_ms()
    proc, base, log = _serve("ours", SPEC + [
        "--speculative-draft-model-path", os.path.join(MODELS, MODEL + "-eagle3"),
        "--enable-verify-cuda-graph", "--verify-graph-profile-every", "10", "--enable-metrics"])
    try:
        rng = random.Random(3)
        prompts = [[rng.randrange(100, 31000) for _ in range(rng.randrange(64, 600))]
                   for _ in range(8)]
        with cf.ThreadPoolExecutor(8) as pool:  # one batch of 8: decode-only after the prefills
            list(pool.map(lambda ids: generate(base, _body(ids, 128)), prompts))
        time.sleep(2)
        state = plugin_state(base)
        info = requests.get(f"{base}/get_server_info", timeout=30).json()["internal_states"][0]
        metrics = requests.get(f"{base}/metrics", timeout=30).text
    finally:
        stop_server(proc)
    lines = profile_lines(log)  # the bench's parser: key=value dicts + phase_sum_vs_span
    RESULTS.update(decode_ms=decode_ms, lines=lines, plugin=state,
                   avg_spec_accept_length=info.get("avg_spec_accept_length"))
    assert lines, f"no verify_graph_profile lines in {log}"
    cycles = sum(int(p["cycles"]) for p in lines)
    assert 0.5 * state["verify_steps"] < cycles <= state["verify_steps"], (cycles, state)
    assert all(p["replay_pct"] == "100.0" and p["fallbacks"] == "none" for p in lines), lines[:2]
    sglang_al = info.get("avg_spec_accept_length")
    ours_al = sum(float(p["accept_length"]) * int(p["cycles"]) for p in lines) / cycles
    assert sglang_al and abs(ours_al - sglang_al) <= 0.1 * sglang_al, (ours_al, sglang_al)
    coverage = [p["phase_sum_vs_span"] for p in lines]
    RESULTS["phase_sum_vs_span"] = coverage
    steady = coverage[1:]  # the first window's span includes the prefills between its cycles
    assert steady and None not in steady, f"no steady window with a coverage figure: {coverage}"
    assert min(steady) >= 0.9, f"phases cover {min(steady):.2f} of the GPU span per cycle"
    assert 'sglang_verify_graph_phase_ms_bucket{' in metrics and 'phase="verify"' in metrics
    assert "sglang_verify_graph_replays_total" in metrics
    adv = subprocess.run([sys.executable, "-m", "sglang_verify_graph.advisor", "--from-log", log,
                          "--decode-ms", f"{decode_ms:.3f}"], capture_output=True, text=True,
                         timeout=120)
    RESULTS["advisor"] = adv.stdout[-3000:]
    assert adv.returncode == 0, adv.stderr[-2000:]
    assert "break-even" in adv.stdout.lower(), adv.stdout[-2000:]
