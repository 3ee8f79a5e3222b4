#!/usr/bin/env python3
"""A Llama target + EAGLE-3 draft whose agreement is set by construction (real weights, no hub).

    python3 scripts/accept_pair.py OUT_DIR [--agree 0.7] [--seed 0] [--attention]

writes ``OUT_DIR/llama-pair`` (LlamaForCausalLM) and ``OUT_DIR/llama-pair-eagle3``
(LlamaForCausalLMEagle3): config.json, tokenizer (``sglang_verify_graph.dummy_models.write_model``) and
``model.safetensors`` with every weight SGLang loads, plus ``pair_maps.json`` (the maps below).
``--attention`` writes ``OUT_DIR/llama-pair-attn`` and ``OUT_DIR/llama-pair-attn-eagle3`` instead:
the same maps, but a target whose greedy token goes through its layer-0 attention (below).
Random dummy weights give an accept length of 1.0 (the draft never agrees), so accept-length
bookkeeping bugs (sgl-project/sglang#16974) cannot show; this
pair makes every accepted count 0..num_steps occur, mixed within a batch, and predictable.

Construction (``H`` hidden, ``V`` vocab, ``V <= H / 2``; ``e_t`` = unit vector ``t``, ``u_t`` =
unit vector ``V + t``):

* target: ``embed_tokens[t] = e_t``; every layer's ``o_proj`` and ``down_proj`` are zero (q/k/v
  and gate/up are random, so the attention kernels still read and write real KV), so the residual
  stream of token ``t`` stays ``e_t`` at every layer; ``lm_head[g(t), t] = 1``. Greedy next
  token: exactly ``g(t)``, a random cyclic permutation of the ids >= 3 (0/1/2 = pad/bos/eos map
  to themselves), with no near-ties.
* draft (SGLang 0.5.16 ``llama_eagle3.py``): the aux hidden states (the residual entering the
  captured layers) are ``e_y`` three times; ``fc`` maps the first copy to ``u_y``. Its one layer
  has ``o_proj = 0``, so its output state is ``h + mlp(norm(h))``; the MLP is a lookup table
  (intermediate unit ``k`` reads input dim ``k`` through gate and up, ``down`` writes
  ``target - source`` scaled by the unit's activation): ``u_y -> e_{D1(y)}`` and
  ``e_t -> e_{G(t)}``. ``lm_head[t, t] = 1`` reads the state's token.
* So in an EAGLE-3 cycle whose bonus token ``b = g(y)`` follows the last accepted token ``y``,
  the drafts are ``d_1 = D1(y)``, ``d_{k+1} = G(d_k)``; the target accepts ``d_1`` iff
  ``D1(y) = g(g(y))`` and ``d_{k+1}`` iff ``G(d_k) = g(d_k)``. ``D1`` and ``G`` agree with the
  target on a random share ``--agree`` of the ids and name another token elsewhere.

:func:`simulate` replays greedy EAGLE-3 on these maps and gives the accepted-draft count of every
cycle, which the server test compares with SGLang's ``spec_correct_drafts_histogram``.
Needs torch and safetensors (the GPU machine has both); the maps need only the standard library.

The attention pair (``attention=True``; the plain pair's target never reads its attention output,
so a wrong verify attention at draft positions >= 1 cannot change its tokens). Every prompt starts
with BOS (id 1) at position 0; ``V`` is a power of two, ``b = log2 V`` bits. Each id ``t`` has a
unique ``b``-bit code (:func:`make_codes`): ``b - 1`` bits ``h(t)`` (as +-1) and a sign ``s(t)``;
ids 0/1 share ``h`` (so no single fault makes the target emit pad or BOS).

* residual: ``e_t`` plus 1 in the bias dim ``V`` (the embedding); layer 0's attention adds
  ``b + 1`` features in dims ``V + 1 ..``: ``h`` of the token its self head attends to, then
  ``(s(t), -s(t))`` from the two BOS heads when BOS is visible, ``(-1, -1)`` when it is not.
  Every other head and every MLP write nothing (``o_proj`` columns / ``down_proj`` zero), so
  later layers leave the residual alone; their q/k/v stay random (real KV).
* self head (q head 0, KV head 0): q and k read only the bias dim (constant before RoPE), so the
  score of a key at offset ``d = m - n`` is ``sum_i A_i cos((d + 1) w_i)`` over the 32 fastest
  rotary planes (HF/SGLang neox RoPE, ``rope_theta``): it peaks at the next token (``d = -1``).
  Visible under the correct causal limit, the token itself (``d = 0``) wins by 35 logits over
  every ``d`` in 1..2048; with the limit one further it attends to the next token (by 14.4), one
  short to the previous one (by 16.5) (bfloat16 q/k). Its value: ``h(token)``.
* BOS heads (q heads 2, 3, KV head 1): k reads only ``e_BOS`` (4 slowest planes: 24 logits at
  position 0, > 22 at 2048; every other key scores 0), q reads the token: ``+s(t)`` / ``-s(t)``;
  value +1 for BOS, -1 otherwise. So head 2 gives ``s(t)``, head 3 ``-s(t)``; without BOS
  (a dropped first KV split, a wrong first page-table entry) both give -1.
* lm_head: ``logit(n) = w(n) . f + 2 [n = g(p(t))]`` (times the final norm, ~9.2), ``w(n)`` the
  features that ``g^-1(n)`` produces, ``p(t)`` the id with ``t``'s code and the other sign.
  Correct features: ``g(t)`` by 2 (18 logits). Self head on another token ``a``: ``g`` of the id
  with code ``(h(a), s(t))``; BOS missing: ``g(p(t))``, each by the same margin.
  :func:`attention_prediction` is that rule, :func:`reference_logits` the float forward.
* draft: the plain pair's. ``fc`` reads only the token dims of the aux states, so the bias and
  the features (correct or faulted) never reach it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys

HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, LAYERS, INTERMEDIATE = 1024, 512, 8, 4, 128, 4, 2048
AUX_IDS = [0, 1, 2]  # SGLang captures the residual entering layers 1, 2, 3 (< LAYERS)
SPECIAL = 3  # ids 0/1/2: pad/bos/eos, fixed points of every map
BOS = 1
GATE_Z = 4.0  # pre-activation of a lookup unit: silu(4) * 4 = 15.7
ROPE_THETA, RMS_EPS = 10000.0, 1e-5  # the target config's (dummy_models._llama)
NAMES = {False: "llama-pair", True: "llama-pair-attn"}  # target folder; the draft's adds "-eagle3"

# attention pair (``attention=True``)
SELF_HEAD, BOS_HEADS = 0, (2, 3)  # q heads of layer 0 (KV heads 0 and 1 with 2 q heads each)
SELF_PLANES = 32  # the self head's rotary planes: the fastest 32 of head_dim / 2
SELF_SCORE = 120.0  # the self head's score (logits, after sm_scale) of the peak offset
BOS_PLANES = 4  # the BOS heads' rotary planes: the slowest 4
BOS_SCORE = 24.0  # the BOS heads' score of the BOS key at position 0 (logits)
PARTNER_BONUS = 2.0  # lm_head weight of e_t for g(p(t)), in units of the feature weight 1
MIN_KEYS_PER_SPLIT = 64  # the chain kernel's (sgl_verify_kernel): keys per KV split at least
FAULTS = ("causal_plus_one", "causal_minus_one", "drop_first_split")
"""Verify-attention faults :func:`simulate` models (the chain kernel's test fault switch)."""


def make_maps(vocab: int = VOCAB, agree: float = 0.7, seed: int = 0) -> dict:
    """The target map ``g`` and the draft maps ``D1`` (first draft) and ``G`` (later drafts).

    Returns a dict of three lists of ``vocab`` ints each (``"g"``, ``"d1"``, ``"G"``). ``g`` is a
    single cycle over the ids >= 3. ``d1[y] == g[g[y]]`` and ``G[t] == g[t]`` on a random share
    ``agree`` (0..1) of the ids >= 3 (independently drawn), another id >= 3 elsewhere.
    """
    if not 0.0 <= agree <= 1.0:
        raise ValueError(f"agree must be in [0, 1], got {agree}")
    if vocab - SPECIAL < 2:
        raise ValueError(f"vocab must be >= {SPECIAL + 2}, got {vocab}")
    rng = random.Random(seed)
    ids = list(range(SPECIAL, vocab))
    rng.shuffle(ids)
    g = list(range(vocab))
    for a, b in zip(ids, ids[1:] + ids[:1]):
        g[a] = b
    d1, G = list(range(vocab)), list(range(vocab))
    for t in range(SPECIAL, vocab):
        for table, right in ((d1, g[g[t]]), (G, g[t])):
            if rng.random() < agree:
                table[t] = right
            else:  # another id >= 3
                table[t] = SPECIAL + (right - SPECIAL + rng.randrange(1, vocab - SPECIAL)) % (
                    vocab - SPECIAL)
    return {"g": g, "d1": d1, "G": G}


def make_codes(vocab: int = VOCAB, seed: int = 0) -> list:
    """The attention pair's code of every id: a list of ``vocab`` distinct ints in ``[0, vocab)``.

    Bit ``b - 1`` (``b = log2 vocab``) is the sign ``s`` (set: +1), bits ``0 .. b - 2`` are ``h``.
    Ids pair up as partners with equal ``h`` and opposite sign (ids 0 and 1 are one pair, so a
    regular id is never the partner of BOS or pad). Raises ValueError unless ``vocab`` is a power
    of two >= 8.
    """
    bits = vocab.bit_length() - 1
    if vocab < 8 or vocab != 1 << bits:
        raise ValueError(f"the attention pair needs vocab a power of two >= 8, got {vocab}")
    rng = random.Random(f"codes-{seed}")
    rest = list(range(2, vocab))
    rng.shuffle(rest)
    pairs = [(0, 1)] + list(zip(rest[0::2], rest[1::2]))
    hs = list(range(vocab // 2))
    rng.shuffle(hs)
    sign = 1 << (bits - 1)
    code = [0] * vocab
    for (a, b), h in zip(pairs, hs):
        if rng.random() < 0.5:
            a, b = b, a
        code[a], code[b] = h | sign, h
    return code


def code_bits(code: int, vocab: int = VOCAB) -> tuple:
    """``(h, s)`` of one code: ``h`` a tuple of ``log2 vocab - 1`` values +-1.0, ``s`` +-1.0."""
    bits = vocab.bit_length() - 1
    h = tuple(1.0 if code >> j & 1 else -1.0 for j in range(bits - 1))
    return h, (1.0 if code >> (bits - 1) & 1 else -1.0)


def attention_prediction(maps: dict, t: int, attended: int, bos_visible: bool = True,
                         inverse: dict | None = None) -> int:
    """The attention pair's greedy token at a position holding ``t`` whose self head attends to
    the token ``attended`` (``t`` itself under the correct causal limit) and whose BOS heads see
    BOS or not. ``maps`` needs ``"g"`` and ``"code"``; ``inverse``: code -> id (built when None).

    Correct attention gives ``g(t)``; another ``attended`` gives ``g`` of the id with code
    ``(h(attended), s(t))``; BOS missing (with ``attended == t``) gives ``g(p(t))``, ``p(t)`` the
    id of ``t``'s code with the other sign. Raises ValueError for BOS missing together with
    another attended token (the features of no id: not a single fault).
    """
    code, g = maps["code"], maps["g"]
    inv = inverse if inverse is not None else {c: i for i, c in enumerate(code)}
    sign = 1 << (len(code).bit_length() - 2)
    if bos_visible:
        return g[inv[(code[attended] & (sign - 1)) | (code[t] & sign)]]
    if attended != t:
        raise ValueError("attention_prediction: BOS missing and another attended token is not "
                         "a single fault")
    return g[inv[code[t] ^ sign]]


def chain_predictions(maps: dict, prefix: list, chain: list, fault: str | None = None,
                      inverse: dict | None = None) -> list:
    """The target's greedy token at every chain row of one verify step.

    ``prefix``: the ids before the chain (positions ``0 .. len(prefix) - 1``, BOS first);
    ``chain``: the verified ids (the bonus token, then the drafts). ``fault`` (one of
    :data:`FAULTS` or None) is applied to the chain rows as the chain kernel's test fault switch
    applies it: ``causal_plus_one`` (row ``j`` also sees chain token ``j + 1``; the last row
    unchanged), ``causal_minus_one`` (row ``j`` does not see itself), ``drop_first_split`` (the
    keys of the first KV split unread when ``len(prefix) + len(chain) > MIN_KEYS_PER_SPLIT``, so
    that the request has more than one split: assumes a split count >= 2, which every verify bucket
    up to bs 32 gets at 4 KV heads). Without a fault the rows give ``g(chain[j])`` (any maps).
    """
    g = maps["g"]
    if fault is None:
        return [g[t] for t in chain]
    if fault not in FAULTS:
        raise ValueError(f"fault {fault!r}: use one of {', '.join(FAULTS)} or None")
    inv = inverse if inverse is not None else {c: i for i, c in enumerate(maps["code"])}
    out = []
    for j, t in enumerate(chain):
        attended, bos = t, True
        if fault == "causal_plus_one" and j + 1 < len(chain):
            attended = chain[j + 1]
        elif fault == "causal_minus_one":
            attended = chain[j - 1] if j else prefix[-1]
        elif fault == "drop_first_split":
            bos = len(prefix) + len(chain) <= MIN_KEYS_PER_SPLIT
        out.append(attention_prediction(maps, t, attended, bos, inv))
    return out


def attention_prompts(n: int = 16, seed: int = 11, lo: int = 30, hi: int = 300,
                      vocab: int = VOCAB) -> list:
    """``n`` prompts for the attention pair: BOS, then ``lo - 1 .. hi - 1`` random ids in
    ``[10, vocab - 10)`` (lists of ints; the server test's and its CPU prediction's)."""
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(10, vocab - 10) for _ in range(rng.randrange(lo - 1, hi))]
            for _ in range(n)]


def simulate(maps: dict, prompt: list, max_new_tokens: int, num_steps: int,
             fault: str | None = None) -> dict:
    """Greedy EAGLE-3 (topk 1) on the maps: the output ids and the accepted drafts per cycle.

    The prefill emits ``g(prompt[-1])``; each cycle then drafts ``num_steps`` tokens, accepts the
    longest agreeing prefix (``a`` drafts) and emits ``a + 1`` tokens (capped at
    ``max_new_tokens``). Returns ``{"output_ids": [...], "accepted": [a per cycle]}``; the
    histogram SGLang reports counts these ``a`` values (index = accepted drafts).
    ``fault``: the verify rows follow :func:`chain_predictions` under that fault (the attention
    pair's maps, with ``"code"``; the prefill is not faulted), else the target map ``g``.
    """
    g, d1, G = maps["g"], maps["d1"], maps["G"]
    inv = {c: i for i, c in enumerate(maps["code"])} if fault is not None else None
    y, b = prompt[-1], g[prompt[-1]]
    out, accepted = [b], []
    while len(out) < max_new_tokens:
        drafts = [d1[y]]
        for _ in range(num_steps - 1):
            drafts.append(G[drafts[-1]])
        chain = [b] + drafts
        preds = chain_predictions(maps, list(prompt) + out[:-1], chain, fault, inv)
        a = 0
        while a < num_steps and drafts[a] == preds[a]:
            a += 1
        accepted.append(a)
        out.extend(drafts[:a] + [preds[a]])
        y, b = chain[a], preds[a]
    return {"output_ids": out[:max_new_tokens], "accepted": accepted}


def accepted_histogram(accepted: list) -> list:
    """Cycles per accepted-draft count (index 0..max(accepted)) of one request, as SGLang's
    ``spec_correct_drafts_histogram`` reports them after :func:`trim_histogram`."""
    return [accepted.count(k) for k in range(max(accepted) + 1)] if accepted else []


def trim_histogram(h: list) -> list:
    """``h`` without its trailing zeros (SGLang's histogram has one slot per possible count)."""
    h = list(h)
    while h and h[-1] == 0:
        h.pop()
    return h


def _configs() -> tuple:
    from sglang_verify_graph import dummy_models as mm

    target = mm._llama(HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, 8192, ROPE_THETA,
                       head_dim=HEAD_DIM)
    assert target["rms_norm_eps"] == RMS_EPS and target["rope_scaling"] is None, target
    draft = mm._eagle3_draft(dict(target), AUX_IDS, HIDDEN)
    mm.check_pair("llama-pair", target, draft)
    return mm, target, draft


def feature_dims(vocab: int = VOCAB) -> dict:
    """The attention pair's residual dims: ``{"bias": V, "self": [V + 1 .. V + b - 1],
    "bos": [V + b, V + b + 1]}`` (``b = log2 V``)."""
    bits = vocab.bit_length() - 1
    return {"bias": vocab, "self": list(range(vocab + 1, vocab + bits)),
            "bos": [vocab + bits, vocab + bits + 1]}


def rope_inv_freq(head_dim: int = HEAD_DIM, theta: float = ROPE_THETA):
    """The rotary frequencies (rad per position, float32 ``[head_dim / 2]``) as SGLang 0.5.16's
    ``RotaryEmbedding._compute_inv_freq`` computes them (neox style: plane ``i`` rotates dims
    ``i`` and ``i + head_dim / 2``)."""
    import torch

    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def _attention_target(target: dict, maps: dict, hidden: int, vocab: int, heads: int,
                      kv_heads: int, head_dim: int) -> None:
    """Turn the plain target (one-hot residual, zero ``o_proj``) into the attention pair's, in
    place: embedding bias dim, layer-0 self and BOS heads, the code lm_head (module docstring)."""
    import torch

    code, g = maps["code"], maps["g"]
    dims = feature_dims(vocab)
    nbits = len(dims["self"])
    group, half = heads // kv_heads, head_dim // 2
    if group < 2 or kv_heads < 2 or SELF_PLANES + BOS_PLANES > half:
        raise ValueError(f"the attention pair needs >= 2 KV heads of >= 2 q heads and head_dim >= "
                         f"{2 * (SELF_PLANES + BOS_PLANES)} (heads {heads}, kv {kv_heads}, "
                         f"head_dim {head_dim})")
    if hidden < vocab + nbits + 3:
        raise ValueError(f"the attention pair needs hidden >= vocab + {nbits + 3}, got {hidden}")
    if BOS_HEADS != (group, group + 1):
        raise ValueError(f"BOS_HEADS {BOS_HEADS} must be the q heads of KV head 1 ({group}, {group + 1})")
    target["model.embed_tokens.weight"][:, dims["bias"]] = 1.0
    r0 = 1.0 / (2.0 / hidden + RMS_EPS) ** 0.5  # normalized value of e_t and of the bias dim
    scale = head_dim ** -0.5
    w = rope_inv_freq(head_dim).double()
    p = "model.layers.0.self_attn."
    wq, wk = target[p + "q_proj.weight"], target[p + "k_proj.weight"]
    wv, wo = target[p + "v_proj.weight"], target[p + "o_proj.weight"]
    qh = lambda h: slice(h * head_dim, (h + 1) * head_dim)  # noqa: E731
    for h in (SELF_HEAD,) + BOS_HEADS:
        wq[qh(h)] = 0.0
    for kvh in (SELF_HEAD // group, BOS_HEADS[0] // group):
        wk[qh(kvh)] = 0.0
        wv[qh(kvh)] = 0.0
    # self head: score(d) = SELF_SCORE * sum_i A_i cos((d + 1) w_i) / sum_i A_i, A_i ~ sqrt(w_i)
    amp = w[:SELF_PLANES].sqrt()
    a = (amp / amp.sum() * SELF_SCORE / scale).sqrt()
    qv, kv = torch.zeros(head_dim, dtype=torch.float64), torch.zeros(head_dim, dtype=torch.float64)
    kv[:SELF_PLANES] = a
    qv[:SELF_PLANES] = a * w[:SELF_PLANES].cos()
    qv[half:half + SELF_PLANES] = a * w[:SELF_PLANES].sin()
    base = SELF_HEAD * head_dim
    wq[base:base + head_dim, dims["bias"]] = (qv / r0).float()
    base = (SELF_HEAD // group) * head_dim
    wk[base:base + head_dim, dims["bias"]] = (kv / r0).float()
    hbits = torch.tensor([code_bits(c, vocab)[0] for c in code])  # [V, nbits]
    sgn = torch.tensor([code_bits(c, vocab)[1] for c in code])  # [V]
    wv[base:base + nbits, :vocab] = hbits.T / r0
    for j in range(nbits):
        wo[dims["self"][j], SELF_HEAD * head_dim + j] = 1.0
    # BOS heads: k from e_BOS only, q = +-s(t); value +1 for BOS, -1 for every other id
    b = (BOS_SCORE / BOS_PLANES / scale) ** 0.5
    planes = list(range(half - BOS_PLANES, half))
    base = (BOS_HEADS[0] // group) * head_dim
    for i in planes:
        wk[base + i, BOS] = b / r0
        for h, sign in zip(BOS_HEADS, (1.0, -1.0)):
            wq[h * head_dim + i, :vocab] = sign * sgn * b / r0
    wv[base, :vocab] = -1.0 / r0
    wv[base, BOS] = 1.0 / r0
    for h, d in zip(BOS_HEADS, dims["bos"]):
        wo[d, h * head_dim] = 1.0
    # lm_head: logit(n) = w(n) . f + PARTNER_BONUS [n = g(p(t))], w(n) = features of g^-1(n)
    feats = torch.cat([hbits, sgn[:, None], -sgn[:, None]], dim=1)  # F(t) [V, nbits + 2]
    ginv = [0] * vocab
    for t, n in enumerate(g):
        ginv[n] = t
    lm = torch.zeros(vocab, hidden)
    lm[:, dims["self"] + dims["bos"]] = feats[torch.tensor(ginv)]
    inv = {c: i for i, c in enumerate(code)}
    sign_bit = 1 << nbits
    for t in range(vocab):
        lm[g[inv[code[t] ^ sign_bit]], t] = PARTNER_BONUS
    target["lm_head.weight"] = lm


def build_weights(maps: dict, hidden: int = HIDDEN, vocab: int = VOCAB, layers: int = LAYERS,
                  heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                  intermediate: int = INTERMEDIATE, seed: int = 0, attention: bool = False):
    """The two state dicts (HF names, float32 CPU tensors): ``(target, draft)``.

    ``attention``: the attention pair's target (``maps`` then needs ``"code"``, from
    :func:`make_codes`); the draft is the same either way.

    Raises:
        ValueError: ``vocab > hidden // 2`` or ``intermediate < 2 * vocab`` (no room for the
            one-hot states or the lookup units); with ``attention``, a shape without room for
            its heads or features, or a vocab that is not a power of two.
    """
    import torch

    if vocab > hidden // 2 or intermediate < 2 * vocab:
        raise ValueError(f"need vocab <= hidden/2 and intermediate >= 2*vocab "
                         f"(vocab {vocab}, hidden {hidden}, intermediate {intermediate})")
    if attention and len(maps.get("code", ())) != vocab:
        raise ValueError("attention=True needs maps['code'] (make_codes) with one code per id")
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    eye = torch.eye(vocab)
    embed = torch.zeros(vocab, hidden)
    embed[:, :vocab] = eye  # e_t
    target = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(hidden)}
    lm_head = torch.zeros(vocab, hidden)
    lm_head[torch.tensor(maps["g"]), torch.arange(vocab)] = 1.0
    target["lm_head.weight"] = lm_head
    for i in range(layers):
        p = f"model.layers.{i}."
        target.update({
            p + "self_attn.q_proj.weight": rand(q_out, hidden),
            p + "self_attn.k_proj.weight": rand(kv_out, hidden),
            p + "self_attn.v_proj.weight": rand(kv_out, hidden),
            p + "self_attn.o_proj.weight": torch.zeros(hidden, q_out),
            p + "mlp.gate_proj.weight": rand(intermediate, hidden),
            p + "mlp.up_proj.weight": rand(intermediate, hidden),
            p + "mlp.down_proj.weight": torch.zeros(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })

    # Draft: fc maps the first aux copy e_y -> u_y; the MLP is the lookup u_y -> e_D1(y),
    # e_t -> e_G(t); lm_head reads e_t.
    fc = torch.zeros(hidden, hidden * len(AUX_IDS))
    fc[vocab + torch.arange(vocab), torch.arange(vocab)] = 1.0
    a = GATE_Z / hidden ** 0.5  # normalized one-hot input = sqrt(hidden) at its dim
    act = GATE_Z * torch.sigmoid(torch.tensor(GATE_Z)).item() * GATE_Z  # silu(z) * z
    gate, up = torch.zeros(intermediate, hidden), torch.zeros(intermediate, hidden)
    down = torch.zeros(hidden, intermediate)
    for src, dst_of in ((vocab, maps["d1"]), (0, maps["G"])):  # u_y rows, then e_t rows
        for t in range(vocab):
            k = src + t  # unit k reads input dim k
            gate[k, k] = up[k, k] = a
            down[dst_of[t], k] += 1.0 / act
            down[k, k] -= 1.0 / act
    lm_head_d = torch.zeros(vocab, hidden)
    lm_head_d[:, :vocab] = eye
    p = "midlayer."
    draft = {
        "fc.weight": fc, "norm.weight": torch.ones(hidden), "lm_head.weight": lm_head_d,
        "embed_tokens.weight": rand(vocab, hidden),
        "d2t": torch.zeros(vocab, dtype=torch.int64),
        p + "self_attn.q_proj.weight": rand(q_out, 2 * hidden),
        p + "self_attn.k_proj.weight": rand(kv_out, 2 * hidden),
        p + "self_attn.v_proj.weight": rand(kv_out, 2 * hidden),
        p + "self_attn.o_proj.weight": torch.zeros(hidden, q_out),
        p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
        p + "mlp.down_proj.weight": down,
        p + "input_layernorm.weight": torch.ones(hidden),
        p + "hidden_norm.weight": torch.ones(hidden),
        p + "post_attention_layernorm.weight": torch.ones(hidden),
    }
    if attention:
        _attention_target(target, maps, hidden, vocab, heads, kv_heads, head_dim)
    return target, draft


def pair_maps(agree: float = 0.7, seed: int = 0, attention: bool = False) -> dict:
    """The maps of one pair: :func:`make_maps`, plus ``"code"`` (:func:`make_codes`) for the
    attention pair."""
    maps = make_maps(VOCAB, agree, seed)
    if attention:
        maps["code"] = make_codes(VOCAB, seed)
    return maps


@dataclasses.dataclass(frozen=True)
class AttentionFault:
    """A verify-attention fault of :func:`reference_logits`, applied to the chain rows only.

    ``causal_shift``: row ``r`` sees keys ``[0, r + 1 + causal_shift)`` (capped at the sequence);
    ``drop_below``: keys ``[0, drop_below)`` unread; ``page``: ``(p, q)``, the page-table entry of
    position ``p`` holds the slot of position ``q`` (key and value of ``q``, rotated at ``q``).
    """

    causal_shift: int = 0
    drop_below: int = 0
    page: tuple | None = None


def reference_logits(sd: dict, ids: list, chain_start: int | None = None,
                     fault: AttentionFault | None = None, bf16: bool = False,
                     heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                     rope_theta: float = ROPE_THETA, skip_zero: bool = True) -> tuple:
    """The float CPU forward of a target state dict over one sequence: ``(logits, entering)``.

    A plain Llama forward as SGLang 0.5.16 computes it for this config: RMSNorm (eps
    :data:`RMS_EPS`), neox RoPE with float32 ``cos``/``sin`` (``rope_inv_freq``), causal GQA
    softmax attention with ``head_dim ** -0.5``, SiLU-gated MLP, final norm, lm_head.
    ``ids``: token ids (positions 0..T-1); ``chain_start``: first row of the verify chain, the
    rows ``fault`` applies to (None: no chain). ``bf16``: round to bfloat16 where SGLang keeps
    bfloat16 tensors (weights; every norm output; q, k, v; q and k after RoPE; the attention
    output; ``o_proj`` / MLP outputs; the residual; the logits); accumulation stays float32.
    ``skip_zero``: skip a head whose ``o_proj`` columns are all zero and an MLP whose
    ``down_proj`` is (they add exactly 0). Returns ``logits`` float32 ``[T, V]`` and
    ``entering``: the residual (float32 ``[T, hidden]``) entering each layer.
    """
    import torch

    R = (lambda x: x.to(torch.bfloat16).float()) if bf16 else (lambda x: x)  # noqa: E731
    W = {k: R(v.float()) for k, v in sd.items() if v.is_floating_point()}
    T = len(ids)
    cs = T if chain_start is None else chain_start
    fault = fault or AttentionFault()
    group, half = heads // kv_heads, head_dim // 2
    ang = torch.arange(T, dtype=torch.float)[:, None] * rope_inv_freq(head_dim, rope_theta)[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(v):  # [T, h, D]
        a, b = v[..., :half], v[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def norm(v, w):
        return R(v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w)

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    src = torch.arange(T)
    if fault.page is not None:
        src[fault.page[0]] = fault.page[1]
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    entering = []
    layers = sum(1 for k in W if k.endswith("input_layernorm.weight"))
    for i in range(layers):
        p = f"model.layers.{i}."
        entering.append(x.clone())
        h = norm(x, W[p + "input_layernorm.weight"])
        wo = W[p + "self_attn.o_proj.weight"]
        live = [hh for hh in range(heads)
                if not skip_zero or wo[:, hh * head_dim:(hh + 1) * head_dim].any()]
        if live:
            q = R(rope(R(h @ W[p + "self_attn.q_proj.weight"].T).view(T, heads, head_dim)))
            k = R(rope(R(h @ W[p + "self_attn.k_proj.weight"].T).view(T, kv_heads, head_dim)))
            v = R(h @ W[p + "self_attn.v_proj.weight"].T).view(T, kv_heads, head_dim)
            out = torch.zeros(T, heads, head_dim)
            for hh in live:
                kk, vv = k[:, hh // group], v[:, hh // group]
                s = (q[:, hh] @ kk.T) * head_dim ** -0.5
                out[:, hh] = torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ vv
                for r in range(cs, T):  # chain rows: the fault
                    keys = torch.arange(fault.drop_below, min(r + 1 + fault.causal_shift, T))
                    sl = src[keys]
                    out[r, hh] = torch.softmax((kk[sl] @ q[r, hh]) * head_dim ** -0.5, 0) @ vv[sl]
            x = R(x + R(R(out).reshape(T, -1) @ wo.T))
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        down = W[p + "mlp.down_proj.weight"]
        if not skip_zero or down.any():
            act = torch.nn.functional.silu(R(h @ W[p + "mlp.gate_proj.weight"].T))
            x = R(x + R(R(act * R(h @ W[p + "mlp.up_proj.weight"].T)) @ down.T))
    logits = R(norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T)
    return logits, entering


def write_pair(out: str, agree: float = 0.7, seed: int = 0, attention: bool = False) -> tuple:
    """Write both folders under ``out`` (:data:`NAMES`: ``llama-pair`` or, with ``attention``,
    ``llama-pair-attn``, and the draft's ``-eagle3``); returns ``(target_dir, draft_dir)``."""
    import torch
    from safetensors.torch import save_file

    mm, tcfg, dcfg = _configs()
    maps = pair_maps(agree, seed, attention)
    tw, dw = build_weights(maps, seed=seed, attention=attention)
    dirs = []
    base = NAMES[attention]
    for name, cfg, weights in ((base, tcfg, tw), (base + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=agree, seed=seed, attention=attention), f)
        dirs.append(d)
    return tuple(dirs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--agree", type=float, default=0.7, help="share of ids where the draft agrees")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attention", action="store_true",
                    help="write the attention pair (llama-pair-attn): its target's greedy token "
                         "goes through its verify attention")
    a = ap.parse_args(argv)
    if not 0.0 <= a.agree <= 1.0:
        ap.error(f"--agree {a.agree}: want a share in [0, 1]")
    for d in write_pair(a.out, a.agree, a.seed, a.attention):
        print(f"wrote {d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
