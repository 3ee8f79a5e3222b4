"""The plain-decode baseline measured twice in one bench call (``bench_verify.py --plain-twice``).

Every verify/decode ratio of ``bench_verify.py`` divides by one plain engine's median decode
replay. Run 12 (``docs/benchmarks.md`` section 10.2) showed one plain engine start reading 8-34%
slow at 11 of 18 points against the plain engines of the two calls before it (same flags), while
the ours and upstream engines beside it read as in those calls: a slow start inflates the
baseline and flatters every ratio. ``--plain-twice`` starts a second plain engine at the end of
the call (key ``plain_end``), so the call carries its own check (METHOD.md: time the same version
twice; a difference smaller than that spread is noise).
"""

from __future__ import annotations

# A point whose two decode medians differ by more than this (fraction) is listed.
DRIFT_TOL = 0.05


def combine(first: float | None, second: float | None) -> tuple[float | None, float | None]:
    """``(decode_ms, drift)`` of one (context, bs) point from the two plain engines' median
    decode replays (GPU ms): ``decode_ms`` is the lower of the two (a slow engine start only
    raises the median, and the lower one keeps every verify/decode ratio conservative);
    ``drift`` = second / first - 1 (a fraction), None unless both exist. With one figure
    missing, that figure and None."""
    if first is None or second is None:
        return (first if second is None else second), None
    return min(first, second), round(second / first - 1, 4)


def drift_lines(rows: list, tol: float = DRIFT_TOL) -> list[str]:
    """``RESULT baseline`` lines for rows of ``bench_verify.build_rows`` (keys ``context``,
    ``bs``, ``decode_ms_first``, ``decode_ms_second``, ``decode_drift``): a summary line and one
    line per (context, bs) point whose |drift| exceeds ``tol``; none when no row has a drift."""
    points = {}
    for r in rows:
        if r.get("decode_drift") is not None:
            points.setdefault((r["context"], r["bs"]), r)  # a num_steps sweep repeats each point
    if not points:
        return []
    bad = [r for r in points.values() if abs(r["decode_drift"]) > tol]
    lines = [f"RESULT baseline: plain decode measured by two engines (plain, plain_end); decode = the lower "
             f"median; {len(bad)} of {len(points)} points differ by more than {tol:.0%}"]
    lines += [f"RESULT baseline ctx={r['context']} bs={r['bs']}: {r['decode_ms_first']:.3f} / "
              f"{r['decode_ms_second']:.3f} ms ({r['decode_drift']:+.1%})" for r in bad]
    return lines
