"""Server tier: the prefix-reading pair, whose greedy tokens depend on keys spread over the prefix.

Failure mode guarded: a verify that reads a wrong KV slot somewhere in a 1k-token prefix (a
wrong page-table entry at one position, a dropped KV split, another layer's KV buffer) or with a
causal limit off by one, while the output still looks right. The attention pair
(``test_accept_attention_e2e.py``) reads only its own key and BOS, so a wrong middle entry, a
dropped middle split or a wrong layer's buffer cannot change its tokens. The prefix pair
(``python -m bench models pair DIR --prefix --span 1024``, written under ``E2E_MODELS_DIR`` when
missing; :mod:`bench.models.accept_pair.prefix`) adds offset checks: the target's last layer reads,
from every row at position ``n``, the key at ``n - K`` for 16 offsets ``K`` in 1..span (one per KV
head), layers 1-2 the key at ``n - 1``; a failed check flips the row's greedy token to the partner
of ``g(t)``. :func:`bench.models.accept_pair.prefix_sim.simulate_prefix` predicts every output and
accepted-draft histogram, with and without a verify test fault.

Prompts: ``prefix_prompts(16, 1024)``, BOS + 1025..1065 ids (1026..1066 tokens, so every output
row finds each offset and the prompt is <= 2 spans); 116 new tokens each (``span / 15 + 48``:
every last-layer offset is read by output rows); num_steps 3 (num_draft_tokens 4, topk 1).

* ``test_greedy_parity_ours_upstream_plain[1]``, ``[64]`` (page size): ours, upstream's graph and
  (page 1) no speculation, all on SGLang's triton attention, 16 requests at concurrency 8, give
  the simulated outputs; ours' and upstream's per-request histograms and verify counts equal the
  prediction; every accepted count 0..3 occurs; ours replays every verify step (0 fallbacks).
* ``test_fault_changes_an_output[<fault>]``: ours with ``SGLANG_VERIFY_GRAPH_TEST_FAULT=<fault>``
  changes at least one request's output from the fault-free prediction (which the parity test
  asserts plain gives; and from the plain server's outputs when this process ran it): the proof
  that the pair sees the fault. Per request, the first changed output index goes to
  ``prefix_pair_results.json`` (``fault_first_change``).
* ``test_fault_outputs_match_the_faulted_simulation[<fault>]``: the same server's outputs,
  histograms and verify counts equal ``simulate_prefix(..., fault=<fault>)``.

What each fault's prediction assumes (the arithmetic of ``sglang_verify_graph.kernel.faults`` per
verify step, ``prefix`` = the request's ``seq_lens`` = prompt + outputs so far - 1):

* ``causal_plus_one`` / ``causal_minus_one``: chain row ``j`` reads keys ``[0, min(prefix + j + 2,
  prefix + 4))`` / ``[0, prefix + j)``; independent of the KV split count, batch and page size:
  concurrency 8.
* ``drop_first_split`` / ``drop_middle_split``: split 0 / split ``eff // 2`` unread, with ``eff =
  min(num_kv_splits, ceil((prefix + 4) / 64))`` splits of ``ceil((prefix + 4) / eff)`` keys;
  ``num_kv_splits = choose_num_kv_splits(shape of this pair, bs=1, the SM count of CUDA device 0)``
  (``coverage.default_kv_splits``; 32 on a 132-SM H100 SXM / H200): the chain backend picks it per
  captured bucket from the bucket's batch size, so these run at concurrency 1 and the test asserts
  every replay held one request in bucket 1 (``replayed_requests == replays``, ``padded_rows ==
  0``). ``SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS`` is removed from the servers' environment.
* ``middle_page_entry``: column ``m = prefix // 2`` reads the slot of ``m + 1``; the check at
  offset ``K`` fails on the row at ``n = m + K``, which exists while ``prefix <= 2 * span``; no
  split or batch dependence: concurrency 8.
* ``wrong_layer_kv``: the backend has layer 0 read layer 1's K/V buffers and layer ``l`` layer
  ``l - 1``'s (a 4-layer pool from layer 0); concurrency 8.
* every fault: the prefill is not faulted (first output token is ``g(prompt[-1])``), the draft
  (the plain pair's, ``d1`` / ``G``) never reads the target's attention output.

CPU prediction of these assertions: ``test/bench/test_prefix_pair_server_prediction.py`` (these
prompts and token counts: each fault changes a request, every accepted count occurs; the split
count; these tests pass on a stand-in server giving the prediction and fail on one that ignores a
fault).

Env: ``PREFIX_PAIR_TOKENS`` (new tokens per request, default 116), ``PREFIX_PAIR_FAULTS`` (default
all six verify faults), ``PREFIX_PAIR_P64_MODES`` (servers beside ours at page size 64: ``plain``,
``upstream``; default ``"upstream"``), ``E2E_MODELS_DIR`` (default /tmp/models), ``E2E_LOG_DIR``
(server logs, prefix_pair_results.json).
"""

import functools
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import accept_pair as ap
from bench.models.accept_pair import prefix as px
from bench.models.accept_pair import prefix_sim as ps
from bench.lib.server import ACCEPT_PAIR_ARGS
from pair_runs import check_simulated_runs, serve_prompts

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
SPAN = px.DEFAULT_SPAN  # 1024, the span `python -m bench models pair DIR --prefix` builds (bench.suites)
TOKENS = int(os.environ.get("PREFIX_PAIR_TOKENS", str(SPAN // 15 + 48)))
FAULTS = os.environ.get("PREFIX_PAIR_FAULTS", " ".join(ps.KERNEL_FAULTS)).split()
P64_MODES = os.environ.get("PREFIX_PAIR_P64_MODES", "upstream").split()
STEPS, CONCURRENCY = 3, 8
SPLIT_FAULTS = ("drop_first_split", "drop_middle_split")
"""Faults whose effect depends on the launch's num_kv_splits: served at concurrency 1."""
PROMPTS = ps.prefix_prompts(16, SPAN)  # BOS + span + 1 .. span + 41 ids
FAULT_ENV = "SGLANG_VERIFY_GRAPH_TEST_FAULT"
SPLITS_ENV = "SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS"
RESULTS = {}
RESULTS_FILE = "prefix_pair_results.json"  # written by conftest._module_results

COMMON = ACCEPT_PAIR_ARGS


def fault_concurrency(fault) -> int:
    """Requests in flight for the server of ``fault`` (None: fault-free): 1 for
    :data:`SPLIT_FAULTS` (the split count is the bs-1 bucket's), else :data:`CONCURRENCY`."""
    return 1 if fault in SPLIT_FAULTS else CONCURRENCY


@functools.lru_cache(maxsize=None)
def device_sms() -> int:
    """Streaming multiprocessors of CUDA device 0 as the servers see it (SGLang's
    ``get_device_core_count``), read in a child process so this one holds no CUDA context.
    Raises subprocess.CalledProcessError without a CUDA device."""
    code = "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def fault_kv_splits(fault, num_sms=None):
    """The launch's ``num_kv_splits`` the prediction of ``fault`` needs: for :data:`SPLIT_FAULTS`
    the chain backend's policy at batch size 1 (``coverage.default_kv_splits`` for this pair's
    shape, num_draft_tokens ``STEPS + 1``, ``num_sms`` SMs; default :func:`device_sms`); None for
    the others (their arithmetic has no split count). An int >= 1 or None."""
    if fault not in SPLIT_FAULTS:
        return None
    from bench.models.accept_pair.coverage import default_kv_splits

    return default_kv_splits(1, STEPS + 1, device_sms() if num_sms is None else num_sms)


def predicted(maps, fault=None, num_kv_splits=None, prompts=None, tokens=None, span=SPAN):
    """``(sims, histograms)`` per prompt (default :data:`PROMPTS`, :data:`TOKENS` new tokens):
    ``simulate_prefix(maps, span, prompt, tokens, STEPS, fault, num_kv_splits)`` with one
    :class:`PrefixModel` shared by the prompts (its readout memo; the same rows). ``sims``: dicts
    of ``output_ids``, ``accepted`` (drafts per verify step), ``steps``; ``histograms``: accepted-
    draft counts per request as SGLang reports them (trimmed). Raises ValueError for an unknown
    fault or a split fault without ``num_kv_splits`` (``step_fault``), ``AmbiguousReadout`` for a
    row the pair cannot decide."""
    prompts = PROMPTS if prompts is None else prompts
    tokens = TOKENS if tokens is None else tokens
    model = ps.PrefixModel(maps, span)
    sims = [ap.simulate(maps, p, tokens, STEPS, predict=model.predict(fault, STEPS + 1, num_kv_splits))
            for p in prompts]
    return sims, [ap.accepted_histogram(s["accepted"]) for s in sims]


_PREDICTIONS = {}


def _predict(maps, fault=None):
    """:func:`predicted` of the fixture's ``maps`` under ``fault`` at :func:`fault_kv_splits`
    (memoized per fault: the module serves one pair)."""
    key = (fault, fault_kv_splits(fault))
    if key not in _PREDICTIONS:
        _PREDICTIONS[key] = predicted(maps, *key)
    return _PREDICTIONS[key]


@pytest.fixture(scope="module")
def prefix_pair():
    """``(target_dir, draft_dir, maps)`` of the prefix pair of span :data:`SPAN` (``maps`` with
    ``"code"``, ``"span"``, ``"offsets"``); built under ``E2E_MODELS_DIR`` when missing or of
    another span (~10 s, ~210 MB)."""
    target = os.path.join(MODELS, px.PREFIX_NAME)
    draft = target + "-eagle3"

    def built():
        files = [os.path.join(target, "model.safetensors"), os.path.join(draft, "model.safetensors"),
                 os.path.join(target, "pair_maps.json")]
        if not all(os.path.isfile(f) for f in files):
            return None
        with open(files[2]) as f:
            maps = json.load(f)
        return maps if maps.get("prefix") and maps.get("span") == SPAN else None

    maps = built()
    if maps is None:
        subprocess.run([sys.executable, "-m", "bench", "models", "pair", MODELS, "--prefix", "--span", str(SPAN)],
                       check=True, cwd=ROOT)
        maps = built()
    assert maps is not None and len(maps["code"]) == ap.VOCAB, f"{target}: not the prefix pair of span {SPAN}"
    assert maps["offsets"] == px.prefix_offsets(SPAN), maps["offsets"]
    RESULTS["prediction"] = {"span": SPAN, "tokens": TOKENS, "num_steps": STEPS,
                             "prompt_lengths": [len(p) for p in PROMPTS]}
    return target, draft, maps


_RUNS = {}


def _run(pair, mode, page=1, fault=None):
    """One server (``mode`` ours / upstream / plain, ``page`` size, ``fault`` for ours), the 16
    prompts at :func:`fault_concurrency`: per request output_ids, spec_verify_ct, histogram; the
    plugin's counters (None for upstream / plain)."""
    key = (mode, page, fault)
    if key in _RUNS:
        return _RUNS[key]
    target, draft, _ = pair
    env = {k: v for k, v in os.environ.items() if k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", FAULT_ENV, SPLITS_ENV)}
    if fault:
        env[FAULT_ENV] = fault
    name = f"{mode}_p{page}" + (f"_{fault}" if fault else "")
    run = serve_prompts(target, draft, mode, page, prompts=PROMPTS, tokens=TOKENS, steps=STEPS,
                        concurrency=fault_concurrency(fault), common_args=COMMON, env=env,
                        log_path=os.path.join(LOG_DIR, f"server_prefix_pair_{name}.log"))
    RESULTS[name] = run
    _RUNS[key] = run
    return run


def _replayed_every_step(run, one_request=False):
    """Ours ran every verify step as a replay of its graph (0 fallbacks); ``one_request``: each
    replay held one request in the bs-1 bucket (the split count :func:`fault_kv_splits` assumes)."""
    st = run["plugin"]
    assert st and st["runner"] == "VerifyCudaGraphRunner" and st["num_draft_tokens"] == STEPS + 1, st
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st
    if one_request:
        assert 1 in st["capture_bs"] and st["padded_rows"] == 0, st
        assert st["replayed_requests"] == st["replays"], st


@pytest.mark.parametrize("page", [1, 64])
def test_greedy_parity_ours_upstream_plain(prefix_pair, page):
    maps = prefix_pair[2]
    sims, hists = _predict(maps)
    beside = ("plain", "upstream") if page == 1 else [m for m in ("plain", "upstream") if m in P64_MODES]
    modes = list(beside) + ["ours"]
    runs = {m: _run(prefix_pair, m, page) for m in modes}
    check_simulated_runs(runs, sims, hists, STEPS, f"page {page}")
    _replayed_every_step(runs["ours"])


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_changes_an_output(prefix_pair, fault):
    maps = prefix_pair[2]
    correct = [s["output_ids"] for s in _predict(maps)[0]]
    want = [s["output_ids"] for s in _predict(maps, fault)[0]]
    assert want != correct, f"{fault}: the prediction changes no request (precondition)"
    run = _run(prefix_pair, "ours", 1, fault)
    _replayed_every_step(run, one_request=fault in SPLIT_FAULTS)  # the faulted launch ran every step
    RESULTS.setdefault("fault_first_change", {})[fault] = [
        next((j for j, (a, b) in enumerate(zip(got, ok)) if a != b), None)
        for got, ok in zip(run["output_ids"], correct)]
    RESULTS.setdefault("fault_num_kv_splits", {})[fault] = fault_kv_splits(fault)
    changed = [i for i, (got, ok) in enumerate(zip(run["output_ids"], correct)) if got != ok]
    assert changed, f"{fault}: no request changed (the pair did not see the fault)"
    plain = _RUNS.get(("plain", 1, None))
    if plain is not None:
        assert run["output_ids"] != plain["output_ids"], f"{fault}: outputs equal to the plain server's"


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_outputs_match_the_faulted_simulation(prefix_pair, fault):
    maps = prefix_pair[2]
    sims, hists = _predict(maps, fault)
    run = _run(prefix_pair, "ours", 1, fault)
    bad = [i for i, (got, s) in enumerate(zip(run["output_ids"], sims)) if got != s["output_ids"]]
    k = fault_kv_splits(fault)
    assert not bad, f"{fault}: requests {bad} differ from simulate_prefix(fault={fault!r}, num_kv_splits={k})"
    assert run["histogram"] == hists, f"{fault}: histograms differ from the faulted prediction"
    assert run["verify_ct"] == [len(s["accepted"]) for s in sims], f"{fault}: verify counts"
