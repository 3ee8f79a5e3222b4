#!/usr/bin/env python3
"""A Llama target + EAGLE-3 draft whose agreement is set by construction (real weights, no hub).

    python3 bench/models/accept_pair.py OUT_DIR [--agree 0.7] [--seed 0] [--attention]
    python3 bench/models/accept_pair.py OUT_DIR --shape llama8b --attention [--agree 0.36,0.55,0.65,0.77]

writes ``OUT_DIR/llama-pair`` (LlamaForCausalLM) and ``OUT_DIR/llama-pair-eagle3``
(LlamaForCausalLMEagle3): config.json, tokenizer (``bench.models.dummy_models.write_model``) and
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

The Llama-3.1-8B-shape pair (``--shape llama8b [--attention]``; :data:`LLAMA8B`, the timing of a
real Llama-3.1-8B and its EAGLE-3 draft with an accept length set by construction) writes
``OUT_DIR/llama8b-pair[-attn]`` and its ``-eagle3``:

* the construction above at :data:`VOCAB` ids in layer 0 (the self head's planes at rope_theta
  500000 with the llama3 ``rope_scaling``, as SGLang's ``Llama3RotaryEmbedding`` rotates them; the
  BOS heads are q heads 4 and 5, KV head 1's first two); layers 1-31 at full size with random
  q/k/v and gate/up and zero ``o_proj`` / ``down_proj``: real compute, no write to the residual;
  embedding and lm_head padded with zero rows to vocab 128256 (no prompt holds an id >= 512,
  and a zero row's logit 0 stays below the greedy token's, which is positive);
* the draft: one layer of hidden 4096, intermediate 14336, 32 / 8 heads, ``draft_vocab_size``
  32000 (the lm_head rows beyond 512 zero, ``d2t`` zeros: SGLang 0.5.16's ``llama_eagle3.py``
  turns it into ``hot_token_id = d2t + arange``, the identity; ``t2d`` is not read), aux layer
  ids [1, 15, 28]; no ``embed_tokens`` (the EAGLE-3 worker's ``set_embed`` shares the target's);
* weights in ``pytorch_model.bin`` (``torch.save``), where every layer's tensors are views of a
  few shared storages, stored once: 2.4 + 0.8 GiB instead of 16 + 1.9 GiB of safetensors. SGLang
  0.5.16's ``DefaultModelLoader`` reads ``*.bin`` when a folder has no ``*.safetensors``
  (``torch.load(weights_only=True)``) and copies each tensor into that layer's own parameter.
  Written in 33 s on 2 busy CPU cores (5.7 GB peak memory);
* agreement classes (:func:`make_class_maps`): the ids >= 3 split into one class per ``--agree``
  value, ``g`` one cycle per class, so a request's accept length is set by the class of its last
  prompt token (:func:`speedup_prompts`) and one pair serves several accept lengths. The default
  classes (:data:`AGREE_LLAMA8B`) and the accept length :func:`simulate` gives a request of each
  at num_steps 3 and 128 new tokens (SGLang's completion tokens / verify steps; 64-512 new tokens:
  within 0.2):

  =========  =====  =====  =====  =====
  agree      0.36   0.55   0.65   0.77
  accept     1.52   2.00   2.46   2.98
  =========  =====  =====  =====  =====
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
MIN_KEYS_PER_SPLIT = 64  # the chain kernel's (sglang_verify_graph.kernel): keys per KV split at least
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
    from bench.models import dummy_models as mm

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


def rope_inv_freq(head_dim: int = HEAD_DIM, theta: float = ROPE_THETA, scaling: dict | None = None):
    """The rotary frequencies (rad per position, float32 ``[head_dim / 2]``) as SGLang 0.5.16's
    ``RotaryEmbedding._compute_inv_freq`` computes them (neox style: plane ``i`` rotates dims
    ``i`` and ``i + head_dim / 2``). ``scaling``: a config's ``rope_scaling``; ``rope_type``
    ``llama3`` applies ``Llama3RotaryEmbedding._compute_inv_freq`` (planes of wavelength below
    ``original_max_position_embeddings / high_freq_factor`` unchanged, above ``.. /
    low_freq_factor`` divided by ``factor``, smoothly interpolated between). Raises ValueError
    for another ``rope_type``."""
    import math

    import torch

    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r}: only llama3 is modelled")
    factor, lo, hi = scaling["factor"], scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    orig = scaling["original_max_position_embeddings"]
    wave = 2 * math.pi / inv
    smooth = (orig / wave - lo) / (hi - lo) if lo != hi else 0
    return torch.where(wave < orig / hi, inv, torch.where(
        wave > orig / lo, inv / factor, (1 - smooth) * inv / factor + smooth * inv))


def bos_heads(heads: int = HEADS, kv_heads: int = KV_HEADS) -> tuple:
    """The attention pair's two BOS q heads: the first two q heads of KV head 1 (``(2, 3)`` for
    :data:`HEADS` / :data:`KV_HEADS`, ``(4, 5)`` at 32 q / 8 KV heads)."""
    group = heads // kv_heads
    return (group, group + 1)


def _attention_target(target: dict, maps: dict, hidden: int, vocab: int, heads: int,
                      kv_heads: int, head_dim: int, rope_theta: float = ROPE_THETA,
                      rope_scaling: dict | None = None) -> None:
    """Turn the plain target (one-hot residual, zero ``o_proj``) into the attention pair's, in
    place: embedding bias dim, layer-0 self and BOS heads (:func:`bos_heads`), the code lm_head
    (module docstring); the self head's planes follow ``rope_theta`` / ``rope_scaling``."""
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
    bos_q = bos_heads(heads, kv_heads)
    target["model.embed_tokens.weight"][:, dims["bias"]] = 1.0
    r0 = 1.0 / (2.0 / hidden + RMS_EPS) ** 0.5  # normalized value of e_t and of the bias dim
    scale = head_dim ** -0.5
    w = rope_inv_freq(head_dim, rope_theta, rope_scaling).double()
    p = "model.layers.0.self_attn."
    wq, wk = target[p + "q_proj.weight"], target[p + "k_proj.weight"]
    wv, wo = target[p + "v_proj.weight"], target[p + "o_proj.weight"]
    qh = lambda h: slice(h * head_dim, (h + 1) * head_dim)  # noqa: E731
    for h in (SELF_HEAD,) + bos_q:
        wq[qh(h)] = 0.0
    for kvh in (SELF_HEAD // group, bos_q[0] // group):
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
    base = (bos_q[0] // group) * head_dim
    for i in planes:
        wk[base + i, BOS] = b / r0
        for h, sign in zip(bos_q, (1.0, -1.0)):
            wq[h * head_dim + i, :vocab] = sign * sgn * b / r0
    wv[base, :vocab] = -1.0 / r0
    wv[base, BOS] = 1.0 / r0
    for h, d in zip(bos_q, dims["bos"]):
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
                  intermediate: int = INTERMEDIATE, seed: int = 0, attention: bool = False,
                  rope_theta: float = ROPE_THETA, rope_scaling: dict | None = None):
    """The two state dicts (HF names, float32 CPU tensors): ``(target, draft)``.

    ``attention``: the attention pair's target (``maps`` then needs ``"code"``, from
    :func:`make_codes`; its self head is built for ``rope_theta`` / ``rope_scaling``); the draft
    is the same either way.

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
        _attention_target(target, maps, hidden, vocab, heads, kv_heads, head_dim, rope_theta,
                          rope_scaling)
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
                     rope_theta: float = ROPE_THETA, skip_zero: bool = True,
                     rope_scaling: dict | None = None) -> tuple:
    """The float CPU forward of a target state dict over one sequence: ``(logits, entering)``.

    A plain Llama forward as SGLang 0.5.16 computes it for this config: RMSNorm (eps
    :data:`RMS_EPS`), neox RoPE with float32 ``cos``/``sin`` (``rope_inv_freq``, with
    ``rope_scaling``), causal GQA
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
    ang = torch.arange(T, dtype=torch.float)[:, None] * rope_inv_freq(head_dim, rope_theta, rope_scaling)[None]
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


# ---------------------------------------------------------------- real-shape pairs, agreement classes
LLAMA3_ROPE_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}
"""Llama-3.1-8B's ``rope_scaling`` (``dummy_models.llama_8b``)."""


@dataclasses.dataclass(frozen=True)
class PairShape:
    """The widths of one constructed pair.

    ``vocab``: the construction's ids ``0 .. vocab - 1`` (V of the module docstring);
    ``vocab_size``: the config's vocabulary, the rows of the target's embedding and lm_head
    (rows ``>= vocab`` are zero); ``draft_vocab``: the draft's ``draft_vocab_size`` (its lm_head
    rows; rows ``>= vocab`` zero, ``d2t`` all 0, so draft id ``i`` is target id ``i``);
    ``aux_ids``: ``eagle_aux_hidden_state_layer_ids``; ``rope_scaling``: the config's (None or
    :data:`LLAMA3_ROPE_SCALING`).
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    vocab_size: int
    draft_vocab: int
    aux_ids: tuple
    rope_theta: float
    rope_scaling: dict | None
    max_position: int

    def folder(self, attention: bool) -> str:
        """The target's folder name (the draft's adds ``-eagle3``)."""
        return self.name + ("-attn" if attention else "")


LLAMA8B = PairShape("llama8b-pair", 4096, 32, 32, 8, 128, 14336, VOCAB, 128256, 32000, (1, 15, 28),
                    500000.0, LLAMA3_ROPE_SCALING, 131072)
"""Llama-3.1-8B (``dummy_models.llama_8b``: hidden 4096, 32 layers, 32 q / 8 KV heads of 128,
intermediate 14336, vocab 128256, rope_theta 500000 with llama3 scaling, 131072 positions) and its
EAGLE-3 draft's shape (one layer of the same widths, aux layer ids [1, 15, 28], draft vocab 32000)."""
SHAPES = {"llama8b": LLAMA8B}
NUM_STEPS = 3  # the num_steps the agreement classes are calibrated for
ACCEPT_TARGETS = (1.5, 2.0, 2.5, 3.0)
AGREE_LLAMA8B = (0.36, 0.55, 0.65, 0.77)
"""The per-position agreement of each class of the llama8b pair (:func:`make_class_maps`, seed 0,
:data:`VOCAB` ids): the values :func:`calibrate_agree` picks for :data:`ACCEPT_TARGETS` at
num_steps 3 with :data:`SPEEDUP_NEW_TOKENS` new tokens per request (SGLang's accept length =
completion tokens / verify steps; ``test_accept_pair.py`` checks each within 0.15)."""
SPEEDUP_NEW_TOKENS = 128
"""New tokens per request the classes are calibrated at: a request walks ``new_tokens - 1`` >=
its class's cycle (127 or 128 ids), so its accept length is the class's, whatever its start."""


def make_class_maps(vocab: int = VOCAB, agrees=(0.7,), seed: int = 0) -> dict:
    """Target and draft maps with one agreement class per value of ``agrees``.

    The ids >= 3 are shuffled (``seed``) and split into ``len(agrees)`` classes of near-equal
    size; ``g`` is one cycle per class (a token's greedy successor stays in its class, so a
    request keeps the class of its last prompt token). In class ``c`` exactly ``round(agrees[c]
    * n_c)`` ids have ``d1[y] == g[g[y]]`` and as many, drawn separately, ``G[t] == g[t]``; the
    others name another id of the class. Each class draws from its own generator (``seed``,
    ``c``), so one class's maps do not depend on the other classes' agreements, and its agreeing
    ids at a higher agreement include those at a lower one.

    Returns ``{"g", "d1", "G"}`` (lists of ``vocab`` ints, as :func:`make_maps`) and
    ``"classes"``: per class ``{"agree": float, "ids": [class ids in cycle order], "last_token":
    ids[0]}``. Raises ValueError for an agreement outside [0, 1] or a class of < 2 ids.
    """
    agrees = list(agrees)
    if not agrees or any(not 0.0 <= a <= 1.0 for a in agrees):
        raise ValueError(f"agreements must be in [0, 1], got {agrees}")
    ids = list(range(SPECIAL, vocab))
    random.Random(f"classes-{seed}").shuffle(ids)
    k = len(agrees)
    bounds = [len(ids) * c // k for c in range(k + 1)]
    g, d1, G = list(range(vocab)), list(range(vocab)), list(range(vocab))
    classes = []
    for c, agree in enumerate(agrees):
        cyc = ids[bounds[c]:bounds[c + 1]]
        if len(cyc) < 2:
            raise ValueError(f"class {c} has {len(cyc)} ids; use fewer classes or a larger vocab")
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            g[a] = b
        rng = random.Random(f"agree-{seed}-{c}")
        n = len(cyc)
        for table, right in ((d1, lambda t: g[g[t]]), (G, lambda t: g[t])):
            order = list(cyc)
            rng.shuffle(order)
            shift = [rng.randrange(1, n) for _ in cyc]  # drawn whatever the agreement
            hit = set(order[:round(agree * n)])  # nested: a higher agreement adds ids
            for j, t in enumerate(cyc):
                r = right(t)
                table[t] = r if t in hit else cyc[(cyc.index(r) + shift[j]) % n]
        classes.append({"agree": agree, "ids": cyc, "last_token": cyc[0]})
    return {"g": g, "d1": d1, "G": G, "classes": classes}


def speedup_prompts(maps: dict, context: int, bs: int, cls: int, vocab: int = VOCAB) -> list:
    """``bs`` prompts of ``context`` ids for class ``cls`` of :func:`make_class_maps`: BOS, then
    ``context - 2`` random ids in ``[3, vocab)`` (request ``i``'s depend on ``(context, i)`` only,
    so every batch size and class shares them: radix-cache hits), then the class's last token.
    All requests of a batch end in the same token, so they emit the same tokens in the same
    verify steps (equal accept lengths). Raises ValueError for ``context < 2``."""
    if context < 2:
        raise ValueError(f"context {context}: want >= 2 tokens (BOS and the class token)")
    last = maps["classes"][cls]["last_token"]
    out = []
    for i in range(bs):
        rng = random.Random(1000003 * context + i)
        out.append([BOS] + rng.choices(range(SPECIAL, vocab), k=context - 2) + [last])
    return out


def sglang_accept_length(sim: dict) -> float:
    """SGLang's per-request ``spec_accept_length`` of one :func:`simulate` result: completion
    tokens / verify steps (the prefill's token included). Raises ValueError without a cycle."""
    if not sim["accepted"]:
        raise ValueError("no verify step: max_new_tokens 1 emits the prefill's token only")
    return len(sim["output_ids"]) / len(sim["accepted"])


def class_accept_length(maps: dict, cls: int, max_new_tokens: int = SPEEDUP_NEW_TOKENS,
                        num_steps: int = NUM_STEPS) -> float:
    """The simulated SGLang accept length of a request of class ``cls`` (its last token decides
    it: :func:`simulate` without a fault reads no other prompt token)."""
    return sglang_accept_length(simulate(maps, [maps["classes"][cls]["last_token"]],
                                         max_new_tokens, num_steps))


def calibrate_agree(target: float, vocab: int = VOCAB, n_classes: int = 4, cls: int = 0,
                    seed: int = 0, max_new_tokens: int = SPEEDUP_NEW_TOKENS,
                    num_steps: int = NUM_STEPS) -> tuple:
    """The agreement (a multiple of 0.01) whose class ``cls`` of ``n_classes`` gives the
    simulated accept length closest to ``target``: ``(agree, accept_length)``."""
    best = None
    for a in range(101):
        agrees = [0.5] * n_classes
        agrees[cls] = a / 100
        got = class_accept_length(make_class_maps(vocab, agrees, seed), cls, max_new_tokens,
                                  num_steps)
        if best is None or abs(got - target) < abs(best[1] - target):
            best = (a / 100, got)
    return best


def shape_configs(shape: PairShape) -> tuple:
    """``(dummy_models module, target config, draft config)`` of ``shape`` (``dummy_models``'
    Llama and EAGLE-3 config builders; checked with ``check_pair``)."""
    from bench.models import dummy_models as mm

    target = mm._llama(shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate,
                       shape.vocab_size, shape.max_position, shape.rope_theta,
                       head_dim=shape.head_dim, rope_scaling=shape.rope_scaling)
    draft = mm._eagle3_draft(dict(target), list(shape.aux_ids), shape.hidden, shape.draft_vocab)
    mm.check_pair(shape.folder(False), target, draft)
    return mm, target, draft


def build_shape_weights(maps: dict, shape: PairShape, seed: int = 0, attention: bool = True,
                        dtype=None) -> tuple:
    """The two state dicts of ``shape`` (HF names, CPU tensors of ``dtype``, default bfloat16):
    ``(target, draft)``, for ``torch.save`` (``pytorch_model.bin``).

    Layer 0 and the draft are :func:`build_weights`' at ``shape.vocab`` ids. Layers 1 ..
    ``layers - 1`` cost a real layer's compute but write nothing: random q/k/v and gate/up at full
    size, ``o_proj`` and ``down_proj`` zero, so the residual is the one layer 0 leaves. They all
    hold views of the same few tensors (and layer 0's MLP too: it writes nothing in either pair):
    ``torch.save`` stores a shared storage once, SGLang's loader copies it into every layer's own
    parameter. The embedding and lm_head are padded with zero rows to ``vocab_size``: no prompt
    holds an id ``>= vocab``, and a zero lm_head row's logit 0 never wins, the greedy token's
    logit being positive (``test_accept_pair.py``). The draft's lm_head is padded to
    ``draft_vocab`` rows, its ``d2t`` is zeros of that length; it has no ``embed_tokens``
    (SGLang 0.5.16's EAGLE-3 worker gives the draft the target's embedding, ``set_embed``).

    Raises ValueError as :func:`build_weights`, or for a shape whose vocab or draft vocab is
    below ``vocab``.
    """
    import torch

    dtype = dtype or torch.bfloat16
    V, H, I = shape.vocab, shape.hidden, shape.intermediate
    q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    if shape.vocab_size < V or shape.draft_vocab < V:
        raise ValueError(f"shape {shape.name}: vocab_size {shape.vocab_size} and draft_vocab "
                         f"{shape.draft_vocab} must be >= vocab {V}")
    t32, d32 = build_weights(maps, hidden=H, vocab=V, layers=1, heads=shape.heads,
                             kv_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate=I,
                             seed=seed, attention=attention, rope_theta=shape.rope_theta,
                             rope_scaling=shape.rope_scaling)
    gen = torch.Generator().manual_seed(seed + 1)
    rand = lambda *sz: (torch.randn(*sz, generator=gen) * 0.02).to(dtype)  # noqa: E731
    gate, up, attn = rand(I, H), rand(I, H), rand(q_out + 2 * kv_out, H)  # attn: q, k, v rows
    zeros = torch.zeros(H * max(I, q_out), dtype=dtype)
    ones = torch.ones(H, dtype=dtype)
    shared = {"self_attn.q_proj.weight": attn[:q_out], "self_attn.k_proj.weight": attn[q_out:q_out + kv_out],
              "self_attn.v_proj.weight": attn[q_out + kv_out:],
              "self_attn.o_proj.weight": zeros[:H * q_out].view(H, q_out),
              "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up,
              "mlp.down_proj.weight": zeros[:H * I].view(H, I),
              "input_layernorm.weight": ones, "post_attention_layernorm.weight": ones}

    def padded(w, rows):
        out = torch.zeros(rows, w.shape[1], dtype=dtype)
        out[:w.shape[0]] = w
        return out

    target = {k: v.to(dtype) for k, v in t32.items() if not k.startswith("model.layers.0.mlp.")}
    target["model.embed_tokens.weight"] = padded(t32["model.embed_tokens.weight"], shape.vocab_size)
    target["lm_head.weight"] = padded(t32["lm_head.weight"], shape.vocab_size)
    target["model.norm.weight"] = ones
    for k in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        target["model.layers.0." + k] = ones
    for k in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
        target["model.layers.0." + k] = shared[k]
    for i in range(1, shape.layers):
        target.update({f"model.layers.{i}.{k}": v for k, v in shared.items()})
    draft = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in d32.items()
             if k not in ("embed_tokens.weight", "d2t")}
    draft["lm_head.weight"] = padded(d32["lm_head.weight"], shape.draft_vocab)
    draft["d2t"] = torch.zeros(shape.draft_vocab, dtype=torch.int64)
    return target, draft


def unique_bytes(sd: dict) -> int:
    """Bytes ``torch.save`` writes for the tensors of ``sd``: each storage counted once."""
    seen = {}
    for v in sd.values():
        st = v.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def write_shape_pair(out: str, shape: PairShape = LLAMA8B, agrees=AGREE_LLAMA8B, seed: int = 0,
                     attention: bool = True, targets=None) -> tuple:
    """Write the pair of ``shape`` under ``out``: ``shape.folder(attention)`` and its ``-eagle3``,
    each with config.json, tokenizer, ``pytorch_model.bin`` (:func:`build_shape_weights`, shared
    storages written once; SGLang 0.5.16's default loader reads ``*.bin`` when no
    ``*.safetensors`` is there: ``torch.load(weights_only=True)``) and ``pair_maps.json``
    (:func:`make_class_maps`, one class per value of ``agrees``, each with its ``target_accept_length``
    from ``targets`` when given, and the ``shape``). Returns ``(target_dir, draft_dir)``."""
    import torch

    mm, tcfg, dcfg = shape_configs(shape)
    maps = make_class_maps(shape.vocab, agrees, seed)
    if attention:
        maps["code"] = make_codes(shape.vocab, seed)
    for c, cls in enumerate(maps["classes"]):
        cls["target_accept_length"] = targets[c] if targets else None
    tw, dw = build_shape_weights(maps, shape, seed, attention)
    dirs = []
    base = shape.folder(attention)
    for name in (base, base + "-eagle3"):  # a build cut short leaves no pair_maps.json: not "ready"
        stale = os.path.join(out, name, "pair_maps.json")
        if os.path.exists(stale):
            os.remove(stale)
    for name, cfg, weights in ((base, tcfg, tw), (base + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        for old in ("model.safetensors", "pytorch_model.bin"):
            if os.path.exists(os.path.join(d, old)):
                os.remove(os.path.join(d, old))
        torch.save(weights, os.path.join(d, "pytorch_model.bin"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=list(agrees), seed=seed, attention=attention,
                           shape=dataclasses.asdict(shape), num_steps=NUM_STEPS,
                           new_tokens=SPEEDUP_NEW_TOKENS), f)
        dirs.append(d)
    return tuple(dirs)


def estimated_bytes(shape: PairShape) -> int:
    """Bytes of both ``pytorch_model.bin`` files of ``shape`` (bfloat16, shared storages once):
    the target's padded embedding and lm_head, layer 0's attention, the shared layer tensors,
    and the draft (fc, its layer's attention and lookup MLP, padded lm_head, d2t)."""
    H, I = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    target = (2 * shape.vocab_size * H + (2 * q + 2 * kv) * H  # embed, lm_head; layer 0 q/k/v/o
              + 2 * I * H + (q + 2 * kv) * H + H * max(I, q) + H)  # gate, up, q/k/v, zeros, ones
    draft = (3 * H * H + (q + 2 * kv) * 2 * H + q * H + 3 * I * H + shape.draft_vocab * H + 3 * H)
    return 2 * (target + draft) + 8 * shape.draft_vocab


def _agree_list(text: str) -> list:
    """``--agree`` value: one share or a comma list (argparse type; error names the value)."""
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want shares in [0, 1], e.g. 0.7 or 0.36,0.55")
    if not vals or any(not 0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text}: want shares in [0, 1], e.g. 0.7 or 0.36,0.55")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--agree", type=_agree_list, default=None,
                    help="share of ids where the draft agrees (default 0.7); a comma list, or "
                         "--shape: one agreement class per value (default for llama8b: "
                         + ",".join(map(str, AGREE_LLAMA8B)) + ")")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attention", action="store_true",
                    help="write the attention pair (llama-pair-attn): its target's greedy token "
                         "goes through its verify attention")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="write the pair at that model's shape (llama8b: Llama-3.1-8B and its "
                         "EAGLE-3 draft, pytorch_model.bin with shared storages, ~3.3 GB)")
    ap.add_argument("--dry-run", action="store_true",
                    help="with --shape: print the folders and weight bytes, write nothing")
    a = ap.parse_args(argv)
    if a.shape is None:
        if a.dry_run:
            ap.error("--dry-run: only with --shape")
        agree = a.agree or [0.7]
        if len(agree) > 1:
            ap.error(f"--agree {','.join(map(str, agree))}: several agreement classes need --shape")
        for d in write_pair(a.out, agree[0], a.seed, a.attention):
            print(f"wrote {d}", flush=True)
        return 0
    shape = SHAPES[a.shape]
    agrees = a.agree or list(AGREE_LLAMA8B)
    try:
        make_class_maps(shape.vocab, agrees, a.seed)
    except ValueError as ex:
        ap.error(f"--agree: {len(agrees)} agreement classes: {ex}")
    targets = list(ACCEPT_TARGETS) if a.agree is None and shape is LLAMA8B else None
    if a.dry_run:
        print(f"DRYRUN {os.path.join(a.out, shape.folder(a.attention))} and -eagle3: {shape}; "
              f"agreement classes {agrees}; ~{estimated_bytes(shape) / 2**30:.1f} GiB of "
              f"pytorch_model.bin", flush=True)
        return 0
    for d in write_shape_pair(a.out, shape, agrees, a.seed, a.attention, targets):
        size = os.path.getsize(os.path.join(d, "pytorch_model.bin"))
        print(f"wrote {d} ({size / 2**30:.2f} GiB pytorch_model.bin)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
