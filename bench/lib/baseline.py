"""The plain-decode baseline measured twice in one bench call (``python -m bench verify
--plain-twice``).

Every verify/decode ratio of ``python -m bench verify`` divides by one plain engine's median
decode replay, and one plain engine start can read slow at many points while the ours and
upstream engines beside it do not: a slow start inflates the baseline and flatters every ratio.
``--plain-twice`` starts a second plain engine at the end of the call (key ``plain_end``), so the
call carries its own check (the same version timed twice; a difference smaller than that spread
is noise).
"""

from __future__ import annotations

# A point whose two decode medians differ by more than this (fraction) is listed.
DRIFT_TOL = 0.05


def combine(first: float | None, second: float | None) -> tuple[float | None, float | None]:
    """``(lower, drift)`` of one (context, bs) point from the two plain engines' figures (GPU ms
    per decode replay, or wall ms per step): ``lower`` is the lower of the two (a slow engine
    start only raises a median, and the lower one keeps every verify/decode ratio conservative);
    ``drift`` = second / first - 1 (a fraction), None unless both exist and ``first`` > 0. With
    one figure missing, that figure and None."""
    if first is None or second is None:
        return (first if second is None else second), None
    return min(first, second), (round(second / first - 1, 4) if first > 0 else None)


def differs(first: float, second: float, tol: float = DRIFT_TOL) -> bool:
    """True when the larger of two positive medians exceeds the smaller by more than ``tol``
    (symmetric: the verdict does not depend on which engine ran first)."""
    lo, hi = sorted((first, second))
    return lo <= 0 or hi / lo - 1 > tol


def drift_lines(rows: list, expected: bool = False, tol: float = DRIFT_TOL) -> list[str]:
    """``RESULT baseline`` lines for rows of ``bench.verify.table.build_rows`` (keys ``context``,
    ``bs``, ``decode_ms_first``, ``decode_ms_second``, ``decode_drift``): a summary line, one line
    per (context, bs) point whose two medians differ by more than ``tol`` (``differs``), and the
    points measured by one engine only. ``expected`` (``--plain-twice`` was given): the summary
    is printed even when no point has both figures (the second engine failed or never ran); else
    no lines without a drift."""
    both, once = {}, {}
    for r in rows:  # a num_steps sweep repeats each point: keep the first row per point
        pt = (r["context"], r["bs"])
        if r.get("decode_ms_first") is not None and r.get("decode_ms_second") is not None:
            both.setdefault(pt, r)
        elif r.get("decode_ms") is not None:
            once.setdefault(pt, r)
    if not both and not expected:
        return []
    once = {pt: r for pt, r in once.items() if pt not in both}
    bad = [r for r in both.values() if differs(r["decode_ms_first"], r["decode_ms_second"], tol)]
    lines = [f"RESULT baseline: plain decode by two engines (plain, plain_end) at {len(both)} points, decode = "
             f"the lower median; {len(bad)} of them differ by more than {tol:.0%} (a listed point wants a "
             f"rerun); {len(once)} points measured by one engine only"
             + ("" if both else " (plain_end failed or did not run: see its RESULT mode line)")]
    lines += [f"RESULT baseline ctx={r['context']} bs={r['bs']}: {r['decode_ms_first']:.3f} / "
              f"{r['decode_ms_second']:.3f} ms" + ("" if r["decode_drift"] is None else f" ({r['decode_drift']:+.1%})")
              for r in bad]
    if once and both:
        lines.append("RESULT baseline measured once: " + ", ".join(f"ctx={c} bs={b}" for c, b in sorted(once)))
    return lines
