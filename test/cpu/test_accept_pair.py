"""CPU tier: the constructed target/draft pair of ``scripts/accept_pair.py``.

Failure mode guarded (on the GPU, by ``test/e2e/test_accept_length_e2e.py``): accept length
drops under graphs while the text still looks fine (sgl-project/sglang#16974); random
dummy weights cannot show it (accept length 1.0). Here, on CPU: the weights really implement
the maps (a float32 / bfloat16 re-computation of the Llama and LlamaForCausalLMEagle3 layer
arithmetic of SGLang 0.5.16: RMSNorm with eps, SiLU-gated MLP, zero attention output), and
:func:`simulate` gives every accepted count 0..num_steps, mixed across requests.
"""

import os
import sys
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import accept_pair as ap  # noqa: E402

torch = pytest.importorskip("torch")
EPS = 1e-5  # rms_norm_eps of dummy_models._llama


def _rmsnorm(x, w):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def _mlp(x, p, sd):
    gate = x @ sd[p + "mlp.gate_proj.weight"].T
    up = x @ sd[p + "mlp.up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def pair(request):
    maps = ap.make_maps(ap.VOCAB, 0.7, 0)
    target, draft = ap.build_weights(maps)
    dt = request.param
    cast = lambda sd: {k: (v.to(dt) if v.is_floating_point() else v) for k, v in sd.items()}  # noqa: E731
    return maps, cast(target), cast(draft), dt


def _target_residuals(target, dt):
    """Residual stream of every token id (rows) entering each layer, and the final logits."""
    resid = target["model.embed_tokens.weight"].clone()
    entering = []
    for i in range(ap.LAYERS):
        p = f"model.layers.{i}."
        entering.append(resid.clone())
        x = _rmsnorm(resid, target[p + "input_layernorm.weight"])
        v = x @ target[p + "self_attn.v_proj.weight"].T  # attention output is a mix of v rows
        attn = v.repeat(1, ap.HEADS // ap.KV_HEADS) @ target[p + "self_attn.o_proj.weight"].T
        resid = resid + attn
        resid = resid + _mlp(_rmsnorm(resid, target[p + "post_attention_layernorm.weight"]), p, target)
    logits = _rmsnorm(resid, target["model.norm.weight"]) @ target["lm_head.weight"].T
    return entering, logits


def test_target_greedy_next_token_is_g(pair):
    maps, target, _, dt = pair
    _, logits = _target_residuals(target, dt)
    assert logits.argmax(-1).tolist() == maps["g"]
    top2 = logits.float().topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 20.0  # no near-ties: margin ~ sqrt(hidden)


def test_draft_chain_follows_d1_then_G(pair):
    maps, target, draft, dt = pair
    entering, _ = _target_residuals(target, dt)
    aux = torch.cat([entering[i + 1] for i in ap.AUX_IDS], dim=-1)  # SGLang captures layer id+1
    h = aux @ draft["fc.weight"].T
    p = "midlayer."
    expect = list(maps["d1"])
    for step in range(5):  # num_steps up to 5
        # o_proj = 0: the attention output is zero whatever q/k/v read.
        assert not draft[p + "self_attn.o_proj.weight"].any()
        s = h + _mlp(_rmsnorm(h, draft[p + "post_attention_layernorm.weight"]), p, draft)
        logits = _rmsnorm(s, draft["norm.weight"]) @ draft["lm_head.weight"].T
        got = logits.argmax(-1).tolist()
        assert got[ap.SPECIAL:] == expect[ap.SPECIAL:], f"draft step {step + 1}"
        h = s  # next step's hidden: the pre-norm output (llama_eagle3.py, norm_output False)
        expect = [maps["G"][t] for t in expect]


def test_maps_agree_on_the_requested_share():
    maps = ap.make_maps(ap.VOCAB, 0.7, 0)
    g, d1, G = maps["g"], maps["d1"], maps["G"]
    ids = range(ap.SPECIAL, ap.VOCAB)
    assert sorted(g[t] for t in ids) == list(ids)  # a permutation of the ids >= 3 ...
    t, seen = ap.SPECIAL, set()
    while t not in seen:
        seen.add(t)
        t = g[t]
    assert len(seen) == ap.VOCAB - ap.SPECIAL  # ... that is one cycle
    share_d1 = sum(d1[t] == g[g[t]] for t in ids) / len(ids)
    share_g = sum(G[t] == g[t] for t in ids) / len(ids)
    assert 0.6 < share_d1 < 0.8 and 0.6 < share_g < 0.8, (share_d1, share_g)
    assert all(d1[t] >= ap.SPECIAL and G[t] >= ap.SPECIAL for t in ids)
    none = ap.make_maps(ap.VOCAB, 0.0, 1)
    assert not any(none["G"][t] == none["g"][t] for t in ids)
    with pytest.raises(ValueError):
        ap.make_maps(ap.VOCAB, 1.5)


def test_simulate_hand_case():
    # ids 3..6 in one cycle 3->4->5->6->3; d1 agrees only at 3, G only at 5.
    g = [0, 1, 2, 4, 5, 6, 3]
    d1 = [0, 1, 2, 5, 3, 3, 3]
    G = [0, 1, 2, 3, 3, 6, 3]
    sim = ap.simulate({"g": g, "d1": d1, "G": G}, [9, 3], 8, num_steps=3)
    # prefill emits g(3)=4; cycle 1: y=3, drafts 5, G(5)=6, G(6)=3 -> 5 ok (g(4)), 6 ok (g(5)),
    # 3 ok (g(6)): a=3, emits 5 6 3 + bonus 4; cycle 2: y=3 again, same: emits 5 6 3 (capped).
    assert sim["output_ids"] == [4, 5, 6, 3, 4, 5, 6, 3]
    assert sim["accepted"] == [3, 3]
    sim = ap.simulate({"g": g, "d1": d1, "G": G}, [4], 4, num_steps=2)
    # y=4: d1(4)=3 != g(5)=6 -> a=0, emit 6; y=5: d1(5)=3 == g(6) ok, G(3)=3 != g(3)=4 -> a=1
    assert sim["output_ids"] == [5, 6, 3, 4]
    assert sim["accepted"] == [0, 1]


def test_simulate_output_is_the_target_chain_and_mixes_accept_counts():
    maps = ap.make_maps(ap.VOCAB, 0.7, 0)
    import random

    rng = random.Random(7)
    for num_steps in (1, 2, 3, 5):
        total = Counter()
        for _ in range(16):
            prompt = [rng.randrange(10, ap.VOCAB - 10) for _ in range(rng.randrange(4, 40))]
            sim = ap.simulate(maps, prompt, 128, num_steps)
            want, t = [], prompt[-1]
            for _ in range(128):
                t = maps["g"][t]
                want.append(t)
            assert sim["output_ids"] == want  # drafting never changes greedy output
            total.update(sim["accepted"])
        assert set(total) == set(range(num_steps + 1)), (num_steps, total)
