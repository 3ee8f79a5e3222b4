"""Server tier: the draft-attention pair, whose draft proposes through its own attention.

Failure mode guarded: the draft's ``DRAFT_EXTEND_V2`` attention wrong (with the flag on and triton
attention, our chain kernel serves it: ``ChainDraftExtendTritonBackend``) while every output token
looks right: the target decides the tokens, so only the accepted drafts show it. The other pairs'
drafts have ``o_proj = 0``: no draft-extend attention, right or wrong, reaches their proposals.
This pair (``python -m bench models pair DIR --draft-attention``, written under
``E2E_MODELS_DIR`` when missing; :mod:`bench.models.accept_pair.draft_attn`) has the plain pair's
target and a draft whose self heads read the row's own key (value: the row's input id) and whose
BOS head reads BOS: the first draft of every cycle comes from the draft extend's row ``a``, so a
causal limit off by one (another key's id) or a dropped first KV split (no BOS) changes it.
:func:`bench.models.accept_pair.draft_attn_sim.simulate_draft_attention` predicts every output and
accepted-draft histogram, with and without a draft-extend test fault.

Prompts: ``attention_prompts()`` (16: BOS + 29..299 ids), 96 new tokens (``DRAFT_ATTN_TOKENS``),
num_steps 3 (num_draft_tokens 4, topk 1), concurrency 8, triton attention, no radix cache.

* ``test_parity_ours_upstream[1]``, ``[64]`` (page size): ours (chain draft extend) and upstream
  (page 1; ``DRAFT_ATTN_P64_MODES`` adds it at 64) give the simulated outputs, per-request
  histograms and verify counts; every accepted count 0..3 occurs; ours replays every verify step
  and every draft extend through the chain kernel (``draft_extend`` counters: replays == verify
  steps, 0 eager).
* ``test_fault_changes_histograms_not_outputs[<fault>]``: ours with
  ``SGLANG_VERIFY_GRAPH_TEST_FAULT=<fault>`` (``draft_extend_causal_plus_one``,
  ``draft_extend_causal_minus_one``, ``draft_extend_drop_first_split``): outputs equal the
  fault-free prediction, histograms and verify counts equal the faulted prediction, and differ
  from the fault-free one for the requests the simulator says (all 16). Per request, the first
  cycle whose first draft the fault changed goes to ``draft_attn_results.json``.

What the faulted prediction assumes (``draft_attn_sim``'s docstring): row ``a`` of each draft
extend reads the columns ``sglang_verify_graph.kernel.faults.visible_columns`` gives;
``draft_extend_drop_first_split`` hides BOS when the request holds > 64 keys and the launch has
>= 2 KV splits (``choose_num_kv_splits`` of the draft's shape at every bucket up to 8 on this GPU:
checked below, else the test fails naming the count); the draft prefill and draft decode are
unfaulted.

Env: ``DRAFT_ATTN_TOKENS`` (default 96), ``DRAFT_ATTN_FAULTS`` (default all three),
``DRAFT_ATTN_P64_MODES`` (servers beside ours at page 64: ``upstream``; default none),
``E2E_MODELS_DIR`` (default /tmp/models), ``E2E_LOG_DIR`` (server logs, draft_attn_results.json).
"""

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import accept_pair as ap
from bench.models.accept_pair import draft_attn as da
from bench.models.accept_pair import draft_attn_sim as ds
from bench.lib.server import ACCEPT_PAIR_ARGS
from pair_runs import serve_prompts

pytestmark = [pytest.mark.server]

LOG_DIR = os.environ.get("E2E_LOG_DIR", "/tmp/e2e_logs")
MODELS = os.environ.get("E2E_MODELS_DIR", "/tmp/models")
TOKENS = int(os.environ.get("DRAFT_ATTN_TOKENS", "96"))
FAULTS = os.environ.get("DRAFT_ATTN_FAULTS", " ".join(ds.DRAFT_EXTEND_FAULTS)).split()
P64_MODES = os.environ.get("DRAFT_ATTN_P64_MODES", "").split()
STEPS, CONCURRENCY, MAX_BUCKET = 3, 8, 8
PROMPTS = ap.attention_prompts()
FAULT_ENV = "SGLANG_VERIFY_GRAPH_TEST_FAULT"
CLEARED_ENV = (FAULT_ENV, "SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_VERIFY_GRAPH_DRAFT_EXTEND",
               "SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS")
RESULTS = {}
RESULTS_FILE = "draft_attn_results.json"  # written by conftest._module_results


@pytest.fixture(scope="module")
def da_pair():
    """``(target_dir, draft_dir, maps)`` of the draft-attention pair (``maps``: g, d1, G)."""
    target = os.path.join(MODELS, da.DRAFT_ATTN_NAME)
    draft = target + "-eagle3"
    if not os.path.isfile(os.path.join(draft, "pair_maps.json")):
        subprocess.run([sys.executable, "-m", "bench", "models", "pair", MODELS, "--draft-attention"],
                       check=True, cwd=ROOT)
    with open(os.path.join(draft, "pair_maps.json")) as f:
        maps = json.load(f)
    assert maps.get("draft_attention"), "not the draft-attention pair"
    return target, draft, maps


_RUNS = {}


def _run(pair, mode, page=1, fault=None):
    """One server (``mode`` ours / upstream, ``page`` size, ``fault`` for ours), the 16 prompts
    at concurrency 8: per request output_ids, spec_verify_ct, histogram; the plugin counters."""
    key = (mode, page, fault)
    if key in _RUNS:
        return _RUNS[key]
    target, draft, _ = pair
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    if fault:
        env[FAULT_ENV] = fault
    name = f"{mode}_p{page}" + (f"_{fault}" if fault else "")
    run = serve_prompts(target, draft, mode, page, prompts=PROMPTS, tokens=TOKENS, steps=STEPS,
                        concurrency=CONCURRENCY, common_args=ACCEPT_PAIR_ARGS, env=env,
                        log_path=os.path.join(LOG_DIR, f"server_draft_attn_{name}.log"))
    RESULTS[name] = run
    _RUNS[key] = run
    return run


def _predicted(maps, fault=None):
    sims = [ds.simulate_draft_attention(maps, p, TOKENS, STEPS, fault) for p in PROMPTS]
    return sims, [ap.accepted_histogram(s["accepted"]) for s in sims]


def _chain_draft_extend_every_step(run):
    """Ours replayed every verify step and every draft extend through the chain kernel."""
    st = run["plugin"]
    assert st and st["runner"] == "VerifyCudaGraphRunner" and st["num_draft_tokens"] == STEPS + 1, st
    assert st["fallback_total"] == 0 and st["replays"] == st["verify_steps"] > 0, st
    de = st.get("draft_extend") or {}
    assert de.get("attention", "").startswith("chain"), st
    assert de["replays"] == st["verify_steps"] and de["eager"] == 0, de


def _min_draft_extend_splits() -> int:
    """The chain kernel's ``num_kv_splits`` at the draft's shape, smallest over buckets 1..8 on
    CUDA device 0 (what ``ChainDraftExtendTritonBackend.num_kv_splits_for`` picks)."""
    import torch

    from sglang_verify_graph.kernel.chain_verify_attention import ChainVerifyShape, choose_num_kv_splits

    shape = ChainVerifyShape(num_q_heads=ap.HEADS, num_kv_heads=ap.KV_HEADS, head_dim_qk=ap.HEAD_DIM,
                             head_dim_v=ap.HEAD_DIM, num_draft_tokens=STEPS + 1, rope_dim=0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return min(choose_num_kv_splits(shape, bs, sms) for bs in range(1, MAX_BUCKET + 1))


@pytest.mark.parametrize("page", [1, 64])
def test_parity_ours_upstream(da_pair, page):
    maps = da_pair[2]
    sims, hists = _predicted(maps)
    total = Counter(a for s in sims for a in s["accepted"])
    assert set(total) == set(range(STEPS + 1)), total  # precondition: every accepted count occurs
    modes = ["upstream", "ours"] if page == 1 else [m for m in P64_MODES if m == "upstream"] + ["ours"]
    runs = {m: _run(da_pair, m, page) for m in modes}
    for mode, run in runs.items():
        bad = [i for i, (got, s) in enumerate(zip(run["output_ids"], sims)) if got != s["output_ids"]]
        assert not bad, f"{mode} page {page}: requests {bad} differ from the g-chain"
        assert run["histogram"] == hists, f"{mode} page {page}: histograms differ from the prediction"
        assert run["verify_ct"] == [len(s["accepted"]) for s in sims], f"{mode} page {page}"
    _chain_draft_extend_every_step(runs["ours"])
    assert all(r["plugin"] is None for m, r in runs.items() if m != "ours")


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_changes_histograms_not_outputs(da_pair, fault):
    maps = da_pair[2]
    if fault == "draft_extend_drop_first_split":
        splits = _min_draft_extend_splits()
        assert splits >= 2, (f"num_kv_splits {splits} at some bucket <= {MAX_BUCKET}: the prediction "
                             f"of {fault} assumes >= 2")
    clean, clean_hists = _predicted(maps)
    sims, hists = _predicted(maps, fault)
    changed = [i for i, (a, b) in enumerate(zip(hists, clean_hists)) if a != b]
    assert changed, f"{fault}: the simulation changes no histogram (precondition)"
    run = _run(da_pair, "ours", 1, fault)
    _chain_draft_extend_every_step(run)  # the faulted kernel served every draft extend
    bad = [i for i, (got, s) in enumerate(zip(run["output_ids"], clean)) if got != s["output_ids"]]
    assert not bad, f"{fault}: requests {bad} changed output (the target decides the tokens)"
    assert run["histogram"] == hists, f"{fault}: histograms differ from the faulted prediction"
    assert run["verify_ct"] == [len(s["accepted"]) for s in sims], fault
    seen = [i for i, (got, want) in enumerate(zip(run["histogram"], clean_hists)) if got != want]
    assert seen == changed, f"{fault}: requests {seen} changed, predicted {changed}"
    RESULTS.setdefault("fault_first_changed_cycle", {})[fault] = [
        (ds.changed_cycles(maps, p, TOKENS, STEPS, fault) or [(None,)])[0][0] for p in PROMPTS]
