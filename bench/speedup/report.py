"""Rows, advisor check and tables of ``python -m bench speedup`` (pure Python: no torch, no sglang).

Input: the ``modes`` of one run, ``{mode: {"phases": [phase, ...], ...}}`` with ``mode`` one of
``plain``, ``upstream``, ``ours``. A phase is one measured point (``bench.speedup.run.run_child``):

* ``context``, ``bs``, ``cls`` (agreement class of the pair), ``agree``, ``target_accept_length``;
* ``t1_s`` / ``tn_s``: wall seconds of a 1-token and of the ``new_tokens``-token generation of
  the same ``bs`` prompts (greedy, ``ignore_eos``, prompts in the radix cache);
* ``completion_tokens`` and ``spec_verify_ct`` (lists, one per request; SGLang's ``meta_info``),
  ``spec_accept_length`` (SGLang's completion tokens / verify steps per request);
* ``roles``: the probe's GPU ms per graph replay (median) per role, ``target_decode``,
  ``target_verify``, ``draft_decode`` (the cycle's draft steps, one replay), ``draft_extend``
  (``bench.lib.verify_probe.summarize_probe``).

Throughput (tokens/s): ``server`` counts every request of the batch, ``request`` one request
(the requests of a batch end in the same token and finish together). ``decode`` figures leave
the prefill out: ``(new_tokens - 1)`` tokens per request over ``tn_s - t1_s``; the others are
``new_tokens`` over ``tn_s``. Speed-ups are decode server tok/s of one mode over another's at the
same (context, bs) (plain runs one agreement class: its speed does not depend on acceptance).

Advisor check: per point and speculative mode, ``sglang_verify_graph.advisor``'s model
(``Inputs`` / ``evaluate``: accept_length x decode_ms / cycle_ms) fed the plain engine's decode
replay, the mode's draft / verify / draft-extend replays and the measured decode accept length
``(new_tokens - 1) / verify steps`` (the tokens the decode part emits per cycle); ``gap_pct`` =
100 x (predicted / measured - 1). The advisor counts GPU time only: ``wall_per_gpu`` (wall ms per
step or cycle over its GPU ms) of plain and of the mode give the gap,
``predicted / measured = mode wall_per_gpu / plain wall_per_gpu``.

Profile-log check (``python -m bench speedup --profile-every N``): the speculative engines also log the
per-phase profile, and the advisor is run as a user runs it, ``--from-log`` on each point's lines
(:func:`profile_segments`) with ``--decode-ms`` = the plain engine's decode GPU ms: its phase
times, ``other_ms`` and accept length are then the log's (``gap_from_log_pct``).
"""

from __future__ import annotations

import json
import os
import statistics

from bench.lib.profile_log import at_batch, profile_fields

SPEC_MODES = ("upstream", "ours")


def _div(x, y, nd=3):
    return round(x / y, nd) if x is not None and y else None


def _gpu(ph: dict, role: str):
    return ((ph.get("roles") or {}).get(role) or {}).get("gpu_ms")


def point_metrics(ph: dict) -> dict:
    """Throughput and accept length of one phase (keys above). Returns ``request_tok_s``,
    ``server_tok_s``, ``decode_request_tok_s``, ``decode_server_tok_s`` (tokens/s; None when
    a time is missing or not positive), ``new_tokens``, ``verify_steps`` (the batch's: max over
    requests; None without speculation), ``accept_length`` (mean of SGLang's per-request figure),
    ``decode_accept_length`` (``(new_tokens - 1) / verify_steps``), ``step_wall_ms`` (wall ms per
    decode step, plain, or per cycle, speculative) and the GPU ms per replay of each role."""
    toks = [c for c in (ph.get("completion_tokens") or []) if c]
    n = min(toks) if toks else None
    bs = ph["bs"]
    tn, t1 = ph.get("tn_s"), ph.get("t1_s")
    vct = [v for v in (ph.get("spec_verify_ct") or []) if v]
    steps = max(vct) if vct else None
    dec = (tn - t1) if tn is not None and t1 is not None and tn > t1 else None
    acc = [a for a in (ph.get("spec_accept_length") or []) if a]
    out = {
        "new_tokens": n, "verify_steps": steps,
        "request_tok_s": round(n / tn, 2) if n and tn else None,
        "server_tok_s": round(sum(toks) / tn, 2) if toks and tn else None,
        "decode_request_tok_s": round((n - 1) / dec, 2) if n and n > 1 and dec else None,
        "decode_server_tok_s": round(bs * (n - 1) / dec, 2) if n and n > 1 and dec else None,
        "accept_length": round(statistics.mean(acc), 4) if acc else None,
        "decode_accept_length": round((n - 1) / steps, 4) if n and steps else None,
        "step_wall_ms": (round(1000 * dec / (steps or (n - 1)), 4) if dec and n and n > 1 else None),
    }
    for role in ("target_decode", "target_verify", "draft_decode", "draft_extend"):
        out[role + "_ms"] = _gpu(ph, role)
    parts = [out["draft_decode_ms"], out["target_verify_ms"], out["draft_extend_ms"]]
    out["cycle_ms"] = round(sum(parts), 4) if all(p is not None for p in parts) else None
    return out


def _index(modes: dict, mode: str) -> dict:
    """{(context, bs, cls): phase} of one mode; plain's also under (context, bs, None)."""
    out = {}
    for ph in (modes.get(mode) or {}).get("phases", []):
        out[(ph["context"], ph["bs"], ph.get("cls"))] = ph
        if mode == "plain":
            out.setdefault((ph["context"], ph["bs"], None), ph)
    return out


def build_rows(modes: dict) -> list:
    """One row per (context, bs, agreement class) measured by a speculative mode (or by plain
    alone): ``{"context", "bs", "cls", "agree", "target_accept_length", "predicted_accept_length",
    "plain": metrics, "upstream": metrics, "ours": metrics, "speedup": {...}}`` with metrics of
    :func:`point_metrics` (None for a mode that did not measure the point) and ``speedup``:
    ``ours_over_plain``, ``upstream_over_plain``, ``ours_over_upstream`` (decode server tok/s)
    and the same three over the whole generation (``*_e2e``, server tok/s)."""
    idx = {m: _index(modes, m) for m in ("plain",) + SPEC_MODES}
    keys = sorted({k for m in SPEC_MODES for k in idx[m]} or {k for k in idx["plain"] if k[2] is not None},
                  key=lambda k: (k[0], k[2] if k[2] is not None else -1, k[1]))
    rows = []
    for ctx, bs, cls in keys:
        phs = {m: idx[m].get((ctx, bs, cls)) for m in SPEC_MODES}
        phs["plain"] = idx["plain"].get((ctx, bs, cls)) or idx["plain"].get((ctx, bs, None))
        any_ph = next(p for p in (phs["ours"], phs["upstream"], phs["plain"]) if p)
        r = {"context": ctx, "bs": bs, "cls": cls, "agree": any_ph.get("agree"),
             "target_accept_length": any_ph.get("target_accept_length"),
             "predicted_accept_length": any_ph.get("predicted_accept_length")}
        for m, ph in phs.items():
            r[m] = point_metrics(ph) if ph else None
        g = lambda m, k: (r[m] or {}).get(k)  # noqa: E731
        r["speedup"] = {
            "ours_over_plain": _div(g("ours", "decode_server_tok_s"), g("plain", "decode_server_tok_s")),
            "upstream_over_plain": _div(g("upstream", "decode_server_tok_s"), g("plain", "decode_server_tok_s")),
            "ours_over_upstream": _div(g("ours", "decode_server_tok_s"), g("upstream", "decode_server_tok_s")),
            "ours_over_plain_e2e": _div(g("ours", "server_tok_s"), g("plain", "server_tok_s")),
            "upstream_over_plain_e2e": _div(g("upstream", "server_tok_s"), g("plain", "server_tok_s")),
            "ours_over_upstream_e2e": _div(g("ours", "server_tok_s"), g("upstream", "server_tok_s")),
        }
        rows.append(r)
    return rows


def advisor_prediction(decode_ms: float, verify_ms: float, draft_ms: float, draft_extend_ms: float,
                       accept_length: float, num_steps: int) -> float:
    """The advisor's speed-up over plain decode (``sglang_verify_graph.advisor``: ``Inputs``,
    ``evaluate``) from GPU ms per replay and an accept length (tokens per cycle, in [1,
    num_steps + 1]). Raises ``advisor.AdvisorError`` (a ValueError) for input it refuses."""
    from sglang_verify_graph import advisor

    inp = advisor.Inputs(decode_ms=decode_ms, num_steps=num_steps, verify_points={num_steps: verify_ms},
                         draft_points={num_steps: draft_ms}, draft_extend_ms=draft_extend_ms,
                         accept_length=accept_length)
    inp.validate()
    return advisor.evaluate(inp, num_steps).speedup


def advisor_rows(rows: list, num_steps: int) -> list:
    """Predicted vs measured speed-up over plain per row and speculative mode: dicts with
    ``context``, ``bs``, ``cls``, ``mode``, the advisor's inputs (``decode_ms``, ``verify_ms``,
    ``draft_ms``, ``draft_extend_ms``, ``cycle_ms``: GPU ms; ``accept_length``: the decode
    accept length), ``predicted``, ``measured`` (decode server tok/s over plain's), ``gap_pct``,
    and ``plain_wall_per_gpu`` / ``wall_per_gpu`` (wall ms per step or cycle over GPU ms). A point
    missing an input gets ``predicted`` None and ``missing`` naming it; one whose inputs the
    advisor refuses (e.g. an accept length outside [1, num_steps + 1]) gets ``predicted`` None
    and ``advisor_error`` (its message), so one odd point cannot stop the run's report."""
    out = []
    for r in rows:
        plain = r.get("plain") or {}
        for m in SPEC_MODES:
            met = r.get(m)
            if not met:
                continue
            a = {"context": r["context"], "bs": r["bs"], "cls": r["cls"], "agree": r["agree"], "mode": m,
                 "decode_ms": plain.get("target_decode_ms"), "verify_ms": met.get("target_verify_ms"),
                 "draft_ms": met.get("draft_decode_ms"), "draft_extend_ms": met.get("draft_extend_ms"),
                 "cycle_ms": met.get("cycle_ms"), "accept_length": met.get("decode_accept_length"),
                 "measured": r["speedup"][f"{m}_over_plain"]}
            need = ("decode_ms", "verify_ms", "draft_ms", "draft_extend_ms", "accept_length")
            missing = [k for k in need if a[k] is None]
            if missing:
                a.update(predicted=None, gap_pct=None, missing=missing)
            else:
                try:
                    pred = advisor_prediction(a["decode_ms"], a["verify_ms"], a["draft_ms"], a["draft_extend_ms"],
                                              a["accept_length"], num_steps)
                except ValueError as ex:  # advisor.AdvisorError: a measured input it refuses
                    pred = None
                    a["advisor_error"] = str(ex)
                a["predicted"] = round(pred, 3) if pred is not None else None
                a["gap_pct"] = round(100 * (pred / a["measured"] - 1), 1) if pred is not None and a["measured"] else None
            a["plain_wall_per_gpu"] = _div(plain.get("step_wall_ms"), plain.get("target_decode_ms"))
            a["wall_per_gpu"] = _div(met.get("step_wall_ms"), met.get("cycle_ms"))
            out.append(a)
    return out


POINT_MARK = "BENCH point "
"""The line a ``python -m bench speedup`` child prints before each point's warm-up: ``BENCH point`` + JSON
``{"context", "bs", "cls"}``."""


def profile_segments(log_path: str) -> dict:
    """``{(context, bs, cls): [line, ...]}``: the ``verify_graph_profile`` lines of a child's log
    between one point's ``BENCH point`` line and the next one's (the profile drains its events
    a few cycles late, so a window can hold the previous point's last cycles: lines whose ``bs=``
    is not the point's are dropped, ``bench.lib.profile_log.at_batch``). ``{}`` for a log that
    cannot be read."""
    out, key = {}, None
    try:
        lines = open(log_path, errors="replace").read().splitlines()
    except OSError:
        return {}
    for ln in lines:
        if ln.startswith(POINT_MARK):
            p = json.loads(ln[len(POINT_MARK):])
            key = (p["context"], p["bs"], p["cls"])
            out[key] = []
        elif key is not None and at_batch(profile_fields(ln), key[1]):
            out[key].append(ln)
    return out


def log_prediction(log_file: str, decode_ms: float) -> dict:
    """The advisor exactly as ``python -m sglang_verify_graph.advisor --from-log LOG_FILE
    --decode-ms DECODE_MS`` runs it: ``{"predicted", "num_steps", "verify_ms", "draft_ms",
    "draft_extend_ms", "other_ms", "accept_length"}`` (ms: the log's medians). Raises
    ``advisor.AdvisorError`` (a ValueError) for a log or input it refuses, OSError for a file."""
    from sglang_verify_graph import advisor

    inp = advisor.inputs_from_args(advisor.build_parser().parse_args(
        ["--from-log", log_file, "--decode-ms", repr(float(decode_ms))]))
    row = advisor.evaluate(inp, inp.num_steps)
    k = inp.num_steps
    return {"predicted": row.speedup, "num_steps": k, "verify_ms": inp.verify_points.get(k),
            "draft_ms": inp.draft_points.get(k), "draft_extend_ms": inp.draft_extend_ms,
            "other_ms": inp.other_ms, "accept_length": inp.accept_length}


def add_log_predictions(adv: list, logs: dict, out_dir: str) -> None:
    """Add to each advisor row of a mode in ``logs`` (``{mode: child log path}``) the advisor's
    prediction from that point's profile lines: ``log_lines`` (count), ``from_log`` (the dict of
    :func:`log_prediction`, or ``{"error": message}``) and ``gap_from_log_pct``; each point's
    lines are written to ``out_dir/profile_<mode>_<context>_<bs>_<cls>.log`` (the file the
    advisor read)."""
    segs = {m: profile_segments(p) for m, p in logs.items() if m in SPEC_MODES}
    for a in adv:
        lines = segs.get(a["mode"], {}).get((a["context"], a["bs"], a["cls"]))
        if lines is None:
            continue
        a["log_lines"] = len(lines)
        path = os.path.join(out_dir, f"profile_{a['mode']}_{a['context']}_{a['bs']}_{a['cls']}.log")
        with open(path, "w") as f:
            f.writelines(ln + "\n" for ln in lines)
        try:
            if a.get("decode_ms") is None:
                raise ValueError("no plain decode time for this point")
            fl = log_prediction(path, a["decode_ms"])
        except (ValueError, OSError) as ex:
            a["from_log"], a["gap_from_log_pct"] = {"error": str(ex)}, None
            continue
        a["from_log"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in fl.items()}
        a["gap_from_log_pct"] = round(100 * (fl["predicted"] / a["measured"] - 1), 1) if a["measured"] else None


def advisor_log_table(adv: list) -> str:
    """The markdown table of the profile-log predictions (rows with ``from_log``) vs measured."""
    lines = ["| ctx | bs | agree | mode | log lines | log: draft + verify + extend + other ms | log accept "
             "| advisor from log | advisor from probe | measured | gap from log |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in adv:
        fl = a.get("from_log")
        if fl is None:
            continue
        if "error" in fl:
            lines.append(f"| {a['context']} | {a['bs']} | {_f(a['agree'])} | {a['mode']} | {a['log_lines']} "
                         f"| refused: {fl['error'][:120]} | - | - | {_f(a['predicted'], 3)} | {_f(a['measured'], 3)} | - |")
            continue
        parts = " + ".join(_f(fl.get(k), 3) for k in ("draft_ms", "verify_ms", "draft_extend_ms", "other_ms"))
        lines.append(f"| {a['context']} | {a['bs']} | {_f(a['agree'])} | {a['mode']} | {a['log_lines']} | {parts} "
                     f"| {_f(fl.get('accept_length'), 3)} | {_f(fl['predicted'], 3)} | {_f(a['predicted'], 3)} "
                     f"| {_f(a['measured'], 3)} | {_f(a['gap_from_log_pct'], 1, '%')} |")
    return "\n".join(lines)


def _f(v, nd=2, suffix=""):
    return "-" if v is None else f"{v:.{nd}f}{suffix}"


def speedup_table(rows: list) -> str:
    """The markdown table of the measured speed-ups (one line per row)."""
    lines = ["| ctx | bs | agree | accept up / ours | plain tok/s req / server | upstream tok/s | ours tok/s "
             "| ours / plain | upstream / plain | ours / upstream |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = {k: r.get(k) or {} for k in ("plain", "upstream", "ours")}
        tok = lambda k: f"{_f(m[k].get('decode_request_tok_s'), 1)} / {_f(m[k].get('decode_server_tok_s'), 0)}"  # noqa: E731
        s = r["speedup"]
        lines.append(f"| {r['context']} | {r['bs']} | {_f(r['agree'])} | {_f(m['upstream'].get('accept_length'))} / "
                     f"{_f(m['ours'].get('accept_length'))} | {tok('plain')} | {tok('upstream')} | {tok('ours')} | "
                     f"**{_f(s['ours_over_plain'])}** | {_f(s['upstream_over_plain'])} | {_f(s['ours_over_upstream'])} |")
    return "\n".join(lines)


def advisor_table(adv: list) -> str:
    """The markdown table of predicted vs measured speed-ups over plain."""
    lines = ["| ctx | bs | agree | mode | decode ms | cycle ms (draft + verify + extend) | accept | advisor "
             "| measured | gap | wall / GPU plain, mode |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in adv:
        cyc = (f"{_f(a['cycle_ms'], 3)} ({_f(a['draft_ms'], 3)} + {_f(a['verify_ms'], 3)} + "
               f"{_f(a['draft_extend_ms'], 3)})")
        lines.append(f"| {a['context']} | {a['bs']} | {_f(a['agree'])} | {a['mode']} | {_f(a['decode_ms'], 3)} | {cyc} "
                     f"| {_f(a['accept_length'], 3)} | {_f(a['predicted'], 3)} | {_f(a['measured'], 3)} "
                     f"| {_f(a['gap_pct'], 1, '%')} | {_f(a['plain_wall_per_gpu'], 3)}, {_f(a['wall_per_gpu'], 3)} |")
    return "\n".join(lines)


def big_gaps(adv: list, tol_pct: float = 10.0) -> list:
    """One line per advisor row whose gap exceeds ``tol_pct`` (percent), with its wall / GPU
    ratios: the host time per step that the advisor leaves out."""
    out = []
    for a in adv:
        if a.get("gap_pct") is None or abs(a["gap_pct"]) <= tol_pct:
            continue
        out.append(f"ctx={a['context']} bs={a['bs']} agree={_f(a['agree'])} {a['mode']}: advisor "
                   f"{_f(a['predicted'], 3)} vs measured {_f(a['measured'], 3)} ({a['gap_pct']:+.1f}%); wall / GPU "
                   f"plain {_f(a['plain_wall_per_gpu'], 3)}, {a['mode']} {_f(a['wall_per_gpu'], 3)}")
    return out


def check_outputs(modes: dict) -> list:
    """One line per phase whose outputs differ from the pair's prediction (``outputs_match`` <
    ``bs``) or whose verify steps differ from it (``spec_verify_ct`` vs ``predicted_verify_ct``):
    an accept length other than the one the class was built for."""
    out = []
    for mode, res in modes.items():
        for ph in (res or {}).get("phases", []):
            where = f"{mode} ctx={ph['context']} bs={ph['bs']} class={ph.get('cls')}"
            if ph.get("outputs_match") is not None and ph["outputs_match"] < ph["bs"]:
                out.append(f"{where}: {ph['bs'] - ph['outputs_match']} of {ph['bs']} outputs differ from the prediction")
            want = ph.get("predicted_verify_ct")
            got = [v for v in (ph.get("spec_verify_ct") or []) if v]
            if mode != "plain" and want is not None and got and set(got) != {want}:
                out.append(f"{where}: verify steps {sorted(set(got))}, predicted {want}")
    return out
