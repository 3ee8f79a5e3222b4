"""CPU tier: what ``test/e2e/test_prefix_pair_e2e.py`` asserts on the GPU, predicted for its exact
prompts, token counts and split counts.

Failure mode guarded: the server test of the prefix-reading pair passing without seeing a fault
(a fault whose prediction changes no request, prompts past the reach of ``middle_page_entry``, a
split count other than the chain backend's at the batch size the test serves), or unable to fail.
Here, with the e2e module's own constants and functions (loaded from its file): the fault-free
prediction holds every accepted count 0..3 and no BOS; each verify test fault changes at least
one of the 16 requests (``drop_middle_split`` also at a 114-SM GPU's split count); the
e2e's shared-model prediction equals ``simulate_prefix``; its split count equals the backend's
policy for the served config at batch size 1 (and differs at 8, hence concurrency 1); and the
e2e's fault tests pass on a stand-in server that returns the faulted prediction and fail on one
that ignores the fault or uses another split count.
"""

import importlib.util
import os
from collections import Counter

import pytest

from bench.models import accept_pair as ap
from bench.models.accept_pair import prefix as px
from bench.models.accept_pair import prefix_sim as ps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
E2E_PATH = os.path.join(ROOT, "test", "e2e", "test_prefix_pair_e2e.py")
H200_SMS, H100_PCIE_SMS = 132, 114  # H100 SXM has 132 as well


@pytest.fixture(scope="module")
def e2e():
    """The e2e module at its defaults (its ``PREFIX_PAIR_*`` variables unset), loaded from its
    file under a private name, with ``device_sms`` fixed at 132 (an H200 / H100 SXM)."""
    with pytest.MonkeyPatch.context() as mp:
        for var in ("PREFIX_PAIR_TOKENS", "PREFIX_PAIR_FAULTS", "PREFIX_PAIR_P64_MODES"):
            mp.delenv(var, raising=False)
        spec = importlib.util.spec_from_file_location("prefix_pair_e2e_under_cpu_test", E2E_PATH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    mod.device_sms = lambda: H200_SMS
    return mod


@pytest.fixture(scope="module")
def maps():
    """The maps ``python -m bench models pair DIR --prefix`` writes (agree 0.7, seed 0)."""
    return ap.pair_maps(0.7, 0, attention=True)


def _changed(a, b):
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def test_the_e2e_setting(e2e):
    """1k-token prompts within the reach of every check and of middle_page_entry, all six verify
    faults, num_steps 3."""
    lens = [len(p) for p in e2e.PROMPTS]
    assert e2e.SPAN == px.DEFAULT_SPAN == 1024 and e2e.TOKENS == e2e.SPAN // 15 + 48 and e2e.STEPS == 3
    assert len(lens) == 16 and min(lens) >= e2e.SPAN + 2 and max(lens) + e2e.TOKENS <= 2 * e2e.SPAN
    assert e2e.FAULTS == list(ps.KERNEL_FAULTS)
    assert [e2e.fault_concurrency(f) for f in ps.KERNEL_FAULTS] == [
        1 if f.startswith("drop_") else e2e.CONCURRENCY for f in ps.KERNEL_FAULTS]


def test_fault_free_prediction_has_every_accepted_count(e2e, maps):
    sims, hists = e2e._predict(maps)
    total = Counter(a for s in sims for a in s["accepted"])
    assert set(total) == set(range(e2e.STEPS + 1)), total
    assert all(len(s["output_ids"]) == e2e.TOKENS for s in sims)
    assert not any(ap.BOS in s["output_ids"] for s in sims)  # the simulator's BOS rule: BOS at 0 only
    assert [sum(h) for h in hists] == [len(s["accepted"]) for s in sims]


@pytest.mark.parametrize("fault,num_sms", [(f, H200_SMS) for f in ps.KERNEL_FAULTS]
                         + [("drop_middle_split", H100_PCIE_SMS)])
def test_each_fault_changes_a_server_test_request(e2e, maps, fault, num_sms):
    """What ``test_fault_changes_an_output[<fault>]`` asserts, predicted; prints the first changed
    output index per request (the e2e records the server's in fault_first_change)."""
    clean = [s["output_ids"] for s in e2e._predict(maps)[0]]
    k = e2e.fault_kv_splits(fault, num_sms)
    sims = e2e._predict(maps, fault)[0] if num_sms == H200_SMS else e2e.predicted(maps, fault, k)[0]
    bad = [s["output_ids"] for s in sims]
    first = [next((j for j, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(bad, clean)]
    print(f"{fault} at {num_sms} SMs (num_kv_splits {k}): first changed output per request {first}")
    assert _changed(bad, clean), f"{fault}: no request changes"
    assert not any(ap.BOS in o for o in bad), fault


def test_shared_model_prediction_is_simulate_prefix(e2e, maps):
    """The e2e's :func:`predicted` (one PrefixModel for all prompts) on the first prompt, 40 new
    tokens, without a fault, with a split fault and with a fault without a split count."""
    prompt = e2e.PROMPTS[0]
    for fault in (None, "drop_middle_split", "wrong_layer_kv"):
        k = e2e.fault_kv_splits(fault)
        got = e2e.predicted(maps, fault, k, prompts=[prompt], tokens=40)[0][0]
        want = ps.simulate_prefix(maps, e2e.SPAN, prompt, 40, e2e.STEPS, fault=fault, num_kv_splits=k)
        assert (got["output_ids"], got["accepted"]) == (want["output_ids"], want["accepted"]), fault


def test_split_count_is_the_backends_at_batch_size_one(e2e):
    """The chain backend's shape for the served config (q heads, KV heads, head dim from
    config.json, num_draft_tokens 4; its rope tile does not enter the count), its policy at bs 1
    on 132 SMs: what fault_kv_splits gives;
    at bs 8 (concurrency 8) another count, and the split faults change other rows there."""
    from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits

    _, cfg, _ = px.prefix_configs()
    hd = cfg["head_dim"]
    shape = ChainVerifyShape(num_q_heads=cfg["num_attention_heads"], num_kv_heads=cfg["num_key_value_heads"],
                             head_dim_qk=hd, head_dim_v=hd, num_draft_tokens=e2e.STEPS + 1)
    k1 = choose_num_kv_splits(shape, 1, H200_SMS)
    assert e2e.fault_kv_splits("drop_middle_split") == e2e.fault_kv_splits("drop_first_split") == k1 == 32
    assert e2e.fault_kv_splits("middle_page_entry") is None
    assert choose_num_kv_splits(shape, 8, H200_SMS) == 4
    prefix = len(e2e.PROMPTS[0]) - 1
    assert ps.step_fault("drop_middle_split", prefix, 4, k1) != ps.step_fault("drop_middle_split", prefix, 4, 4)


def test_middle_page_entry_is_out_of_reach_past_two_spans(e2e, maps):
    """The precondition the e2e's prompts meet: with 2 spans + 200 prompt tokens no check
    reaches the middle entry, so the fault changes no output (the e2e check could fail there)."""
    prompts = [p + p[1:200] + p[1:] for p in e2e.PROMPTS[:2]]
    assert all(len(p) > 2 * e2e.SPAN + 200 for p in prompts)
    clean = e2e.predicted(maps, None, prompts=prompts)[0]
    bad = e2e.predicted(maps, "middle_page_entry", prompts=prompts)[0]
    assert [s["output_ids"] for s in bad] == [s["output_ids"] for s in clean]


def _server(sims, k=None):
    """A stand-in for one server run of the e2e (``_run``'s dict) returning ``sims``' outputs,
    with counters of every verify step replayed in bucket 1."""
    n = sum(len(s["accepted"]) for s in sims)
    return {"concurrency": 1, "output_ids": [s["output_ids"] for s in sims],
            "verify_ct": [len(s["accepted"]) for s in sims],
            "histogram": [ap.accepted_histogram(s["accepted"]) for s in sims],
            "plugin": {"runner": "VerifyCudaGraphRunner", "num_draft_tokens": 4, "fallback_total": 0,
                       "replays": n, "verify_steps": n, "replayed_requests": n, "padded_rows": 0,
                       "capture_bs": [1, 2, 4, 8]}}


@pytest.mark.parametrize("fault", ["drop_middle_split", "middle_page_entry"])
def test_e2e_fault_tests_pass_on_the_prediction_and_fail_otherwise(e2e, maps, monkeypatch, fault):
    pair = ("target", "draft", maps)
    servers = {"faulted": _server(e2e._predict(maps, fault)[0]), "ignores the fault": _server(e2e._predict(maps)[0])}
    if fault == "drop_middle_split":  # a server whose launch had the bs-8 split count
        servers["another split count"] = _server(e2e.predicted(maps, fault, 4)[0])
    for label, run in servers.items():
        monkeypatch.setattr(e2e, "_run", lambda *a, run=run, **k: run)
        outcomes = []
        for test in (e2e.test_fault_changes_an_output, e2e.test_fault_outputs_match_the_faulted_simulation):
            try:
                test(pair, fault)
                outcomes.append("pass")
            except AssertionError:
                outcomes.append("fail")
        want = {"faulted": ["pass", "pass"], "ignores the fault": ["fail", "fail"],
                "another split count": ["pass", "fail"]}[label]
        assert outcomes == want, (label, outcomes)
