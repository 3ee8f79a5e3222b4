"""Server tier: the attention pair, whose greedy tokens go through the verify attention.

Failure mode guarded: a wrong verify attention at draft positions >= 1 (causal limit off by one,
a dropped KV split, a wrong page-table entry) changes output tokens. The plain constructed pair
(``test_accept_length_e2e.py``) cannot show it: its target never reads its attention output. The
attention pair (``python -m bench models pair DIR --attention``, written under ``E2E_MODELS_DIR`` when
missing) attends to the token itself and to BOS; its greedy token is still ``g(t)``, so
``accept_pair.simulate`` predicts every output and histogram.

* ``test_greedy_parity_ours_upstream_plain[1]``, ``[64]`` (page size): our verify graph, upstream's
  graph and (page 1) no speculation, all on SGLang's triton attention, give the simulated outputs;
  ours' and upstream's per-request accepted-draft histograms and verify counts are equal to each
  other and to the prediction, every accepted count 0..3 occurs, ours replays every verify step.
* ``test_fault_changes_every_output[<fault>]``: ours with ``SGLANG_VERIFY_GRAPH_TEST_FAULT=<fault>``
  (the chain kernel's test fault switch: ``causal_plus_one``, ``causal_minus_one``,
  ``drop_first_split``) changes every request's output: it differs from the fault-free
  prediction, which the parity test asserts plain gives (and from the plain server's outputs when
  this process ran it). This is the proof that the pair sees the verify attention.
* ``test_fault_outputs_match_the_faulted_simulation[<fault>]``: the same server's outputs and
  histograms equal ``simulate(..., fault=<fault>)``.

CPU prediction of these assertions: ``test/bench/test_accept_pair.py``
(``::test_each_fault_changes_every_server_test_request`` for these prompts).

Env: ``ACCEPT_ATTN_TOKENS`` (new tokens per request, default 96), ``ACCEPT_ATTN_FAULTS`` (default
all three), ``ACCEPT_ATTN_P64_MODES`` (servers beside ours at page size 64: ``plain``, ``upstream``; default
``"upstream"``),
``E2E_MODELS_DIR`` (default /tmp/models), ``E2E_LOG_DIR`` (server logs, accept_attn_results.json).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import accept_pair as ap
from bench.lib.server import ACCEPT_PAIR_ARGS
from pair_runs import check_simulated_runs, serve_prompts

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
TOKENS = int(os.environ.get("ACCEPT_ATTN_TOKENS", "96"))
FAULTS = os.environ.get("ACCEPT_ATTN_FAULTS", " ".join(ap.FAULTS)).split()
P64_MODES = os.environ.get("ACCEPT_ATTN_P64_MODES", "upstream").split()
STEPS, CONCURRENCY = 3, 8
PROMPTS = ap.attention_prompts()  # 16 prompts: BOS + 29..299 ids
FAULT_ENV = "SGLANG_VERIFY_GRAPH_TEST_FAULT"
RESULTS = {}
RESULTS_FILE = "accept_attn_results.json"  # written by conftest._module_results

COMMON = ACCEPT_PAIR_ARGS


@pytest.fixture(scope="module")
def attn_pair():
    """``(target_dir, draft_dir, maps)`` of the attention pair (``maps`` with ``"code"``)."""
    target = os.path.join(MODELS, ap.NAMES[True])
    if not os.path.isfile(os.path.join(target, "model.safetensors")):
        subprocess.run([sys.executable, "-m", "bench", "models", "pair", MODELS, "--attention"], check=True,
                       cwd=ROOT)
    with open(os.path.join(target, "pair_maps.json")) as f:
        maps = json.load(f)
    assert maps.get("attention") and len(maps["code"]) == ap.VOCAB, "not the attention pair"
    return target, target + "-eagle3", maps


_RUNS = {}


def _run(pair, mode, page=1, fault=None):
    """One server (``mode`` ours / upstream / plain, ``page`` size, ``fault`` for ours), the 16
    prompts at concurrency 8: per request output_ids, spec_verify_ct, histogram; the counters."""
    key = (mode, page, fault)
    if key in _RUNS:
        return _RUNS[key]
    target, draft, _ = pair
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", FAULT_ENV)}
    if fault:
        env[FAULT_ENV] = fault
    name = f"{mode}_p{page}" + (f"_{fault}" if fault else "")
    run = serve_prompts(target, draft, mode, page, prompts=PROMPTS, tokens=TOKENS, steps=STEPS,
                        concurrency=CONCURRENCY, common_args=COMMON, env=env,
                        log_path=os.path.join(LOG_DIR, f"server_accept_attn_{name}.log"))
    RESULTS[name] = run
    _RUNS[key] = run
    return run


def _predicted(maps, fault=None):
    sims = [ap.simulate(maps, p, TOKENS, STEPS, fault=fault) for p in PROMPTS]
    return sims, [ap.accepted_histogram(s["accepted"]) for s in sims]


def _replayed_every_step(run):
    st = run["plugin"]
    assert st and st["runner"] == "VerifyCudaGraphRunner" and st["num_draft_tokens"] == STEPS + 1, st
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st


@pytest.mark.parametrize("page", [1, 64])
def test_greedy_parity_ours_upstream_plain(attn_pair, page):
    maps = attn_pair[2]
    sims, hists = _predicted(maps)
    modes = ["plain", "upstream", "ours"] if page == 1 else [m for m in ("plain", "upstream") if m in P64_MODES] + ["ours"]
    runs = {m: _run(attn_pair, m, page) for m in modes}
    check_simulated_runs(runs, sims, hists, STEPS, f"page {page}")
    _replayed_every_step(runs["ours"])


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_changes_every_output(attn_pair, fault):
    maps = attn_pair[2]
    correct = [s["output_ids"] for s in _predicted(maps)[0]]
    run = _run(attn_pair, "ours", 1, fault)
    _replayed_every_step(run)  # the faulted kernel ran every verify step
    same = [i for i, (got, want) in enumerate(zip(run["output_ids"], correct)) if got == want]
    assert not same, f"{fault}: requests {same} unchanged (the pair did not see the fault there)"
    plain = _RUNS.get(("plain", 1, None))
    if plain is not None:
        same = [i for i, (a, b) in enumerate(zip(run["output_ids"], plain["output_ids"])) if a == b]
        assert not same, f"{fault}: requests {same} equal to the plain server's"
    RESULTS.setdefault("fault_first_change", {})[fault] = [
        next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
        for got, want in zip(run["output_ids"], correct)]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_outputs_match_the_faulted_simulation(attn_pair, fault):
    maps = attn_pair[2]
    sims, hists = _predicted(maps, fault)
    run = _run(attn_pair, "ours", 1, fault)
    bad = [i for i, (got, s) in enumerate(zip(run["output_ids"], sims)) if got != s["output_ids"]]
    assert not bad, f"{fault}: requests {bad} differ from simulate(fault={fault!r})"
    assert run["histogram"] == hists, f"{fault}: histograms differ from the faulted prediction"
