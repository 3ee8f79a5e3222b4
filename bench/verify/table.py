"""The verify table: one row per (num_steps, context, bs) from the modes' measured points, and
its ``RESULT`` lines."""
from __future__ import annotations

import json

from bench.lib import baseline
from bench.lib.capture_log import format_capture

MODES = ("plain", "upstream", "ours", "ours_profile")


def mode_key(a, mode: str, num_steps: int) -> str:
    """Key of one engine run in ``modes``: the mode name with one ``--steps`` value (as before),
    ``mode@num_steps`` in a num_steps sweep; ``plain`` (no speculation) runs once."""
    if mode == "plain" or len(a.steps_list) == 1:
        return mode
    return f"{mode}@{num_steps}"


def _g(modes, mode, ctx, bs, role, field="gpu_ms"):
    """One number of a mode's phase at (ctx, bs): role ``e2e`` -> e2e ms per step, ``wall`` ->
    ``(tn_s, t1_s, steps)`` of the N-token generation, else the probe's ``field`` of that role."""
    for ph in (modes.get(mode) or {}).get("phases", []):
        if ph["context"] == ctx and ph["bs"] == bs:
            if role == "e2e":
                return ph["e2e_ms_per_step"]
            if role == "wall":
                return ((ph["tn_s"], ph.get("t1_s"), ph["steps"]) if ph.get("tn_s") is not None
                        else None)
            return (ph["roles"].get(role) or {}).get(field)
    return None


def profile_overhead(ours_wall, prof_wall):
    """Overhead of the profile on the decode loop, a fraction: ``(tn_p - t1) / (tn_o - t1) - 1``
    with ``t1`` the mean of the two engines' 1-token (prefill) times, per verify step when the
    step counts differ; ``None`` when a value is missing or the decode time is not positive.
    Args: ``(tn_s, t1_s, steps)`` triples (s, s, verify steps) of ``ours`` and ``ours_profile``."""
    if not ours_wall or not prof_wall:
        return None
    (tn_o, t1_o, k_o), (tn_p, t1_p, k_p) = ours_wall, prof_wall
    if None in (tn_o, t1_o, tn_p, t1_p) or not k_o or not k_p:
        return None
    t1 = (t1_o + t1_p) / 2
    dec_o, dec_p = tn_o - t1, tn_p - t1
    if dec_o <= 0 or dec_p <= 0:
        return None
    ratio = dec_p / dec_o if k_o == k_p else (dec_p / k_p) / (dec_o / k_o)
    return round(ratio - 1, 4)


def build_rows(a, modes: dict) -> list:
    rows = []
    div = lambda x, y: round(x / y, 3) if x is not None and y else None  # noqa: E731
    for k in a.steps_list:
        rows += _rows_for_steps(a, modes, k, div)
    return rows


def _rows_for_steps(a, modes: dict, k: int, div) -> list:
    rows = []
    key = {m: mode_key(a, m, k) for m in MODES}
    g = lambda m, *x, **kw: _g(modes, key[m], *x, **kw)  # noqa: E731
    for ctx in a.contexts:
        for bs in a.batch_sizes:
            d1, d2 = g("plain", ctx, bs, "target_decode"), _g(modes, "plain_end", ctx, bs, "target_decode")
            r = {"model": a.model, "num_steps": k, "context": ctx, "bs": bs, "decode_ms_first": d1,
                 "decode_ms_second": d2}
            r["decode_ms"], r["decode_drift"] = baseline.combine(d1, d2)
            for m in ("upstream", "ours"):
                r[f"{m}_verify_ms"] = g(m, ctx, bs, "target_verify")
                r[f"{m}_draft_ms"] = g(m, ctx, bs, "draft_decode")
                r[f"{m}_draft_extend_ms"] = g(m, ctx, bs, "draft_extend")
                parts = [g(m, ctx, bs, x) for x in ("draft_decode", "target_verify", "draft_extend")]
                r[f"{m}_cycle_ms"] = round(sum(parts), 4) if all(p is not None for p in parts) else None
                r[f"{m}_verify_per_decode"] = div(r[f"{m}_verify_ms"], r["decode_ms"])
                r[f"{m}_cycle_per_decode"] = div(r[f"{m}_cycle_ms"], r["decode_ms"])
                r[f"{m}_e2e_ms_per_step"] = g(m, ctx, bs, "e2e")
                r[f"{m}_verify_host_ms"] = g(m, ctx, bs, "target_verify", "host_ms")
            r["plain_e2e_ms_per_step"] = baseline.combine(g("plain", ctx, bs, "e2e"),
                                                          _g(modes, "plain_end", ctx, bs, "e2e"))[0]
            r["ours_profile_e2e_ms_per_step"] = g("ours_profile", ctx, bs, "e2e")
            ovh = div(r["ours_profile_e2e_ms_per_step"], r["ours_e2e_ms_per_step"])
            r["profile_overhead_per_step"] = round(ovh - 1, 4) if ovh is not None else None
            r["profile_overhead"] = profile_overhead(g("ours", ctx, bs, "wall"),
                                                     g("ours_profile", ctx, bs, "wall"))
            r["profile_overhead_pct"] = (round(100 * r["profile_overhead"], 2)
                                         if r["profile_overhead"] is not None else None)
            r["ours_per_upstream_verify"] = div(r["ours_verify_ms"], r["upstream_verify_ms"])
            r["ours_per_upstream_cycle"] = div(r["ours_cycle_ms"], r["upstream_cycle_ms"])
            rows.append(r)
    return rows


def format_table(rows, meta) -> str:
    cols = [("num_steps", "steps"), ("context", "ctx"), ("bs", "bs"), ("decode_ms", "decode"), ("upstream_verify_ms", "up_verify"),
            ("ours_verify_ms", "our_verify"), ("upstream_draft_ms", "up_draft"), ("ours_draft_ms", "our_draft"),
            ("upstream_draft_extend_ms", "up_dext"), ("ours_draft_extend_ms", "our_dext"),
            ("upstream_verify_per_decode", "up_v/dec"),
            ("ours_verify_per_decode", "our_v/dec"), ("ours_per_upstream_verify", "our/up"),
            ("upstream_cycle_ms", "up_cycle"), ("ours_cycle_ms", "our_cycle"), ("upstream_cycle_per_decode", "up_c/dec"),
            ("ours_cycle_per_decode", "our_c/dec"), ("plain_e2e_ms_per_step", "e2e_plain"),
            ("upstream_e2e_ms_per_step", "e2e_up"), ("ours_e2e_ms_per_step", "e2e_ours")]
    if any(r.get("ours_profile_e2e_ms_per_step") is not None for r in rows):
        cols += [("ours_profile_e2e_ms_per_step", "e2e_prof"), ("profile_overhead_pct", "prof_ovh%")]
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [f"RESULT model={meta['model']}  GPU ms per graph replay (median); draft = the cycle's draft steps, "
             f"dext = draft extend; cycle = draft + verify + draft-extend; "
             f"e2e = wall ms per decode step",
             "RESULT " + " ".join(f"{h:>10}" for _, h in cols)]
    lines += ["RESULT " + " ".join(f"{fmt(r[k]):>10}" for k, _ in cols) for r in rows]
    for m, st in meta["mode_status"].items():
        lines.append(f"RESULT mode {m}: {st}")
    lines += baseline.drift_lines(rows, expected=meta.get("plain_twice", False))
    lines += format_capture(meta.get("capture", {}))
    for p in meta.get("profile_lines", [])[:6]:
        lines.append("RESULT profile " + " ".join(f"{k}={p[k]}" for k in (
            "cycles", "bs", "cycle_mean_ms", "span_per_cycle_ms", "phase_sum_vs_span", "verify_pct",
            "accept_length", "replay_pct", "prof_self_ms", "prof_self_pct") if k in p))
    lines += [f"RESULT hardware: {meta['hardware']}", "RESULT versions: " + json.dumps(meta["versions"]),
              f"RESULT flags: {meta['flags']}", f"RESULT command: {meta['command']}"]
    return "\n".join(lines)
