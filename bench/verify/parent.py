"""The parent of ``python -m bench verify``: one engine child per mode (and num_steps), in
order; the table and ``--out`` JSON rewritten after every mode, so a killed run keeps its modes."""
from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time

from bench.lib import engine
from bench.lib.capture_log import target_capture
from bench.lib.profile_log import profile_fields, read_profile_lines
from bench.lib.results import mode_status, phases_from_log, replay_failures
from bench.verify import child as verify_child
from bench.verify.table import build_rows, format_table, mode_key


def run_parent(a) -> int:
    t_start = time.time()
    log_dir = a.log_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "bench_logs")
    os.makedirs(log_dir, exist_ok=True)
    verify_child.model_paths(a)
    modes, child = {}, {"p": None}
    meta = {"model": a.model, "hardware": engine.hardware(), "versions": engine.versions(), "mode_status": {},
            "plain_twice": a.plain_twice,
            "command": shlex.join([sys.executable] + sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "flags": f"contexts={a.contexts} batch_sizes={a.batch_sizes} new_tokens={a.new_tokens} steps={a.steps_list} "
                     f"attention_backend={a.attention_backend} draft_attention_backend={a.draft_attention_backend} "
                     f"mem={a.mem} prefix_cache={a.prefix_cache} modes={a.modes} plain_twice={a.plain_twice}"}

    def finish(code, show=True):
        rows = build_rows(a, modes)
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows, "modes": modes}, f, indent=1)
        if not show:
            return code
        print(format_table(rows, meta), flush=True)
        print(f"RESULT wrote {a.out} in {time.time() - t_start:.0f}s", flush=True)
        return code

    engine.stop_on_sigterm(child, meta, finish)
    runs = [(mode, k, mode_key(a, mode, k)) for k in a.steps_list for mode in a.modes
            if mode != "plain" or k == a.steps_list[0]]
    if a.plain_twice:  # the same baseline again, last (baseline.py)
        runs.append(("plain", a.steps_list[0], "plain_end"))
    for mode, k, key in runs:
        jf, log = os.path.join(log_dir, f"bench_{key}.json"), os.path.join(log_dir, f"bench_{key}.log")
        if os.path.exists(jf):
            os.remove(jf)
        cmd = engine.child_command("verify", a.argv, mode, jf, "--steps", str(k))
        t0 = time.time()
        rc = engine.run_logged(cmd, log, a.mode_timeout, child)
        res = engine.read_child(jf, mode)
        if not res.get("phases"):  # killed (timeout, OOM): keep the points it finished
            res.update(phases_from_log(log))
        if rc != 0 and res.get("ok") is not True:
            tail = open(log, errors="replace").read().splitlines()[-25:]
            res.setdefault("error", f"rc={rc}; " + " | ".join(ln for ln in tail if "rror" in ln)[-600:])
            print(f"BENCH mode {key} failed rc={rc}; last lines of {log}:\n  " + "\n  ".join(tail), flush=True)
        if mode == "ours_profile":
            meta.setdefault("profile_lines", []).extend(
                dict(p, num_steps_run=k) for p in profile_lines(log))
        modes[key] = res
        meta.setdefault("capture", {})[key] = target_capture(log)
        meta["mode_status"][key] = mode_status(res) + f" ({time.time() - t0:.0f}s)"
        print(f"BENCH mode {key}: {meta['mode_status'][key]}", flush=True)
        finish(0, show=False)  # partial results on disk after every mode
    bad = replay_failures(modes) if a.require_replays else []
    for b in bad:
        meta["mode_status"].setdefault("require_replays", "FAILED")
        print(f"BENCH require-replays FAILED: {b}", flush=True)
    if a.require_replays and not bad:
        print("BENCH require-replays ok: every ours engine replayed every verify step, no fallback", flush=True)
    return finish(0 if all(m.get("ok") for m in modes.values()) and not bad else 1)


def profile_lines(log_path: str) -> list:
    """The ``verify_graph_profile`` lines of a mode log as ``key=value`` dicts (str values), each
    with ``span_per_cycle_ms`` (device span / cycles) and ``phase_sum_vs_span`` (cycle_mean_ms,
    i.e. the four phases' sum, over it: 1.0 when the cycles fill the GPU timeline)."""
    out = []
    for line in read_profile_lines(log_path):
        p = profile_fields(line)
        try:
            span = 1000.0 * float(p["tokens"]) / float(p["tok_s"]) / float(p["cycles"])
            p["span_per_cycle_ms"] = round(span, 4)
            p["phase_sum_vs_span"] = round(float(p["cycle_mean_ms"]) / span, 4)
        except (KeyError, ValueError, ZeroDivisionError):
            p["span_per_cycle_ms"] = p["phase_sum_vs_span"] = None
        out.append(p)
    return out
