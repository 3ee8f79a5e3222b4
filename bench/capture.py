"""Capture time and graph memory of the target's verify graphs, ours vs upstream, over repeated
engine starts (target: capture time and graph memory no larger than upstream's).

    python -m bench capture [--repeats 3] [--modes ours,upstream] [--out capture_results.json]
        [python -m bench verify engine flags: --model llama-8b --steps 2 --batch-sizes 1,8 --mem 0.8 --prefix-cache ...]

One pair of engine starts cannot separate a small capture difference from the run-to-run
spread of single starts. This runs each mode ``--repeats`` times, each in a fresh ``sglang.Engine``
subprocess (``python -m bench verify ... --capture-only --child MODE``: start-up, capture, shut down, no
generation), alternating the order per repeat (ours, upstream / upstream, ours, ...) so neither
mode always starts on a cold page cache or after the other's teardown. Each engine's capture time
(s) and memory (GiB = 2**30 bytes) come from its log line (``bench.lib.capture_log.target_capture``: the
whole runner construction, buffers + every bucket's warm-up and capture), with the free GPU memory
SGLang logs once the target's graphs exist (the comparable figure where the drop reads negative). Prints one table
(median, min, max per mode; ours / upstream of the medians and the per-repeat paired ratios) and
writes ``--out`` (JSON). The engine flags are ``python -m bench verify``'s, so the buckets and pool match
the sweep being judged; one ``--steps`` value per run.

Only runs that exited 0 and logged the capture line of their own mode count (an ``ours`` engine
whose log shows upstream's verify capture means the plugin did not install: that run is failed,
not counted as ours). The JSON is rewritten after every engine; on SIGTERM (the GPU job's stage
limit) the engine is killed and the summary of the finished runs is printed and written.

Errors: exits 2 with argparse's message for bad flags (more than one ``--steps`` value, unknown,
repeated or no mode, ``--repeats`` < 1); exits 1 when any engine failed (listed with its
status; the medians use the others); 124 on SIGTERM.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import sys
import time

from bench.lib import engine
from bench.lib.capture_log import MODE_KIND, free_after_diff, memory_ratio, target_capture
from bench.verify import child as verify_child
from bench.verify import cli as verify_cli


def run_order(modes: list, repeats: int) -> list:
    """``[(repeat, mode), ...]``: ``modes`` in order on even repeats, reversed on odd ones."""
    return [(r, m) for r in range(repeats) for m in (modes if r % 2 == 0 else modes[::-1])]


def judge(mode: str, rc, capture) -> tuple[bool, str]:
    """``(ok, status)`` of one engine run: ok only with exit code 0 and its own mode's capture line."""
    status = f"rc={rc}"
    if rc != 0:
        return False, status
    if capture is None:
        return False, status + ", no capture line"
    if capture["kind"] != MODE_KIND[mode]:
        return False, status + f", capture kind {capture['kind']!r}, expected {MODE_KIND[mode]!r}"
    return True, status


def summarise(runs: list) -> dict:
    """Per mode: n, median / min / max seconds, median GiB (free-memory drop) and median free GiB
    after the target's graphs (None unless every counted log has it), over the runs with ``ok``;
    plus ``ours_per_upstream`` (time and memory, ratio of the medians, memory None unless both are
    positive drops; ``free_after_diff_gib``: ours' median free GiB minus upstream's) and
    ``paired_time`` (ours / upstream per repeat where both are ok). ``runs``: dicts with
    ``repeat``, ``mode``, ``ok`` and ``capture``."""
    good = [r for r in runs if r.get("ok") and r.get("capture")]
    out = {"modes": {}}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        caps = [r["capture"] for r in good if r["mode"] == mode]
        if not caps:
            out["modes"][mode] = {"n": 0}
            continue
        secs = [c["seconds"] for c in caps]
        free = [c.get("free_after_gib") for c in caps]
        out["modes"][mode] = {"n": len(caps), "median_s": round(statistics.median(secs), 3),
                              "min_s": min(secs), "max_s": max(secs),
                              "median_gib": round(statistics.median(c["gib"] for c in caps), 3),
                              "median_free_after_gib": (None if None in free
                                                        else round(statistics.median(free), 3)),
                              "seconds": secs}
    o, u = out["modes"].get("ours", {}), out["modes"].get("upstream", {})
    if o.get("n") and u.get("n"):
        out["ours_per_upstream"] = {
            "time": round(o["median_s"] / u["median_s"], 3) if u["median_s"] > 0 else None,
            "memory": memory_ratio(o["median_gib"], u["median_gib"], 3),
            "free_after_diff_gib": free_after_diff(o["median_free_after_gib"], u["median_free_after_gib"])}
        by_rep = {}
        for r in good:
            by_rep.setdefault(r["repeat"], {})[r["mode"]] = r["capture"]["seconds"]
        out["paired_time"] = [round(v["ours"] / v["upstream"], 3) for _, v in sorted(by_rep.items())
                              if "ours" in v and v.get("upstream")]
    return out


def format_summary(summary: dict, meta: dict) -> str:
    x = lambda v: "-" if v is None else f"{v}x"  # noqa: E731
    lines = [f"RESULT capture-repeat model={meta['model']} steps={meta['steps']} (the target's verify graphs; "
             "plain: its decode graphs; s = whole runner construction, GiB = free-memory drop, "
             "free_GiB = free GPU memory after the target's graphs)",
             "RESULT " + " ".join(f"{h:>10}" for h in ("mode", "n", "median_s", "min_s", "max_s", "median_GiB",
                                                        "free_GiB"))]
    for mode, m in summary["modes"].items():
        free = m.get("median_free_after_gib")
        vals = [mode, m["n"]] + ([m["median_s"], m["min_s"], m["max_s"], m["median_gib"],
                                  "-" if free is None else free] if m["n"] else ["-"] * 5)
        lines.append("RESULT " + " ".join(f"{v:>10}" for v in vals))
    r = summary.get("ours_per_upstream")
    if r:
        p = summary.get("paired_time") or []
        d = r.get("free_after_diff_gib")
        lines.append(f"RESULT capture ours / upstream (medians): time {x(r['time'])}, memory {x(r['memory'])}, "
                     f"free after {'-' if d is None else f'{d:+.2f} GiB'}; "
                     f"per repeat: {', '.join(f'{v}x' for v in p) or '-'}")
    for run in meta["runs"]:
        c = run["capture"]
        free = c.get("free_after_gib") if c else None
        cap = (f"{c['seconds']:.2f} s, {c['gib']:.3f} GiB" + ("" if free is None else f", {free:.2f} GiB free after")
               if c else "no capture line")
        lines.append(f"RESULT run {run['repeat']} {run['mode']}: {cap} ({run['status']}"
                     + ("" if run["ok"] else ", FAILED: not counted") + ")")
    lines += [f"RESULT hardware: {meta['hardware']}", "RESULT versions: " + json.dumps(meta["versions"]),
              f"RESULT command: {meta['command']}"]
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m bench capture", description=__doc__.split("\n\n")[0],
        epilog="Every other flag goes to each engine as python -m bench verify's (--model, --steps, "
               "--contexts, --batch-sizes, --mem, --prefix-cache, --models-dir, ...; see its --help).")
    ap.add_argument("--repeats", type=int, default=3, help="engine starts per mode")
    ap.add_argument("--modes", default="ours,upstream", help="comma list of ours, upstream, plain")
    ap.add_argument("--out", default="capture_results.json")
    ap.add_argument("--log-dir", default=None, help="engine logs (default: <out dir>/capture_logs)")
    ap.add_argument("--mode-timeout", type=float, default=180, help="seconds per engine subprocess")
    ap.add_argument("--dry-run", action="store_true", help="print the engine commands in run order and exit")
    a, rest = ap.parse_known_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in a.modes if m not in MODE_KIND]
    if bad or not a.modes or len(set(a.modes)) != len(a.modes):
        ap.error(f"--modes {','.join(a.modes) or '(none)'}: give each of ours, upstream, plain at most once")
    if a.repeats < 1:
        ap.error("--repeats needs an integer >= 1")
    a.engine_argv = rest
    a.bench = verify_cli.parse_args(rest)  # validates the engine flags (model, steps, ...)
    if a.bench.plain_twice:
        ap.error("--plain-twice is a python -m bench verify decode-timing flag; capture times captures only")
    if len(a.bench.steps_list) != 1:
        ap.error("--steps: one value per run (the capture of one draft length)")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    log_dir = a.log_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "capture_logs")
    cmds = []
    for r, mode in run_order(a.modes, a.repeats):
        jf = os.path.join(log_dir, f"capture_{r}_{mode}.json")
        cmds.append((r, mode, engine.child_command("verify", a.engine_argv, mode, jf, "--capture-only")))
    if a.dry_run:
        for r, mode, cmd in cmds:
            print(f"DRYRUN {r} {mode}: {shlex.join(cmd)}")
        return 0
    os.makedirs(log_dir, exist_ok=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    verify_child.model_paths(a.bench)  # make the models once, before the first engine
    meta = {"model": a.bench.model, "steps": a.bench.steps, "hardware": engine.hardware(),
            "versions": engine.versions(), "command": shlex.join([sys.executable] + sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "runs": []}
    child = {"p": None}

    def finish(code: int, show: bool = True) -> int:
        summary = summarise(meta["runs"])
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "summary": summary}, f, indent=1)
        if show:
            print(format_summary(summary, meta), flush=True)
        return code

    def on_term(signum, frame):
        if child["p"] is not None:
            engine.kill_tree(child["p"])
        meta["interrupted"] = f"signal {signum} after {len(meta['runs'])} of {len(cmds)} engines"
        sys.exit(finish(124))

    signal.signal(signal.SIGTERM, on_term)
    for r, mode, cmd in cmds:
        log = os.path.join(log_dir, f"capture_{r}_{mode}.log")
        t0 = time.time()
        rc = engine.run_logged(cmd, log, a.mode_timeout, child)
        cap = target_capture(log)
        ok, status = judge(mode, rc, cap)
        run = {"repeat": r, "mode": mode, "capture": cap, "ok": ok, "status": status,
               "wall_s": round(time.time() - t0, 1), "log": log}
        meta["runs"].append(run)
        print(f"CAPTURE run {r} {mode}: {status} {cap} ({run['wall_s']}s)", flush=True)
        finish(0, show=False)  # partial results on disk after every engine
    return finish(0 if all(r["ok"] for r in meta["runs"]) else 1)


if __name__ == "__main__":
    sys.exit(main())
