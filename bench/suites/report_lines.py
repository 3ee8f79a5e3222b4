"""The lines a finished stage puts into the summary: pytest's result line and first failures, an
e2e stage's ``e2e_results.json`` lines, a lab command's tables. Each function returns ``(said,
quiet)``: lines printed and written to the summary, and lines only written to it. Stdlib only."""

from __future__ import annotations

import json
import re

Lines = tuple[list[str], list[str]]


def pytest_lines(name: str, lines: list[str]) -> Lines:
    """The last result line (``N passed in Xs``), up to 8 ``FAILED``/``ERROR`` lines, 6 ``E`` lines."""
    res = [ln for ln in lines if re.search(r"(passed|failed|error|skipped|no tests ran|collected|deselected)", ln)
           and re.search(r" in [0-9.]+s", ln)]
    said = [f"-- {name}: {res[-1] if res else ''}"]
    said += [f"   {ln[:300]}" for ln in [ln for ln in lines if re.match(r"(FAILED|ERROR) ", ln)][:8]]
    said += [f"   {ln[:400]}" for ln in [ln for ln in lines if ln.startswith("E  ")][:6]]
    return said, []


def e2e_lines(path: str, stage: str) -> list[str]:
    """Startup, parity, concurrency and counter lines of one e2e stage's ``e2e_results.json``."""
    try:
        r = json.load(open(path))
        out = [f"-- {stage} startup_s {r.get('startup_s')}"]
        for k, v in (r.get("parity") or {}).items():
            out.append(f"-- {stage} parity {k}: {v['identical']}/16 identical, {len(v['ties'])} near-ties; "
                       + (v["fails"] + v["ties"] + [""])[0][:300])
        for c, v in (r.get("concurrency") or {}).items():
            out.append(f"-- {stage} concurrency {c}: delta {v['delta']} spec_verify_ct sum {sum(v['spec_verify_ct'])}")
        s = r.get("ours_after_parity") or r.get("ours_at_start")
        if s:
            keys = ("runner", "capture_bs", "replays", "verify_steps", "fallback_total", "fallbacks")
            out.append(f"-- {stage} ours counters {({k: s.get(k) for k in keys})}")
        return out
    except Exception as ex:  # a malformed file: say so, keep the job going
        return [f"-- {stage} e2e_results.json unreadable: {type(ex).__name__}: {ex}"[:300]]


def bench_lines(report: str, lines: list[str]) -> Lines:
    """A lab command's lines by its ``report`` kind (``bench``, ``speedup``, ``capture``, ``demo``,
    ``kbench``, ``jit``)."""
    if report in ("bench", "speedup"):  # mode status lines; the result tables with mode and meta lines
        keep = 90 if report == "bench" else 200  # speedup: its speed-up and advisor tables whole
        return ([ln[:300] for ln in lines if ln.startswith(("BENCH mode ", "ESTIMATE "))],
                [ln[:400] for ln in lines if ln.startswith("RESULT ")][-keep:])
    if report == "capture":  # one line per engine as it finished (kept if the stage timed out)
        return ([ln[:300] for ln in lines if ln.startswith("CAPTURE run ")],
                [ln[:400] for ln in lines if ln.startswith("RESULT ")][-30:])
    if report == "demo":  # the counters and the table (from the first counter line on)
        start = next((i for i, ln in enumerate(lines) if ln.startswith("counters ")), len(lines))
        return [], [ln[:300] for ln in lines[start:]][-30:]
    if report == "kbench":  # the kernel tables (everything after the per-point KERNEL lines)
        return [], [ln[:300] for ln in lines if not ln.startswith("KERNEL {")][-60:]
    if report == "jit":  # one line per module: started / built / failed, seconds, sizes
        return [ln[:300] for ln in lines if ln.startswith("JIT ")], []
    return [], []
