"""Greedy parity of servers' ``/generate`` answers, with the near-tie rule of the server tiers
(``test/e2e/test_server_e2e.py``, ``test/multigpu/test_tp_server.py``).

Random (dummy) weights give near-ties: top-2 logprobs so close that another batch shape, kernel
or reduction order picks the other token, after which the two outputs part for good. Both tiers
send the parity prompts one request at a time, so every server decodes each prompt at the same
batch size (1), and hold them to this rule: the answers of two servers to the same prompt must be
token-identical; a divergence counts as a near-tie, not a failure, only when a tolerance is set
(``E2E_PARITY_TIE_TOL`` > 0; default 0: strict) and, at the first differing output position, the
smaller of the two servers' top-2 logprob gaps is below it. The gap comes from
``meta_info.output_top_logprobs`` (ask with :data:`TOP2_LOGPROBS`); without it a divergence fails.
"""

from __future__ import annotations

import os

TIE_TOL_ENV = "E2E_PARITY_TIE_TOL"
TOP2_LOGPROBS = {"return_logprob": True, "top_logprobs_num": 2}
"""The ``/generate`` fields that return each output position's top-2 logprobs."""


def tie_tolerance(environ=None) -> float:
    """``E2E_PARITY_TIE_TOL`` of ``environ`` (default ``os.environ``) as a float logprob gap
    (nats); 0 (strict) when unset. Raises ValueError on a value that is not a number."""
    return float((os.environ if environ is None else environ).get(TIE_TOL_ENV, "0") or "0")


def first_diff(a: list, b: list) -> "int | None":
    """First index where the token id lists ``a`` and ``b`` differ (the shorter length when one
    is a prefix of the other), None when they are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def top2(resp: dict, pos: int) -> "list | None":
    """``[(logprob, token_id), (logprob, token_id)]`` of output position ``pos`` of a ``/generate``
    answer, None where the answer has no top logprobs there."""
    try:
        top = resp["meta_info"]["output_top_logprobs"][pos]
        return [(round(float(t[0]), 5), int(t[1])) for t in top[:2]]
    except Exception:
        return None


def compare(name_a: str, outs_a: list, name_b: str, outs_b: list, prompts: list,
            tie_tol: float) -> tuple[list, list]:
    """Compare two servers' answers (``/generate`` JSON dicts) to the same ``prompts`` (lists of
    token ids), request by request. Returns ``(failures, ties)``: one line per differing request
    (request, prompt length, first differing position, the ids around it, both servers' top-2
    logprobs there and the smaller gap), under ties when ``tie_tol > 0`` and that gap is below it,
    else under failures."""
    fails, ties = [], []
    for i, (ra, rb) in enumerate(zip(outs_a, outs_b)):
        a, b = ra["output_ids"], rb["output_ids"]
        p = first_diff(a, b)
        if p is None:
            continue
        ta, tb = top2(ra, p), top2(rb, p)
        gaps = [t[0][0] - t[1][0] for t in (ta, tb) if t and len(t) == 2]
        gap = round(min(gaps), 5) if gaps else None
        msg = (f"{name_a} vs {name_b}: request {i} (prompt len {len(prompts[i])}) first differs at output "
               f"position {p}: {name_a}={a[p] if p < len(a) else 'END'} {name_b}={b[p] if p < len(b) else 'END'}; "
               f"{name_a}[{max(0, p - 3)}:{p + 3}]={a[max(0, p - 3):p + 3]} {name_b}[{max(0, p - 3)}:{p + 3}]={b[max(0, p - 3):p + 3]}; "
               f"top-2 logprobs there {name_a}={ta} {name_b}={tb} (min gap {gap})")
        (ties if tie_tol > 0 and gap is not None and gap < tie_tol else fails).append(msg)
    return fails, ties
