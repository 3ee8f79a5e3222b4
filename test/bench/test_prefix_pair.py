"""CPU tier: the prefix-reading pair (``bench/models/accept_pair/prefix.py``) and its simulator.

Failure mode guarded (on the GPU by the server tests that serve this pair): a verify that reads a
wrong KV slot somewhere in the prefix (a stale or wrong page-table entry, a dropped KV split, the
wrong layer's buffer) while the output still looks right. The attention pair reads only its own
key and BOS, so such a read could not change its tokens. Here, on CPU: the float reference
forward of the built weights (bfloat16 as SGLang keeps tensors) gives the simulator's greedy id at
every output row, clean and under single faults of each kind and under each kernel test fault
step by step; and the simulator's coverage of single faults is >= 95 % at spans 1k and 8k.
"""

import random

import pytest

from bench.models import accept_pair as ap
from bench.models.accept_pair import coverage as cv
from bench.models.accept_pair import prefix as px
from bench.models.accept_pair import prefix_sim as ps

torch = pytest.importorskip("torch")
SPAN, STEPS = 64, 3
KW = dict(heads=px.PREFIX_HEADS, kv_heads=px.PREFIX_KV_HEADS, rope_theta=px.PREFIX_THETA, bf16=True)


def test_check_scores_leave_room_for_the_sink():
    """Every other offset of a check, and another layer's keys at any offset up to 17k
    positions, score at most NON_PEAK_MAX of the peak; the BOS sink sits >= 15 logits from both."""
    d = torch.arange(-17000, 17001, dtype=torch.float64)
    worst = 0.0
    for ql in range(1, px.PREFIX_LAYERS):
        for kl in range(1, px.PREFIX_LAYERS):
            for off in (1, 512, 8192):
                s = px.check_score(d, off, ql, kl)
                if ql == kl:
                    assert abs(float(s[d == -off]) - px.PEAK_SCORE) < 1e-9
                    s = s[d != -off]
                worst = max(worst, float(s.max()))
    assert worst <= px.NON_PEAK_MAX * px.PEAK_SCORE
    assert px.SINK_SCORE - worst >= 15.0 and px.PEAK_SCORE - px.SINK_SCORE >= 15.0


def test_offsets_span_the_prefix():
    offs = px.prefix_offsets(1024)
    assert offs[0] == 1 and offs[-1] == 1024 and len(set(offs)) == px.PREFIX_KV_HEADS
    with pytest.raises(ValueError, match="span 8"):
        px.prefix_offsets(8)


@pytest.fixture(scope="module")
def pair64():
    maps = ap.pair_maps(0.7, 0, attention=True)
    target, draft = px.build_prefix_weights(maps, SPAN)
    bf = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in target.items()}
    prompt = ps.prefix_prompts(1, SPAN, seed=3, slack=4)[0]
    sim = ps.simulate_prefix(maps, SPAN, prompt, 24, STEPS)
    return maps, bf, draft, prompt, list(prompt) + sim["output_ids"]


def test_greedy_is_g_at_every_output_row_with_a_margin(pair64):
    maps, bf, _, prompt, seq = pair64
    logits = ap.reference_logits(bf, seq, **KW)[0]
    T = len(prompt)
    assert logits[T - 1:-1].argmax(-1).tolist() == [maps["g"][t] for t in seq[T - 1:-1]]
    top = logits[T - 1:].float().topk(2, -1).values
    assert float((top[:, 0] - top[:, 1]).min()) > 10.0


def _faults(T):
    pages = [0, 5, T // 2, T - 3, T - 1]
    out = [(f"page{p}", ps.PrefixFault(page=(p, p + 1))) for p in pages]
    out += [("drop0", ps.PrefixFault(drop=(0, 40))), ("drop_mid", ps.PrefixFault(drop=(30, 50)))]
    for a in range(px.PREFIX_LAYERS):
        for b in range(px.PREFIX_LAYERS):
            if a != b:
                kv = tuple(b if x == a else x for x in range(px.PREFIX_LAYERS))
                out.append((f"layer{a}<-{b}", ps.PrefixFault(kv_layer=kv)))
    return out


def test_each_single_fault_changes_rows_as_simulated(pair64):
    """The float reference under each fault equals the simulator at every output row up to and
    including the first row it changes, and every one of these faults changes a row."""
    maps, bf, _, prompt, _ = pair64
    checks = cv.reference_check(bf, maps, SPAN, prompt, 24, STEPS, _faults(len(prompt)))
    assert checks[0]["fault"] == "clean" and checks[0]["changed_at"] is None
    assert [c["fault"] for c in checks if c["mismatches"]] == []
    assert [c["fault"] for c in checks[1:] if c["changed_at"] is None] == []


def test_a_check_without_its_output_is_seen_by_the_reference(pair64):
    """The comparison can fail: with layer 3's KV-head-5 check writing nothing, the reference
    no longer changes the rows the simulator says a page fault at that check's reach changes."""
    maps, bf, _, prompt, _ = pair64
    broken = dict(bf)
    wo = broken["model.layers.3.self_attn.o_proj.weight"].clone()
    wo[:, 10 * px.HEAD_DIM:12 * px.HEAD_DIM] = 0
    broken["model.layers.3.self_attn.o_proj.weight"] = wo
    T = len(prompt)
    p = T - px.prefix_offsets(SPAN)[5]  # read only by the KV-head-5 check of the first output row
    checks = cv.reference_check(broken, maps, SPAN, prompt, 24, STEPS,
                                [("page", ps.PrefixFault(page=(p, p + 1)))])
    assert checks[1]["mismatches"]


@pytest.mark.parametrize("fault", ps.KERNEL_FAULTS)
def test_kernel_faults_step_by_step_are_the_reference(pair64, fault):
    """simulate_prefix(fault=...) against the float forward at every verify step of one request,
    each step's fault as the kernel's test switch applies it (4 splits at the launch); the fault
    changes the outputs. The request is long enough for 3 KV splits for drop_middle_split, and
    short enough (<= 2 spans) for the checks to reach the middle for the others."""
    maps, bf, _, _, _ = pair64
    extra = 70 if fault == "drop_middle_split" else 40
    rng = random.Random(1)
    prompt = ps.prefix_prompts(1, SPAN, seed=5, slack=0)[0] + [rng.randrange(10, 500) for _ in range(extra)]
    want = ps.simulate_prefix(maps, SPAN, prompt, 16, STEPS, fault=fault, num_kv_splits=4)
    y, out, accepted = prompt[-1], [maps["g"][prompt[-1]]], []
    while len(out) < 16:
        drafts = [maps["d1"][y]]
        for _ in range(STEPS - 1):
            drafts.append(maps["G"][drafts[-1]])
        chain, prefix = [out[-1]] + drafts, prompt + out[:-1]
        f = ps.step_fault(fault, len(prefix), STEPS + 1, 4)
        af = ap.AttentionFault(causal_shift=f.causal_shift, page=f.page, drop=f.drop,
                               kv_layer=f.kv_layer)
        logits = ap.reference_logits(bf, prefix + chain, chain_start=len(prefix), fault=af,
                                     logits_from=len(prefix), **KW)[0]
        preds = logits[len(prefix):].argmax(-1).tolist()
        a = 0
        while a < STEPS and drafts[a] == preds[a]:
            a += 1
        accepted.append(a)
        out.extend(drafts[:a] + [preds[a]])
        y = chain[a]
    assert (out[:16], accepted) == (want["output_ids"], want["accepted"])
    assert want["output_ids"] != ps.simulate_prefix(maps, SPAN, prompt, 16, STEPS)["output_ids"]


@pytest.mark.parametrize("span,prompts,new_tokens", [(1024, 8, 116), (8192, 2, 600)])
def test_coverage_of_single_faults_is_at_least_95_percent(span, prompts, new_tokens):
    maps = ap.pair_maps(0.7, 0, attention=True)
    cov = ps.coverage(maps, span, ps.prefix_prompts(prompts, span, slack=8), new_tokens, STEPS, 16)
    assert {k: v["share"] >= 0.95 for k, v in cov.items()} == {"page": True, "split": True, "layer": True}


def test_coverage_counts_positions_beyond_the_span_as_missed():
    """A prompt longer than span + 2 leaves its first positions out of every check's reach: the
    coverage counts them as missed (and only them)."""
    maps = ap.pair_maps(0.7, 0, attention=True)
    prompt = ps.prefix_prompts(1, SPAN, seed=2, slack=0)[0] + [77] * 20
    cov = ps.coverage(maps, SPAN, [prompt], 64, STEPS, 16)["page"]
    T = len(prompt)
    assert cov["faults"] == T
    missed = {p for _, p in cov["missed"]}
    assert missed and all(0 < p < T - SPAN for p in missed)


def test_step_fault_arithmetic():
    assert ps.split_bounds(200, 4) == [(0, 50), (50, 100), (100, 150), (150, 200)]
    assert ps.step_fault("drop_middle_split", 196, 4, 4).drop == (100, 150)
    assert ps.step_fault("drop_middle_split", 100, 4, 4).drop is None  # 2 splits
    assert ps.step_fault("drop_first_split", 100, 4, 4).drop == (0, 52)
    assert ps.step_fault("middle_page_entry", 101, 4).page == (50, 51)
    assert ps.step_fault("wrong_layer_kv", 9, 4).kv_layer == (1, 0, 1, 2)
    with pytest.raises(ValueError, match="num_kv_splits"):
        ps.step_fault("drop_first_split", 9, 4)
    with pytest.raises(ValueError, match="use one of"):
        ps.step_fault("nope", 9, 4)


def test_the_simulated_faults_are_the_switchs_verify_faults():
    from sglang_verify_graph.env import TEST_FAULT_LAUNCHES

    assert set(ps.KERNEL_FAULTS) == {k for k, v in TEST_FAULT_LAUNCHES.items() if v == "verify"}


def test_the_draft_is_the_plain_pairs(pair64):
    maps, _, draft, _, _ = pair64
    _, plain = ap.build_weights(maps, heads=px.PREFIX_HEADS, kv_heads=px.PREFIX_KV_HEADS)
    assert all(torch.equal(draft[k], plain[k]) for k in plain)
