"""What SGLang's verify computes with the prefix-reading pair (:mod:`.prefix`), with or without
a verify-attention fault: the greedy token of every chain row, the outputs and accepted drafts
of a request, and the share of single faults (a wrong page-table entry at one prefix position, a
dropped KV split, a layer reading another layer's buffer) that change its outputs. Pure Python.

A fault is a :class:`PrefixFault` (one verify step's view of the keys) or, for
:func:`simulate_prefix`, a name of the chain kernel's test fault switch
(``sglang_verify_graph.kernel.TEST_FAULTS``), resolved per verify step by :func:`step_fault`.
"""

from __future__ import annotations

import dataclasses
import random

from bench.models.accept_pair.config import BOS, MIN_KEYS_PER_SPLIT, VOCAB
from bench.models.accept_pair.prefix import (
    CHECK_KV_HEADS, CHECK_OFFSET, PREFIX_LAYERS, prefix_offsets,
)
from bench.models.accept_pair.simulator import code_bits, simulate

KERNEL_FAULTS = ("causal_plus_one", "causal_minus_one", "drop_first_split", "middle_page_entry",
                 "drop_middle_split", "wrong_layer_kv")
"""The test-switch faults :func:`step_fault` resolves (verify launches)."""


class AmbiguousReadout(ValueError):
    """Two ids tie for the greedy token of a row: the pair cannot predict it."""


@dataclasses.dataclass(frozen=True)
class PrefixFault:
    """The keys one chain row reads, as a verify fault leaves them.

    ``causal_shift``: the row at position ``n`` reads keys ``[0, n + 1 + causal_shift)``, capped
    at the chain's end; ``drop``: ``(a, b)``, keys ``[a, b)`` unread; ``page``: ``(p, q)``, the
    entry of position ``p`` holds the slot of position ``q`` (``p`` a prefix position);
    ``kv_layer``: per layer, the layer whose buffer it reads (None: its own).
    """

    causal_shift: int = 0
    drop: tuple | None = None
    page: tuple | None = None
    kv_layer: tuple | None = None


def split_bounds(total: int, num_kv_splits: int) -> list:
    """The chain kernel's KV splits of a request of ``total`` keys: ``[(start, end)]`` for
    ``eff = min(num_kv_splits, ceil(total / MIN_KEYS_PER_SPLIT))`` splits of ``ceil(total /
    eff)`` keys (the last shorter)."""
    eff = min(num_kv_splits, -(-total // MIN_KEYS_PER_SPLIT))
    size = -(-total // eff)
    return [(s * size, min((s + 1) * size, total)) for s in range(eff) if s * size < total]


def step_fault(name: str | None, prefix_len: int, num_draft_tokens: int,
               num_kv_splits: int | None = None, layers: int = PREFIX_LAYERS) -> PrefixFault:
    """The :class:`PrefixFault` of the kernel test fault ``name`` (:data:`KERNEL_FAULTS` or None)
    in a verify step with ``prefix_len`` prefix keys: ``causal_plus_one`` / ``causal_minus_one``
    shift the causal limit; ``drop_first_split`` / ``drop_middle_split`` drop split 0 / split
    ``eff // 2`` of :func:`split_bounds` (only with >= 2 / >= 3 splits; needs ``num_kv_splits``);
    ``middle_page_entry`` reads position ``m = prefix_len // 2`` from the slot of ``m + 1``;
    ``wrong_layer_kv`` has layer 0 read layer 1's buffer and layer ``l`` layer ``l - 1``'s.
    Raises ValueError for another name or a split fault without ``num_kv_splits``."""
    if name is None:
        return PrefixFault()
    if name not in KERNEL_FAULTS:
        raise ValueError(f"fault {name!r}: use one of {', '.join(KERNEL_FAULTS)} or None")
    if name == "wrong_layer_kv":
        return PrefixFault(kv_layer=tuple([1] + list(range(layers - 1))))
    if name.startswith("causal_"):
        return PrefixFault(causal_shift=1 if name == "causal_plus_one" else -1)
    if name.startswith("drop_") and num_kv_splits is None:
        raise ValueError(f"fault {name}: needs the launch's num_kv_splits")
    # the kernel's contract for the last chain row: the columns it reads under the fault
    from sglang_verify_graph.kernel.faults import visible_columns

    j = num_draft_tokens - 1
    cols = visible_columns(prefix_len, num_draft_tokens, j, num_kv_splits or 1,
                           MIN_KEYS_PER_SPLIT, name)
    moved = [(i, c) for i, c in enumerate(cols) if c != i]
    if name == "middle_page_entry":
        return PrefixFault(page=moved[0] if moved else None)
    gone = sorted(set(range(prefix_len + num_draft_tokens)) - set(cols))
    return PrefixFault(drop=(gone[0], gone[-1] + 1) if gone else None)


class PrefixModel:
    """The prefix pair's verify rows: :meth:`row` gives one row's greedy token.

    ``maps``: the pair's maps (``"g"``, ``"code"``; :func:`bench.models.accept_pair.pair_maps`
    with ``attention=True``); ``span``: the build's span (:func:`prefix_offsets`)."""

    def __init__(self, maps: dict, span: int, layers: int = PREFIX_LAYERS):
        self.g, self.code = maps["g"], maps["code"]
        self.layers = layers
        self.inv = {c: i for i, c in enumerate(self.code)}
        self.ginv = [0] * len(self.g)
        for t, n in enumerate(self.g):
            self.ginv[n] = t
        self.bits = [code_bits(c, len(self.code)) for c in self.code]
        self.checks = {layer: [(j, CHECK_OFFSET) for j in CHECK_KV_HEADS]
                       for layer in range(1, layers - 1)}
        self.checks[layers - 1] = list(enumerate(prefix_offsets(span)))
        self._readout = {}

    def readout(self, t: int, a: int | None, c: int) -> int:
        """The greedy id of a row holding ``t`` whose self head read the id ``a`` (None: zero
        features) with BOS feature ``c``: argmax over ids ``n`` of ``h(g^-1 n) . h(a) + 2 c
        s(g^-1 n) s(t) + 2 [n = g(p(t))]``. Raises AmbiguousReadout on a tie (margin < 1)."""
        key = (t, a, c)
        if key in self._readout:
            return self._readout[key]
        f_self = self.bits[a][0] if a is not None else None
        st = self.bits[t][1]
        sign = 1 << (len(self.code).bit_length() - 2)
        partner = self.g[self.inv[self.code[t] ^ sign]]
        best, second = (-1e9, -1), -1e9
        for n in range(len(self.g)):
            h, s = self.bits[self.ginv[n]]
            v = (sum(x * y for x, y in zip(h, f_self)) if f_self is not None else 0.0)
            v += 2 * c * s * st + (2.0 if n == partner else 0.0)
            if v > best[0]:
                best, second = (v, n), best[0]
            elif v > second:
                second = v
        if best[0] - second < 1.0:
            raise AmbiguousReadout(f"row holding {t} (self head on {a}, c {c}): ids tie at {best[0]}")
        self._readout[key] = best[1]
        return best[1]

    def features(self, seq: list, n: int, end: int, fault: PrefixFault) -> tuple:
        """``(t, a, c)`` of the row at position ``n`` of ``seq`` (prefix + chain; ``end``: the
        chain's end) under ``fault``: its id, the id its self head reads (None: layer 0 reads
        another layer, zero features), its BOS feature (1 or 0 for BOS, -2 per failed check)."""
        limit = min(n + 1 + fault.causal_shift, end)

        def readable(i):
            return 0 <= i < limit and not (fault.drop and fault.drop[0] <= i < fault.drop[1])

        def held(pos):  # is the key written at ``pos`` read at some index
            if fault.page and fault.page[0] == pos:
                return fault.page[1] == pos and readable(pos)
            return readable(pos) or bool(fault.page and fault.page[1] == pos and readable(fault.page[0]))

        kv = fault.kv_layer or tuple(range(self.layers))
        bos_seen = held(0)
        t = seq[n]
        if kv[0] != 0:
            a, c = None, 0
        else:
            a = t
            if fault.causal_shift > 0 and n + 1 < end:
                a = seq[n + 1]
            elif fault.causal_shift < 0:
                a = seq[n - 1]
            c = 1 if bos_seen else 0
        for layer in range(1, self.layers):
            src = kv[layer]
            for kvh, off in self.checks[layer]:
                if src == layer:
                    ok = n - off >= 1 and held(n - off)
                else:  # another layer's keys: its KV head holds BOS keys (or a check) or nothing
                    other = (src == 0 and kvh == 1) or any(j == kvh for j, _ in self.checks.get(src, ()))
                    ok = not other
                if not ok and bos_seen:
                    c -= 2
        return t, a, c

    def row(self, seq: list, n: int, end: int, fault: PrefixFault) -> int:
        """The greedy id of the row at position ``n`` of ``seq`` (prefix + chain; ``end`` =
        ``len(seq)``, the chain's end) under ``fault``."""
        return self.readout(*self.features(seq, n, end, fault))

    def offsets(self) -> set:
        """Every check's offset (positions), all layers."""
        return {off for checks in self.checks.values() for _, off in checks}

    def predict(self, fault_name: str | None = None, num_draft_tokens: int | None = None,
                num_kv_splits: int | None = None):
        """A ``predict(prefix, chain)`` for :func:`bench.models.accept_pair.simulate` under the
        kernel test fault ``fault_name`` (:func:`step_fault`)."""
        def predict(prefix, chain):
            seq = list(prefix) + list(chain)
            fault = step_fault(fault_name, len(prefix), num_draft_tokens or len(chain),
                               num_kv_splits, self.layers)
            return [self.row(seq, len(prefix) + j, len(seq), fault) for j in range(len(chain))]
        return predict


def simulate_prefix(maps: dict, span: int, prompt: list, max_new_tokens: int, num_steps: int,
                    fault: str | None = None, num_kv_splits: int | None = None) -> dict:
    """:func:`bench.models.accept_pair.simulate` of the prefix pair under the kernel test fault
    ``fault`` (None: none)."""
    model = PrefixModel(maps, span)
    return simulate(maps, prompt, max_new_tokens, num_steps,
                    predict=model.predict(fault, num_steps + 1, num_kv_splits))


def prefix_prompts(n: int, span: int, seed: int = 21, slack: int = 40,
                   vocab: int = VOCAB) -> list:
    """``n`` prompts for the prefix pair: BOS, then ``span + 1 .. span + 1 + slack`` random ids
    in ``[10, vocab - 10)`` (every output row then finds each of its offsets)."""
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(10, vocab - 10) for _ in range(span + 1 + rng.randrange(slack + 1))]
            for _ in range(n)]


def _first_change(model, seq: list, steps: list, fault_of_step, rows=None) -> bool:
    """Whether a fault changes an output of the request whose greedy sequence is ``seq`` and
    whose verify steps are ``steps`` (``simulate``'s): some row that decides a token (rows
    ``0 .. a`` of a step; only positions in ``rows`` when given) gives another id under
    ``fault_of_step(prefix_len)``. Up to the first change every row reads the greedy tokens."""
    clean = PrefixFault()
    for plen, chain, a in steps:
        fault = fault_of_step(plen)
        for j in range(a + 1):
            n = plen + j
            if n + 1 >= len(seq) or (rows is not None and n not in rows):
                continue
            got = model.features(seq, n, n + 1, fault)
            if got != model.features(seq, n, n + 1, clean) and model.readout(*got) != seq[n + 1]:
                return True
    return False


def coverage(maps: dict, span: int, prompts: list, max_new_tokens: int, num_steps: int,
             num_kv_splits: int, layers: int = PREFIX_LAYERS) -> dict:
    """The share of single faults that change at least one output token of their request.

    ``page``: for every prompt and prefix position ``p``, the entry of ``p`` holding the slot of
    ``p + 1`` in every verify step; ``split``: for every prompt and split index, that split
    unread in every verify step (:func:`split_bounds` at ``num_kv_splits``); ``layer``: for every
    prompt and ordered pair of layers, one layer reading the other's buffer. Returns ``{kind:
    {"changed": int, "faults": int, "missed": [(prompt index, fault)] (first 20)}}``."""
    model = PrefixModel(maps, span, layers)
    out = {k: {"changed": 0, "faults": 0, "missed": []} for k in ("page", "split", "layer")}

    def count(kind, hit, what):
        out[kind]["faults"] += 1
        out[kind]["changed"] += bool(hit)
        if not hit and len(out[kind]["missed"]) < 20:
            out[kind]["missed"].append(what)

    for i, prompt in enumerate(prompts):
        sim = simulate(maps, prompt, max_new_tokens, num_steps,
                       predict=model.predict(None, num_steps + 1))
        seq = list(prompt) + sim["output_ids"]
        steps = sim["steps"]
        offs = model.offsets()
        for p in range(len(prompt)):
            f = PrefixFault(page=(p, p + 1))
            rows = None if p == 0 else {p + off for off in offs}
            count("page", _first_change(model, seq, steps, lambda _n, f=f: f, rows), (i, p))
        most = max(len(split_bounds(plen + num_steps + 1, num_kv_splits)) for plen, _, _ in steps)
        for s in range(most):
            def drop(plen, s=s):
                b = split_bounds(plen + num_steps + 1, num_kv_splits)
                return PrefixFault(drop=b[s] if s < len(b) else None)
            count("split", _first_change(model, seq, steps, drop), (i, s))
        for layer in range(layers):
            for src in range(layers):
                if src != layer:
                    kv = tuple(src if x == layer else x for x in range(layers))
                    f = PrefixFault(kv_layer=kv)
                    count("layer", _first_change(model, seq, steps, lambda _n, f=f: f),
                          (i, f"{layer}<-{src}"))
    for v in out.values():
        v["share"] = v["changed"] / v["faults"] if v["faults"] else None
    return out
