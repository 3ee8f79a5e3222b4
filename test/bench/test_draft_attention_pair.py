"""CPU tier: the draft-attention pair (``bench/models/accept_pair/draft_attn.py``), its simulator
and its float reference.

Failure mode guarded (on the GPU by ``test/e2e/test_draft_attention_e2e.py``): the draft's
``DRAFT_EXTEND_V2`` attention (our chain kernel with the flag on) wrong while every output token
still looks right. The other pairs' drafts have ``o_proj = 0``, so no draft-extend attention,
right or wrong, reaches a proposal. Here, on CPU: the float forward of the built draft (bf16 as
SGLang keeps tensors), replayed over the rows SGLang 0.5.16's EAGLE-3 loop runs, gives the
simulator's outputs and accepted drafts per cycle for the server test's 16 prompts, clean and
under each draft-extend test fault (the kernel's column contract), with clear margins; each fault
changes the accepted-draft histogram of those requests; the plain draft, replayed the same way,
does not see the faults, and a draft whose BOS head writes nothing is seen by the comparison.
"""

import json

import pytest

from bench.models import accept_pair as ap
from bench.models.accept_pair import draft_attn as da
from bench.models.accept_pair import draft_attn_sim as ds
from bench.models.accept_pair import draft_reference as dr

torch = pytest.importorskip("torch")
STEPS, TOKENS = 3, 96  # the server test's
PROMPTS = ap.attention_prompts()  # the server test's 16 prompts: BOS + 29..299 ids
FAULTS = [None] + list(ds.DRAFT_EXTEND_FAULTS)


@pytest.fixture(scope="module")
def one_thread():
    """The reference runs thousands of small forwards: one thread (restored after)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pair(one_thread):
    """``(maps, draft state dict in bf16, target embedding in bf16, plain draft in bf16)``."""
    maps = ap.pair_maps(0.7, 0)
    target, draft = da.build_draft_attention_weights(maps)
    _, plain = ap.build_weights(maps)
    bf = lambda sd: {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)  # noqa: E731
                     for k, v in sd.items()}
    return maps, bf(draft), target["model.embed_tokens.weight"].to(torch.bfloat16), bf(plain)


def test_the_simulated_faults_are_the_switchs_draft_extend_faults():
    from sglang_verify_graph.env import TEST_FAULT_LAUNCHES

    assert set(ds.DRAFT_EXTEND_FAULTS) == {k for k, v in TEST_FAULT_LAUNCHES.items()
                                           if v == "draft-extend"}


def test_extend_read_arithmetic():
    P, nd = 100, 4
    assert [ds.extend_read(P, nd, j) for j in range(nd)] == [(P + j, True) for j in range(nd)]
    plus = [ds.extend_read(P, nd, j, "draft_extend_causal_plus_one") for j in range(nd)]
    assert plus == [(P + 1, True), (P + 2, True), (P + 3, True), (P + 3, True)]  # last row: own
    minus = [ds.extend_read(P, nd, j, "draft_extend_causal_minus_one") for j in range(nd)]
    assert minus == [(P + j - 1, True) for j in range(nd)]
    for splits in (2, 4, 64):  # BOS unread iff the request has > 1 split: P + nd > 64
        assert ds.extend_read(60, nd, 2, "draft_extend_drop_first_split", splits) == (62, True)
        assert ds.extend_read(61, nd, 2, "draft_extend_drop_first_split", splits) == (63, False)
    with pytest.raises(ValueError, match="use one of"):
        ds.extend_read(P, nd, 0, "causal_plus_one")  # a verify fault


def test_tables_keep_the_plain_draft_and_flip_it_without_bos():
    maps = ap.pair_maps(0.7, 0)
    DA, DB = da.draft_tables(maps)
    g, d1 = maps["g"], maps["d1"]
    for y in range(3, len(g)):
        x = g[y]
        assert DA[x] == d1[y] and DB[x] != DA[x]
        assert (DB[x] == g[x]) != (DA[x] == g[x])  # BOS missing flips the first draft's acceptance


def test_clean_draft_is_the_plain_pairs():
    """Without a fault the draft proposes the plain draft's tokens: ``simulate``'s outputs and
    accepted drafts, every accepted count 0..3 occurring."""
    maps = ap.pair_maps(0.7, 0)
    seen = set()
    for p in PROMPTS:
        got, want = (ds.simulate_draft_attention(maps, p, TOKENS, STEPS),
                     ap.simulate(maps, p, TOKENS, STEPS))
        assert (got["output_ids"], got["accepted"]) == (want["output_ids"], want["accepted"])
        seen.update(got["accepted"])
    assert seen == set(range(STEPS + 1))


@pytest.mark.parametrize("fault", ds.DRAFT_EXTEND_FAULTS)
def test_each_fault_changes_histograms_not_outputs(fault):
    """The target decides the outputs: equal to the clean ones. The first drafts change, hence
    the accepted-draft histograms: of every one of the 16 requests; the changed cycles are
    the ones the simulator lists (a changed first draft at a cycle with another accepted count)."""
    maps = ap.pair_maps(0.7, 0)
    changed = []
    for i, p in enumerate(PROMPTS):
        clean = ds.simulate_draft_attention(maps, p, TOKENS, STEPS)
        bad = ds.simulate_draft_attention(maps, p, TOKENS, STEPS, fault)
        assert bad["output_ids"] == clean["output_ids"]
        if ap.accepted_histogram(bad["accepted"]) != ap.accepted_histogram(clean["accepted"]):
            changed.append(i)
            cycles = ds.changed_cycles(maps, p, TOKENS, STEPS, fault)
            assert any(c[5] != c[6] for c in cycles), (i, cycles[:3])
    assert changed == list(range(len(PROMPTS))), changed


def test_drop_first_split_changes_only_requests_past_one_split():
    """``draft_extend_drop_first_split`` changes a first draft only at draft extends whose
    request holds > 64 keys (prefix + 4 chain rows), where the flip rule changes every one."""
    maps = ap.pair_maps(0.7, 0)
    prompt = PROMPTS[0][:30]
    log = []
    ds.simulate_draft_attention(maps, prompt, TOKENS, STEPS, "draft_extend_drop_first_split", log=log)
    assert {e["draft"] != e["clean"] for e in log if e["prefix_len"] + STEPS + 1 <= 64} == {False}
    assert {e["draft"] != e["clean"] for e in log if e["prefix_len"] + STEPS + 1 > 64} == {True}


def test_self_head_margins_to_2048(pair):
    """The self head (bf16 q, k after RoPE) at query positions up to 2047: its own key beats every
    earlier key by >= 30 logits, the next key beats its own by >= 10 (``causal_plus_one``), the
    previous key beats every older one by >= 10 (``causal_minus_one``)."""
    _, draft, embed, _ = pair
    for n in (32, 400, 1000, 2047):
        s = dr.self_scores(draft, embed, n)
        assert float(s[n] - s[:n].max()) >= 30.0, n
        assert float(s[n + 1] - s[n]) >= 10.0, n
        assert float(s[n - 1] - s[:n - 1].max()) >= 10.0, n


@pytest.mark.parametrize("fault", FAULTS)
def test_reference_is_the_simulator(pair, fault):
    """The float draft replayed over SGLang's rows for the server test's 16 prompts x 96 tokens
    gives the simulator's outputs and accepted drafts per cycle; at every row whose argmax SGLang
    uses the top logit leads by >= 10, every self head's best key by >= 10, and the BOS head
    weights BOS >= 0.99 (or, a draft extend under ``drop_first_split`` past one split, reads
    no BOS)."""
    maps, draft, embed, _ = pair
    for i, p in enumerate(PROMPTS):
        ref = dr.replay(draft, embed, maps, p, TOKENS, STEPS, fault)
        sim = ds.simulate_draft_attention(maps, p, TOKENS, STEPS, fault)
        assert (ref["output_ids"], ref["accepted"]) == (sim["output_ids"], sim["accepted"]), i
        rows = ref["rows"]
        assert min(r["margin"] for r in rows) >= 10.0, i
        assert min(r["self_gap"] for r in rows) >= 10.0, i
        assert all(r["bos_weight"] >= 0.99 or (r["bos_weight"] == 0.0 and r["kind"] == "extend"
                                                and fault == "draft_extend_drop_first_split")
                   for r in rows), i


@pytest.mark.parametrize("fault", ds.DRAFT_EXTEND_FAULTS)
def test_the_plain_draft_does_not_see_the_faults(pair, fault):
    """The same replay with the plain pair's draft (``o_proj = 0``): the faulted run's accepted
    drafts are the clean prediction's, not the faulted one's: a pair without draft attention
    cannot guard the draft extend."""
    maps, _, embed, plain = pair
    p = PROMPTS[1]
    ref = dr.replay(plain, embed, maps, p, TOKENS, STEPS, fault)
    assert ref["accepted"] == ap.simulate(maps, p, TOKENS, STEPS)["accepted"]
    assert ref["accepted"] != ds.simulate_draft_attention(maps, p, TOKENS, STEPS, fault)["accepted"]


def test_a_bos_head_without_output_is_seen(pair):
    """The comparison can fail: with the BOS head's ``o_proj`` column zeroed the clean reference
    proposes ``DB`` everywhere and no longer equals the simulator."""
    maps, draft, embed, _ = pair
    broken = dict(draft)
    wo = broken["midlayer.self_attn.o_proj.weight"].clone()
    wo[:, da.BOS_HEAD * ap.HEAD_DIM:(da.BOS_HEAD + 1) * ap.HEAD_DIM] = 0
    broken["midlayer.self_attn.o_proj.weight"] = wo
    p = PROMPTS[1]
    ref = dr.replay(broken, embed, maps, p, 32, STEPS)
    assert ref["accepted"] != ds.simulate_draft_attention(maps, p, 32, STEPS)["accepted"]


def test_cli_writes_the_pair(tmp_path, one_thread):
    """``python -m bench models pair DIR --draft-attention``: both folders; the target's weights
    are the plain pair's, the draft's this construction's (bf16), ``pair_maps.json`` marks it;
    refused with ``--attention``."""
    from safetensors.torch import load_file

    from bench.models.accept_pair.cli import main

    assert main([str(tmp_path), "--draft-attention"]) == 0
    base = tmp_path / da.DRAFT_ATTN_NAME
    maps = ap.pair_maps(0.7, 0)
    _, draft = da.build_draft_attention_weights(maps)
    plain_target, _ = ap.build_weights(maps)
    got_t = load_file(str(base / "model.safetensors"))
    got_d = load_file(str(base) + "-eagle3/model.safetensors")
    bf = lambda v: v.to(torch.bfloat16) if v.is_floating_point() else v  # noqa: E731
    assert all(torch.equal(got_t[k], bf(plain_target[k])) for k in plain_target)
    assert all(torch.equal(got_d[k], bf(draft[k])) for k in draft)
    saved = json.loads((tmp_path / (da.DRAFT_ATTN_NAME + "-eagle3") / "pair_maps.json").read_text())
    assert saved["draft_attention"] is True and saved["d1"] == maps["d1"] and saved["G"] == maps["G"]
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--draft-attention", "--attention"])
