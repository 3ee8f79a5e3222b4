"""What the lab reads back from its engine children: a mode's status line, why an ``ours``
engine did not replay every verify step, and the finished points of a child killed before it
wrote its JSON (its log's ``BENCH phase`` lines)."""

from __future__ import annotations

import json


def mode_status(res) -> str:
    """One line: ``ok, startup S s`` with the plugin's counters, or ``FAILED (reason)``; a mode joined
    from several inputs gives each input's, joined by ``+``."""
    if res and res.get("inputs"):  # one mode joined from several inputs: each input's status
        return " + ".join(res["inputs"])
    if not res or not res.get("ok"):
        kept = f", {len(res['phases'])} finished points kept from its log" if (res or {}).get("partial") else ""
        return f"FAILED ({(res or {}).get('error', 'no result')}){kept}"
    p = res.get("plugin_after") or {}
    s = f"ok, startup {res['startup_s']}s"
    if p:
        s += (f", plugin runner={p.get('runner')} replays={p.get('replays')} verify_steps={p.get('verify_steps')}"
              f" fallbacks={p.get('fallback_total')}")
    if res["mode"] == "ours":
        seen = {c for ph in res["phases"] for c in (ph["roles"].get("target_verify") or {}).get("classes", [])}
        if "VerifyCudaGraphRunner" not in seen:
            s += f"  WARNING: verify replays came from {sorted(seen) or 'nothing'}, not VerifyCudaGraphRunner"
    return s


def replay_failures(modes: dict) -> list:
    """For ``--require-replays``: why an ``ours`` engine did not serve every verify step from our
    graph (counters after the last phase: replays == verify_steps > 0, no fallback; every timed
    verify replay from VerifyCudaGraphRunner); ``[]`` when each did."""
    out = []
    for key, res in modes.items():
        if res.get("mode") not in ("ours", "ours_profile"):
            continue
        p = res.get("plugin_after") or {}
        if not res.get("ok") or not p:
            out.append(f"{key}: no counters ({res.get('error', 'not ok')})")
            continue
        if not (p.get("replays") == p.get("verify_steps") and (p.get("verify_steps") or 0) > 0
                and p.get("fallback_total") == 0):
            out.append(f"{key}: replays={p.get('replays')} verify_steps={p.get('verify_steps')} "
                       f"fallbacks={p.get('fallback_total')} {p.get('fallbacks')}")
        seen = {c for ph in res.get("phases", []) for c in (ph["roles"].get("target_verify") or {}).get("classes", [])}
        if seen != {"VerifyCudaGraphRunner"}:
            out.append(f"{key}: timed verify replays came from {sorted(seen) or 'nothing'}")
    return out


def phases_from_log(log_path: str) -> dict:
    """What a mode's log holds of its result when the child wrote none (killed at
    ``--mode-timeout``, or by the OOM killer): ``{"phases": [...], "partial": True}`` from its
    ``BENCH phase`` lines (the points it finished, each printed once measured), with
    ``startup_s`` and ``engine_kwargs`` from their lines when present; ``{}`` when the log has no
    phase line (or cannot be read). A line cut off when the child was killed (not JSON, or a phase
    without ``context`` / ``bs``) is skipped and counted in ``skipped_lines``."""
    phases, out, skipped = [], {}, 0
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            if line.startswith("BENCH phase "):
                ph = json.loads(line[len("BENCH phase "):])
                if isinstance(ph, dict) and "context" in ph and "bs" in ph:
                    phases.append(ph)
                else:
                    skipped += 1
            elif line.startswith("BENCH engine_kwargs "):
                out["engine_kwargs"] = json.loads(line[len("BENCH engine_kwargs "):])
            elif line.startswith("BENCH startup ") and line.endswith("s"):
                out["startup_s"] = float(line[len("BENCH startup "):-1])
        except ValueError:
            skipped += 1
    if skipped:
        out["skipped_lines"] = skipped
    return dict(out, phases=phases, partial=True) if phases else {}
