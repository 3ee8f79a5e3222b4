"""One verify table and ``--out`` JSON from earlier runs on one machine (their ``--out`` files
and mode logs): ``python -m bench merge FILE...``, also ``python -m bench verify --merge FILE...``."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys

from bench.lib.capture_log import target_capture
from bench.lib.results import mode_status, phases_from_log
from bench.verify.table import MODES, build_rows, format_table


class MergeError(ValueError):
    """``--merge`` inputs that cannot form one table (message: one line naming the input and fix)."""


def _join_mode(first: dict, later: dict, key: str, base: str) -> dict:
    """One mode from two inputs that measured different points of it (e.g. plain at bs 16 in one
    run, bs 32 in the next): the phases of both, ``ok`` only when both were, the first input's
    ``engine_kwargs`` and ``startup_s``, and ``inputs`` holding each input's status. Raises
    ``MergeError`` when a (context, bs) point is in both or their num_steps differ."""
    steps = lambda r: (r.get("engine_kwargs") or {}).get("speculative_num_steps")  # noqa: E731
    if steps(first) != steps(later):
        raise MergeError(f"--merge: mode {key} ran num_steps {steps(first)} and {steps(later)} ({base}); "
                         "merge one num_steps at a time")
    pts = lambda r: {(ph["context"], ph["bs"]) for ph in r["phases"]}  # noqa: E731
    both = sorted(pts(first) & pts(later))
    if both:
        raise MergeError(f"--merge: mode {key} has the point (ctx, bs) {both[0]} in two inputs ({base} and an "
                         "earlier one); give each point once")
    inputs = first.get("inputs") or [mode_status(first)]
    return dict(first, phases=first["phases"] + later["phases"], ok=bool(first.get("ok") and later.get("ok")),
                partial=bool(first.get("partial") or later.get("partial")), inputs=inputs + [mode_status(later)])


RUN_KWARGS = ("attention_backend", "moe_runner_backend")
"""Engine settings every merged mode must share (a table of one backend)."""


def _read_input(path: str, base: str) -> tuple:
    """``(modes, meta or None, source)`` of one ``--merge`` input; ``MergeError`` when it is missing
    or neither an ``--out`` JSON nor a ``bench_<key>.log``."""
    if not os.path.isfile(path):
        raise MergeError(f"--merge {path}: no such file; give an existing --out JSON or bench_<mode>.log")
    if path.endswith(".json"):
        try:
            data = json.load(open(path))
            got, m = data["modes"], data["meta"]
            if not (isinstance(got, dict) and isinstance(m, dict)):
                raise TypeError("modes / meta not objects")
        except (OSError, ValueError, KeyError, TypeError) as ex:
            raise MergeError(f"--merge {path}: not a python -m bench verify --out file ({type(ex).__name__}); "
                             "give the --out JSON or a bench_<mode>.log") from None
        src = {"path": base, "command": m.get("command"), "date": m.get("date"),
               "mode_status": m.get("mode_status", {}), "capture": m.get("capture", {})}
        if m.get("merged_from"):
            src["merged_from"] = m["merged_from"]
        return got, m, src
    if re.fullmatch(r"bench_.+\.log", base):
        key = base[len("bench_"):-len(".log")]
        mode = key.split("@")[0]
        if mode not in MODES:
            raise MergeError(f"--merge {path}: {mode!r} is not a mode ({', '.join(MODES)}); "
                             "give a bench_<mode>.log as the run wrote it")
        res = dict(phases_from_log(path), ok=False, mode=mode, error="no JSON", from_log=True)
        return {key: res}, None, {"path": base, "from_log": True, "skipped_lines": res.get("skipped_lines", 0)}
    raise MergeError(f"--merge {path}: neither a .json --out file nor a bench_<mode>.log; give one of those")


def _add_mode(modes: dict, key: str, res: dict, base: str) -> None:
    """Put one input's result of mode ``key`` into ``modes``: a mode's points join those of earlier
    inputs; a failed mode's JSON status and its log's points make one entry in either order."""
    have = modes.get(key)
    if have is None:
        modes[key] = res
    elif not res.get("phases"):  # a failed run with no points: its reason, kept beside what is there
        if have.get("from_log") and not have.get("inputs") and res.get("error"):
            modes[key] = dict(have, error=res["error"], from_log=False)
        elif have.get("phases"):
            modes[key] = dict(have, ok=False, inputs=(have.get("inputs") or [mode_status(have)]) + [mode_status(res)])
    elif have.get("phases"):  # the same mode again: other points of it
        modes[key] = _join_mode(have, res, key, base)
    elif res.get("from_log") and have.get("error"):  # a failed JSON mode, filled from its log
        modes[key] = dict(res, error=have["error"], from_log=False)
    else:  # a failed mode with no points, then a run of it that has them
        modes[key] = dict(res, ok=False, inputs=[mode_status(have), mode_status(res)])


def merge_runs(paths: list) -> tuple:
    """Rebuild one result from earlier runs on one machine: ``--out`` JSON files (their
    ``modes``) and mode logs ``bench_<key>.log`` (their ``BENCH phase`` lines, for a mode killed
    before it wrote its JSON). A mode with no phases in a JSON file is taken from a log given
    beside it; a mode in several inputs joins their points. Returns ``(args, modes, meta)`` for
    ``build_rows`` / ``format_table``: contexts and batch sizes are the union of every mode's
    points, ``meta["merged_from"]`` lists each input (path, and for a JSON its command, date, mode
    status, capture and any ``merged_from`` of its own; ``meta["capture"]`` keeps one per mode, the
    last input's), ``meta["profile_lines"]`` joins the inputs'. Raises ``MergeError`` when an input
    is missing or neither, when two inputs hold the same (context, bs) point of a mode, when the
    models, hardware, versions or ``RUN_KWARGS`` differ, or when num_steps differ under plain keys
    (or plain and ``mode@k`` keys are mixed)."""
    modes, sources, metas, log_capture = {}, [], [], {}
    seen = {what: set() for what in ("models", "hardware", "versions", *RUN_KWARGS)}
    for path in paths:
        base = os.path.basename(path)
        got, m, src = _read_input(path, base)
        sources.append(src)
        if m is not None:
            metas.append(m)
            seen["models"].add(m.get("model"))
            seen["hardware"].add(m.get("hardware"))
            seen["versions"].add(json.dumps(m["versions"], sort_keys=True) if m.get("versions") else None)
        else:
            log_capture.update({k: target_capture(path) for k in got})
        for key, res in got.items():
            ek = res.get("engine_kwargs") or {}
            if m is None and ek.get("model_path"):
                seen["models"].add(os.path.basename(ek["model_path"].rstrip("/")))
            for k in RUN_KWARGS:
                seen[k].add(ek.get(k))
            _add_mode(modes, key, res, base)
    for what, vals in seen.items():
        vals -= {None, ""}
        if len(vals) > 1:
            raise MergeError(f"--merge: the inputs ran different {what} {sorted(vals)}; merge runs of one "
                             "model, machine, version set and backend")
    models = seen["models"]  # the JSON inputs' model names and the logs' model folders, one at most
    steps = {r.get("engine_kwargs", {}).get("speculative_num_steps") for r in modes.values()} - {None}
    keyed = {k for k in modes if "@" in k}
    if keyed and any(k not in keyed and not k.startswith("plain") for k in modes):
        raise MergeError(f"--merge: mode keys {sorted(modes)} mix a --steps sweep's mode@k with plain names; "
                         "merge one num_steps at a time, or the runs of one --steps sweep")
    steps |= {int(k.split("@")[1]) for k in keyed if k.split("@")[1].isdigit()}
    if len(steps) > 1 and not keyed:
        raise MergeError(f"--merge: modes ran num_steps {sorted(steps)} under plain keys; "
                         "merge one num_steps at a time")
    pts = [(ph["context"], ph["bs"]) for r in modes.values() for ph in r.get("phases", [])]
    a = argparse.Namespace(model=(models or {"?"}).pop(), contexts=sorted({c for c, _ in pts}),
                           batch_sizes=sorted({b for _, b in pts}),
                           steps_list=sorted(steps) or [1], modes=[m for m in MODES if m in modes])
    first = metas[0] if metas else {}
    meta = {"model": a.model, "hardware": first.get("hardware", "?"), "versions": first.get("versions", {}),
            "plain_twice": "plain_end" in modes, "command": shlex.join([sys.executable] + sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "flags": f"merged: contexts={a.contexts} batch_sizes={a.batch_sizes} steps={a.steps_list}",
            "merged_from": sources, "capture": {}, "mode_status": {}}
    for m in metas:
        meta["capture"].update({k: v for k, v in m.get("capture", {}).items() if k in modes and v})
        if m.get("profile_lines"):
            meta.setdefault("profile_lines", []).extend(m["profile_lines"])
    meta["capture"].update({k: v for k, v in log_capture.items() if v})
    for key, res in modes.items():
        res.pop("from_log", None)
        meta["mode_status"][key] = mode_status(res)
    return a, modes, meta


def run_merge(a) -> int:
    """``--merge``: write ``--out`` and print the table from earlier runs; 2 with one line on bad input."""
    try:
        if any(os.path.realpath(p) == os.path.realpath(a.out) for p in a.merge):
            raise MergeError(f"--merge: --out {a.out} is one of the inputs; give --out another file")
        ma, modes, meta = merge_runs(a.merge)
    except MergeError as ex:
        print(f"python -m bench merge: {ex}", file=sys.stderr)
        return 2
    rows = build_rows(ma, modes)
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "modes": modes}, f, indent=1)
    print(format_table(rows, meta), flush=True)
    print(f"RESULT merged {len(a.merge)} inputs into {a.out}", flush=True)
    return 0


def main(argv=None) -> int:
    """``python -m bench merge FILE... [--out F]``: :func:`run_merge`."""
    ap = argparse.ArgumentParser(prog="python -m bench merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("merge", nargs="+", metavar="FILE",
                    help="earlier runs' --out JSON files and mode logs (bench_<mode>.log, for a mode "
                         "killed before it wrote its JSON)")
    ap.add_argument("--out", default="results.json")
    return run_merge(ap.parse_args(argv))
