"""The chain kernel's test faults (tests only): names, which launch each applies to, and the exact
arithmetic of each, a contract that the kernel's stage 1 (``FAULT`` constexpr), the float64
reference (``chain_verify_attention_ref``) and test models that simulate a faulted server share.

Per request, ``prefix`` is ``seq_lens`` (verify) or ``max(seq_lens - num_draft_tokens, 0)``
(draft extend), ``total = prefix + num_draft_tokens``, ``eff_splits = min(num_kv_splits,
cdiv(total, MIN_KEYS_PER_SPLIT))`` (the splits the request uses; ``MIN_KEYS_PER_SPLIT`` = 64),
``split_len = cdiv(total, eff_splits)``, and split ``s`` holds the key columns ``[s * split_len,
min((s + 1) * split_len, total))`` of ``req_to_token[req]``. Without a fault draft position ``j``
(0-based) attends to the columns ``[0, prefix + j + 1)``, column ``c`` reading the key and value
of slot ``req_to_token[req, c]``.

Verify launches only (``seq_lens_include_chain=False``):
  ``causal_plus_one``    position ``j`` attends to ``[0, min(prefix + j + 2, total))``: it also
                         sees the next chain key; the last position is unchanged.
  ``causal_minus_one``   position ``j`` attends to ``[0, prefix + j)``: not its own key.
  ``drop_first_split``   with ``eff_splits > 1``: no position reads a column below ``split_len``
                         (split 0); with one split, unchanged.
  ``middle_page_entry``  with ``prefix > 0``: column ``m = prefix // 2`` (a prefix key, seen by
                         every position) reads its key and value from slot
                         ``req_to_token[req, m + 1]``, so key ``m + 1`` counts twice and key
                         ``m`` not at all (``m + 1 <= prefix``: a valid entry); prefix 0:
                         unchanged.
  ``drop_middle_split``  with ``eff_splits >= 3``: no position reads a column of split
                         ``d = eff_splits // 2``, i.e. of ``[d * split_len, min((d + 1) *
                         split_len, total))`` (never empty); with fewer splits, unchanged.
Draft-extend launches only (``seq_lens_include_chain=True``, ``DRAFT_EXTEND_V2``):
  ``draft_extend_causal_plus_one``, ``draft_extend_causal_minus_one``,
  ``draft_extend_drop_first_split``: the arithmetic of ``causal_plus_one``, ``causal_minus_one``
  and ``drop_first_split`` with the draft extend's ``prefix``. Under
  ``draft_extend_causal_minus_one`` a position left no key (position 0 of a padded row, prefix 0)
  outputs NaN, in the kernel and the reference; real requests have ``prefix >= 1``.

``num_kv_splits`` is the launch's (the captured bucket's ``choose_num_kv_splits``, or
``SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS``), so the split faults change only requests long enough for
two (``drop_first_split``: ``total > 64``) or three (``drop_middle_split``: ``total > 128``) splits
and a launch with that many. A fault of the other launch, or an unknown name, is a ValueError
(one line). The verify backend's ``wrong_layer_kv`` is no kernel fault: the backend launches the
kernel, unfaulted, on another layer's K/V buffers (``sglang_verify_graph.chain_backend``).
"""

from __future__ import annotations

TEST_FAULTS = {
    "causal_plus_one": 1, "causal_minus_one": 2, "drop_first_split": 3,
    "middle_page_entry": 4, "drop_middle_split": 5,
    "draft_extend_causal_plus_one": 1, "draft_extend_causal_minus_one": 2,
    "draft_extend_drop_first_split": 3,
}
"""Kernel test fault name -> stage 1's ``FAULT`` constexpr (0: no fault; codes 1-3 serve a verify
fault and its ``draft_extend_`` namesake, the launch's ``seq_lens_include_chain`` tells them
apart). The ``draft_extend_`` names (:data:`DRAFT_EXTEND_TEST_FAULTS`) apply to draft-extend
launches, the others to verify launches."""

DRAFT_EXTEND_TEST_FAULTS = frozenset(n for n in TEST_FAULTS if n.startswith("draft_extend_"))
"""The :data:`TEST_FAULTS` of ``seq_lens_include_chain=True`` (``DRAFT_EXTEND_V2``) launches."""


def check_test_fault(fault: str | None, seq_lens_include_chain: bool, who: str = "chain verify") -> None:
    """Return if ``fault`` is None or a :data:`TEST_FAULTS` name of this launch (a ``draft_extend_``
    name with ``seq_lens_include_chain=True``, another name with False).

    Raises:
        ValueError: an unknown name (listing the valid ones) or a fault of the other launch; one
            line starting with ``who``."""
    if fault is None:
        return
    if fault not in TEST_FAULTS:
        raise ValueError(f"{who}: fault {fault!r}: use one of {', '.join(TEST_FAULTS)} or None")
    if (fault in DRAFT_EXTEND_TEST_FAULTS) != bool(seq_lens_include_chain):
        launch = ("draft-extend launch only (seq_lens_include_chain=True)"
                  if fault in DRAFT_EXTEND_TEST_FAULTS
                  else "verify launch only (seq_lens_include_chain=False)")
        raise ValueError(f"{who}: test fault {fault!r} applies to the {launch}")


def visible_columns(prefix: int, num_draft_tokens: int, j: int, num_kv_splits: int,
                    min_keys_per_split: int, fault: str | None = None) -> list[int]:
    """The ``req_to_token`` columns draft position ``j`` reads, in key order, under ``fault`` (a
    :data:`TEST_FAULTS` name or None), as the module docstring states: ``[0, prefix + j + 1)``
    without a fault. Ints in, a list of ints out (a column may repeat: ``middle_page_entry``); an
    empty list when no key is left. The caller checks ``fault`` (:func:`check_test_fault`)."""
    base = (fault or "").removeprefix("draft_extend_")
    total = prefix + num_draft_tokens
    n = prefix + j + 1 + {"causal_plus_one": 1, "causal_minus_one": -1}.get(base, 0)
    cols = list(range(min(n, total)))
    eff = min(num_kv_splits, -(-total // min_keys_per_split))
    split_len = -(-total // eff)
    if base == "drop_first_split" and eff > 1:
        cols = [c for c in cols if c >= split_len]
    elif base == "drop_middle_split" and eff >= 3:
        d = eff // 2
        cols = [c for c in cols if not d * split_len <= c < min((d + 1) * split_len, total)]
    elif base == "middle_page_entry" and prefix > 0:
        cols = [c + 1 if c == prefix // 2 else c for c in cols]
    return cols
