"""The demo's constants, step-time arithmetic, pass/fail checks and result table (no SGLang, no
network; ``demo.py`` runs the servers)."""

from __future__ import annotations

import argparse
import shlex
import statistics
from typing import Dict, Iterable, List, Optional

from bench.lib.profile_log import lines_at_batch, profile_field


RUN_ORDER = ("upstream", "ours", "plain")
"""Order the servers are started in (module docstring: why upstream first)."""

TABLE_ORDER = ("plain", "upstream", "ours")
"""Row order of the result table."""

SPECULATIVE = ("upstream", "ours")

DESCRIPTION = {
    "plain": "no speculation (the target's decode CUDA graph)",
    "upstream": "EAGLE-3 top-k 1, SGLang's own TARGET_VERIFY CUDA graph",
    "ours": "the same + --enable-verify-cuda-graph (this plugin's verify graph)",
}

FLAG = "--enable-verify-cuda-graph"
PROFILE_FLAG = "--verify-graph-profile-every"
PROFILE_TAG = "verify_graph_profile"

SERVABLE_MODELS = ("llama-8b", "llama-small", "kimi-small", "kimi-small-mla")
"""``dummy_models`` pairs the stock server can start with dummy weights. ``kimi-k25-small`` is
left out: for its multimodal architecture ``sglang.launch_server`` loads the checkpoint's
remote-code processor, which a config-only folder does not have."""

DEFAULT_WORKDIR = "/tmp/sglang_verify_graph_demo"
NUM_STEPS = 3
NUM_DRAFT_TOKENS = NUM_STEPS + 1
PROMPT_SEED = 20240611

NOTE = ("Note: with dummy (random) weights the draft almost never guesses the target's token "
        "(accept length ~1.0), so each speculative step emits ~1 token: the table shows what one "
        "speculation cycle (draft + verify + draft-extend) costs against a plain decode step, "
        "not a speed-up. With trained weights a step emits accept-length tokens.")


class DemoError(RuntimeError):
    """A step of the demo failed; the message is one line (what failed, where to look)."""


# ----------------------------------------------------------------------------- arithmetic

def decode_steps(mode: str, meta_info: dict, completion_tokens: int) -> Optional[int]:
    """Decode steps of one request after its prefill: ``completion_tokens - 1`` for plain
    decoding (the prefill emits the first token), the request's ``spec_verify_ct`` (verify
    cycles) for a speculative mode; ``None`` when a speculative request reports no verify."""
    if mode in SPECULATIVE:
        n = meta_info.get("spec_verify_ct")
        return int(n) if n else None
    return completion_tokens - 1


def step_ms(t1_s: float, tn_s: float, steps: Optional[int]) -> Optional[float]:
    """Client milliseconds per decode step: ``1000 * (tn_s - t1_s) / steps`` (``t1_s``: wall
    seconds of the 1-token request, ``tn_s``: of the N-token request of the same prompt);
    ``None`` without steps."""
    if not steps or steps < 1:
        return None
    return 1000.0 * (tn_s - t1_s) / steps


def ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
    """``x / y``, or ``None`` when either is missing or ``y`` is 0."""
    return x / y if x is not None and y else None


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    """Median of the values that are not ``None`` (``None`` when there are none)."""
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def profile_at_batch(lines: Iterable[str], bs: int) -> Optional[dict]:
    """Medians of the ``verify_graph_profile`` lines whose window ran at batch size ``bs``
    (``bs=`` is the window's mean batch size, so a window across two load levels is left out;
    ``bench.lib.profile_log``), parsed by
    :func:`sglang_verify_graph.advisor.inputs.parse_profile_log`: ``verify_ms``,
    ``draft_ms``, ``draft_extend_ms``, ``other_ms`` (device ms per cycle, whole batch),
    ``cycle_ms`` (device ms; median of the lines' own field), ``accept_length``, ``lines``.
    ``None`` when no line ran at ``bs``."""
    from sglang_verify_graph.advisor.inputs import parse_profile_log

    picked = lines_at_batch(lines, bs)
    if not picked:
        return None
    summary = parse_profile_log(picked)
    steps = summary.main_steps()
    out = {k: summary.value(k, steps) for k in ("verify_ms", "draft_ms", "draft_extend_ms",
                                                 "other_ms", "accept_length")}
    out["cycle_ms"] = median(float(profile_field(ln, "cycle_ms")) for ln in picked
                             if profile_field(ln, "cycle_ms") is not None)
    out["lines"] = summary.lines
    return out


# ----------------------------------------------------------------------------- checks

def replay_failure(states: Optional[List[Optional[dict]]]) -> Optional[str]:
    """One line when ``ours`` did not replay its verify graph on every verify step (per rank:
    ``verify_cuda_graph`` state missing, no verify steps, a fallback, or replays != verify
    steps), else ``None``. ``states``: ``internal_states[i]["verify_cuda_graph"]`` per rank."""
    if not states:
        return ("ours: /get_server_info has no verify_cuda_graph state: the plugin did not "
                f"install its runner (is sglang-verify-graph installed next to sglang?)")
    for rank, st in enumerate(states):
        if not st:
            return (f"ours: rank {rank} has no verify_cuda_graph state in /get_server_info: "
                    "the plugin did not install its runner")
        fallbacks = st.get("fallback_total", 0)
        if st.get("verify_steps", 0) <= 0:
            return f"ours: rank {rank} counted no verify step (replays {st.get('replays')})"
        if fallbacks or st.get("replays") != st.get("verify_steps"):
            return (f"ours: rank {rank} replayed {st.get('replays')} of {st.get('verify_steps')} "
                    f"verify steps (fallbacks {st.get('fallbacks') or fallbacks}); see the server log")
    return None


def parity_failure(outputs: Dict[str, Optional[List[int]]]) -> Optional[str]:
    """One line when the greedy output ids differ between modes (first differing position
    against the first mode given), or a mode has none; else ``None``."""
    modes = list(outputs)
    if not modes:
        return None
    missing = [m for m in modes if outputs[m] is None]
    if missing:
        return f"greedy parity: no concurrency-1 output from {', '.join(missing)}"
    ref_mode = modes[0]
    ref = outputs[ref_mode]
    for m in modes[1:]:
        ids = outputs[m]
        if ids == ref:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(ref, ids)) if x != y), min(len(ref), len(ids)))
        got = lambda s: s[pos] if pos < len(s) else "end"  # noqa: E731
        return (f"greedy parity: {m} differs from {ref_mode} at output token {pos} "
                f"({got(ids)} vs {got(ref)}; lengths {len(ids)} vs {len(ref)})")
    return None


def failures(report: dict) -> List[str]:
    """The failure lines of a report (:func:`build_report`): replay check, then parity."""
    out = []
    replay = replay_failure(report["modes"].get("ours", {}).get("verify_cuda_graph"))
    if replay:
        out.append(replay)
    parity = parity_failure({m: report["modes"].get(m, {}).get("output_ids_c1")
                             for m in TABLE_ORDER})
    if parity:
        out.append(parity)
    return out


# ----------------------------------------------------------------------------- report

def build_rows(modes: Dict[str, dict], concurrency: int) -> List[dict]:
    """One table row per mode (``TABLE_ORDER``) from per-mode results (:func:`measure_server`
    fields ``step_ms_c1``, ``verify_ms_c1``, ``tok_s_c1``, ``tok_s_cN``, ``accept_length``)."""
    plain_step = (modes.get("plain") or {}).get("step_ms_c1")
    rows = []
    for m in TABLE_ORDER:
        r = modes.get(m) or {}
        rows.append({
            "mode": m,
            "step_ms_c1": r.get("step_ms_c1"),
            "step_per_plain": ratio(r.get("step_ms_c1"), plain_step),
            "verify_ms_c1": r.get("verify_ms_c1"),
            "verify_per_plain_step": ratio(r.get("verify_ms_c1"), plain_step),
            "accept_length": r.get("accept_length"),
            "tok_s_c1": r.get("tok_s_c1"),
            f"tok_s_c{concurrency}": r.get("tok_s_cN"),
        })
    return rows


def format_table(rows: List[dict], concurrency: int) -> str:
    """The result table as aligned text, one line per row ("-" for a missing value)."""
    cols = [("mode", "mode", "s"), ("step_ms_c1", "step ms (c=1)", ".2f"),
            ("step_per_plain", "step / plain", ".2f"),
            ("verify_ms_c1", "verify ms (device)", ".2f"),
            ("verify_per_plain_step", "verify / plain step", ".2f"),
            ("accept_length", "accept len", ".2f"), ("tok_s_c1", "tok/s c=1", ".1f"),
            (f"tok_s_c{concurrency}", f"tok/s c={concurrency}", ".1f")]

    def cell(v, f):
        if v is None:
            return "-"
        return format(v, f) if f != "s" else str(v)

    body = [[cell(r.get(k), f) for k, _, f in cols] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, (_, h, _) in enumerate(cols)]
    line = lambda cells: " | ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line([h for _, h, _ in cols]), "-+-".join("-" * w for w in widths)]
    out += [line(b) for b in body]
    return "\n".join(out)


def counter_lines(modes: Dict[str, dict]) -> List[str]:
    """One line per speculative mode: the verify-graph counters of ``/get_server_info``."""
    out = []
    for m in SPECULATIVE:
        states = (modes.get(m) or {}).get("verify_cuda_graph")
        if not states or not any(states):
            out.append(f"counters {m}: no verify_cuda_graph state"
                       + (" (flag off: SGLang's own verify graph)" if m == "upstream" else ""))
            continue
        for rank, st in enumerate(states):
            st = st or {}
            out.append(f"counters {m} rank {rank}: runner={st.get('runner')} "
                       f"replays={st.get('replays')} verify_steps={st.get('verify_steps')} "
                       f"fallbacks={st.get('fallback_total')} {st.get('fallbacks') or {}} "
                       f"capture_bs={st.get('capture_bs')}")
    return out


def build_report(a: argparse.Namespace, modes: Dict[str, dict], commands: Dict[str, list]) -> dict:
    """The JSON written to ``--out``: options, commands, per-mode results, table rows, note,
    failures."""
    rows = build_rows(modes, a.concurrency)
    report = {
        "model": a.model, "context": a.context, "new_tokens": a.new_tokens,
        "concurrency": a.concurrency, "repeats": a.repeats, "num_steps": NUM_STEPS,
        "num_draft_tokens": NUM_DRAFT_TOKENS, "profile_every": a.profile_every,
        "units": {"step_ms_c1": "client ms per decode step (speculative: per verify cycle)",
                  "verify_ms_c1": "device ms per verify phase at bs 1 (per-phase profile)",
                  "tok_s": "output tokens per second of wall time"},
        "run_order": list(RUN_ORDER), "commands": {m: shlex.join(c) for m, c in commands.items()},
        "modes": modes, "table": rows, "note": NOTE,
    }
    report["failures"] = failures(report)
    return report


def print_report(report: dict) -> None:
    for ln in counter_lines(report["modes"]):
        print(ln)
    print()
    print(f"{report['model']}, context {report['context']}, {report['new_tokens']} new tokens, "
          f"EAGLE-3 {report['num_steps']} steps / {report['num_draft_tokens']} draft tokens, "
          "triton attention; medians of "
          f"{report['repeats']} rounds")
    print(format_table(report["table"], report["concurrency"]))
    print(verify_at_concurrency_line(report["modes"], report["concurrency"]))
    print(report["note"])


def verify_at_concurrency_line(modes: Dict[str, dict], concurrency: int) -> str:
    """The verify phase's device ms at the second load level (profile windows at that batch
    size), one line for the speculative modes."""
    def ms(m):
        v = ((modes.get(m) or {}).get("profile_cN") or {}).get("verify_ms")
        return "-" if v is None else f"{v:.2f}"
    return (f"verify ms (device) at c={concurrency}: "
            + ", ".join(f"{m} {ms(m)}" for m in SPECULATIVE))

def _fmt(values, digits: int = 2) -> str:
    return " ".join("-" if v is None else f"{v:.{digits}f}" for v in values)
