"""What SGLang's EAGLE-3 loop does with the draft-attention pair (:mod:`.draft_attn`), with or
without a draft-extend test fault: every cycle's first draft, hence the accepted drafts per cycle
and the ``spec_correct_drafts_histogram``; the greedy outputs are the target's (``g``), whatever
the draft proposes. Pure Python.

Assumptions (SGLang 0.5.16's ``EAGLEWorkerV2``, topk 1; the row layout of :mod:`.draft_attn`):

* The first cycle's first draft comes from the draft prefill's last row (unfaulted: the prefill
  is an EXTEND forward, not ``DRAFT_EXTEND_V2``): ``DA(g(prompt[-1])) = D1(prompt[-1])``.
* Every later cycle's comes from row ``a`` (``select_index``, ``a`` the previous verify's accepted
  drafts) of the previous draft extend: ``nd = num_steps + 1`` rows per request at positions ``P
  + j`` (``P`` the committed length before that verify), row ``j`` holding ``preds[j]`` (the
  target's greedy id at chain row ``j``). A padded request of the draft-extend graph is another
  request (``seq_lens`` 1, page-table row 0): nothing of it reaches a real one. The row reads the
  ``req_to_token`` columns :func:`sglang_verify_graph.kernel.faults.visible_columns` gives for the
  fault (the kernel's contract). The key at column ``m`` holds the input id of the row that last
  wrote it: ``preds[m - P]`` for ``m >= P`` (this launch wrote every chain row's slot, rejected
  rows included, before the attention), the committed token at ``m + 1`` for ``m < P`` (the draft
  extend that accepted position ``m``, or the prefill, wrote it last; draft decode writes only
  positions ``>= P``).
* The self heads read the visible column nearest above: ``n + 1`` if visible (``causal_plus_one``,
  rows before the last), else ``n`` (the row's own), else ``n - 1`` (``causal_minus_one``); the
  BOS head reads BOS iff column 0 is visible (``drop_first_split`` hides it when the request has
  ``> 1`` split, i.e. ``P + nd > 64`` at a launch of ``>= 2`` splits: every draft-extend bucket up
  to bs 32 on a 132-SM GPU has >= 4). The row then proposes ``DA(x)`` (BOS read) or ``DB(x)``
  (not), ``x`` the attended key's id.
* Draft decode is unfaulted (another backend): drafts 2 .. ``num_steps`` are ``G`` of the one
  before, its rows reading their own key (value ~0) and BOS.
"""

from __future__ import annotations

from bench.models.accept_pair.config import MIN_KEYS_PER_SPLIT
from bench.models.accept_pair.draft_attn import draft_tables
from bench.models.accept_pair.simulator import simulate

DRAFT_EXTEND_FAULTS = ("draft_extend_causal_plus_one", "draft_extend_causal_minus_one",
                       "draft_extend_drop_first_split")
"""The draft-extend test faults (``SGLANG_VERIFY_GRAPH_TEST_FAULT``) this simulator models."""


def extend_read(prefix_len: int, num_draft_tokens: int, row: int, fault: str | None = None,
                num_kv_splits: int = 2) -> tuple:
    """``(m, bos)``: the column (position) the self heads of draft-extend row ``row`` read and
    whether its BOS head reads BOS, under ``fault`` (:data:`DRAFT_EXTEND_FAULTS` or None) in a
    launch of ``num_kv_splits`` splits. Raises ValueError for another fault name or when none of
    columns ``n + 1, n, n - 1`` (``n = prefix_len + row``) is visible (not a single fault)."""
    from sglang_verify_graph.kernel.faults import visible_columns

    if fault is not None and fault not in DRAFT_EXTEND_FAULTS:
        raise ValueError(f"fault {fault!r}: use one of {', '.join(DRAFT_EXTEND_FAULTS)} or None")
    cols = set(visible_columns(prefix_len, num_draft_tokens, row, num_kv_splits,
                               MIN_KEYS_PER_SPLIT, fault))
    n = prefix_len + row
    for m in (n + 1, n, n - 1):
        if m in cols:
            return m, 0 in cols
    raise ValueError(f"row {row} at prefix {prefix_len}: none of columns {n - 1}..{n + 1} visible")


def first_draft_rule(maps: dict, num_draft_tokens: int, fault: str | None = None,
                     num_kv_splits: int = 2, log: list | None = None):
    """A ``first_draft(y, step)`` for :func:`bench.models.accept_pair.simulate`: the draft
    prefill's proposal after the prefill (``step`` None), else row ``a`` of the draft extend after
    ``step = (P, chain, a, preds)``. ``log``: a list that gets one dict per draft extend:
    ``{"prefix_len", "a", "read" (column), "bos" (bool), "x" (the id read), "draft" (the
    proposal), "clean" (the proposal without a fault)}``."""
    da, db = draft_tables(maps)
    g = maps["g"]

    def first(y, step):
        if step is None:
            return da[g[y]]
        plen, chain, a, preds = step
        m, bos = extend_read(plen, num_draft_tokens, a, fault, num_kv_splits)
        if m < plen - 1:
            raise ValueError(f"column {m} below the committed tail {plen - 1}")
        x = preds[m - plen] if m >= plen else chain[0]  # m == P - 1: the token at P
        got = (da if bos else db)[x]
        if log is not None:
            log.append({"prefix_len": plen, "a": a, "read": m, "bos": bos, "x": x, "draft": got,
                        "clean": da[preds[a]]})
        return got

    return first


def simulate_draft_attention(maps: dict, prompt: list, max_new_tokens: int, num_steps: int,
                             fault: str | None = None, num_kv_splits: int = 2,
                             log: list | None = None) -> dict:
    """:func:`bench.models.accept_pair.simulate` of the draft-attention pair (plain target) under
    the draft-extend test fault ``fault`` (None: none): ``{"output_ids", "accepted", "steps"}``.
    ``num_kv_splits``: the draft-extend launch's split count (any count >= 2 gives the same
    prediction); ``log``: see :func:`first_draft_rule`."""
    return simulate(maps, prompt, max_new_tokens, num_steps,
                    first_draft=first_draft_rule(maps, num_steps + 1, fault, num_kv_splits, log))


def changed_cycles(maps: dict, prompt: list, max_new_tokens: int, num_steps: int, fault: str,
                   num_kv_splits: int = 2) -> list:
    """The draft extends of the faulted request whose first draft the fault changed: ``[(cycle,
    prefix_len, a, clean draft, faulted draft, clean accepted, faulted accepted)]``, ``cycle`` the
    index of the verify that drafts it (the prefill's draft is cycle 0, unfaulted). The accepted
    counts are that verify's, under the draft the row proposes and under the clean one (the
    target decides: ``g`` of each draft)."""
    log = []
    sim = simulate_draft_attention(maps, prompt, max_new_tokens, num_steps, fault, num_kv_splits, log)
    G, g = maps["G"], maps["g"]

    def accepted(bonus, d):
        drafts = [d]
        for _ in range(num_steps - 1):
            drafts.append(G[drafts[-1]])
        chain, a = [bonus] + drafts, 0
        while a < num_steps and drafts[a] == g[chain[a]]:
            a += 1
        return a

    out = []
    for i, e in enumerate(log):
        if e["draft"] != e["clean"] and i + 1 < len(sim["steps"]):
            bonus = sim["steps"][i + 1][1][0]
            out.append((i + 1, e["prefix_len"], e["a"], e["clean"], e["draft"],
                        accepted(bonus, e["clean"]), accepted(bonus, e["draft"])))
    return out
