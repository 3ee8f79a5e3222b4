"""The maps of a pair (target map ``g``, draft maps ``D1`` / ``G``, the attention pair's codes,
agreement classes) and what SGLang's EAGLE-3 verify does with them: the greedy outputs, the
accepted drafts per cycle and the accept length, with or without a verify-attention fault.
Pure Python."""

from __future__ import annotations

import random

from bench.models.accept_pair.config import (
    BOS, FAULTS, MIN_KEYS_PER_SPLIT, NUM_STEPS, SPECIAL, SPEEDUP_NEW_TOKENS, VOCAB,
)


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
             fault: str | None = None, predict=None, first_draft=None) -> dict:
    """Greedy EAGLE-3 (topk 1) on the maps: the output ids and the accepted drafts per cycle.

    The prefill emits ``g(prompt[-1])``; each cycle then drafts ``num_steps`` tokens, accepts the
    longest agreeing prefix (``a`` drafts) and emits ``a + 1`` tokens (capped at
    ``max_new_tokens``). Returns ``{"output_ids": [...], "accepted": [a per cycle], "steps":
    [(prefix length, chain, a) per cycle]}``; the histogram SGLang reports counts the ``a`` values
    (index = accepted drafts). ``fault``: the verify rows follow :func:`chain_predictions` under
    that fault (the attention pair's maps, with ``"code"``; the prefill is not faulted), else the
    target map ``g``. ``predict(prefix, chain) -> [greedy id per chain row]`` replaces both (a
    pair with other verify rules, e.g. :mod:`bench.models.accept_pair.prefix_sim`).
    ``first_draft(y, step) -> id`` replaces ``D1(y)`` as a cycle's first draft (a draft with other
    rules, e.g. :mod:`bench.models.accept_pair.draft_attn_sim`): ``y`` the last accepted token,
    ``step`` None after the prefill, else the previous verify's ``(prefix length, chain, a,
    preds)`` (``preds``: the greedy id per chain row).
    """
    g, d1, G = maps["g"], maps["d1"], maps["G"]
    inv = {c: i for i, c in enumerate(maps["code"])} if fault is not None else None
    y, b = prompt[-1], g[prompt[-1]]
    out, accepted, steps = [b], [], []
    last = None
    while len(out) < max_new_tokens:
        drafts = [d1[y] if first_draft is None else first_draft(y, last)]
        for _ in range(num_steps - 1):
            drafts.append(G[drafts[-1]])
        chain = [b] + drafts
        prefix = list(prompt) + out[:-1]
        preds = (predict(prefix, chain) if predict is not None
                 else chain_predictions(maps, prefix, chain, fault, inv))
        a = 0
        while a < num_steps and drafts[a] == preds[a]:
            a += 1
        accepted.append(a)
        steps.append((len(prefix), chain, a))
        out.extend(drafts[:a] + [preds[a]])
        y, b = chain[a], preds[a]
        last = (len(prefix), chain, a, preds)
    return {"output_ids": out[:max_new_tokens], "accepted": accepted, "steps": steps}


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

def pair_maps(agree: float = 0.7, seed: int = 0, attention: bool = False) -> dict:
    """The maps of one pair: :func:`make_maps`, plus ``"code"`` (:func:`make_codes`) for the
    attention pair."""
    maps = make_maps(VOCAB, agree, seed)
    if attention:
        maps["code"] = make_codes(VOCAB, seed)
    return maps

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
