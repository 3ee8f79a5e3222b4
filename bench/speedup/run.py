"""The engines of ``python -m bench speedup``: one child per mode (plain, upstream, ours) with
the pair's weights loaded, its points checked against the pair's simulation, and the parent that
runs them and writes the tables."""
from __future__ import annotations

import datetime
import json
import os
import shlex
import statistics
import sys
import time

from bench.lib import engine, verify_probe
from bench.lib.results import mode_status, phases_from_log
from bench.lib.results import replay_failures as _replay_failures
from bench.models import accept_pair
from bench.speedup import report as speedup_report
from bench.speedup.estimate import estimate_s, plan
from bench.speedup.pair import PAIR, check_classes, default_maps, ensure_pair, load_maps, pair_paths, pair_ready

MODES = ("plain", "upstream", "ours")


def engine_kwargs(a, mode: str, models_dir: str | None = None) -> dict:
    """``bench.lib.engine.engine_kwargs`` for the pair under ``models_dir`` (default
    ``--pair-dir``), with its weights loaded (``load_format`` auto: the folder's
    ``pytorch_model.bin``) instead of dummy ones; triton attention, radix cache on."""
    target, draft = pair_paths(models_dir or a.pair_dir)
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    return engine.engine_kwargs(
        mode, target, draft, cfg, max_context=max(a.contexts), new_tokens=a.new_tokens,
        warmup_tokens=a.warmup_tokens, steps=a.steps, max_bs=max(a.batch_sizes), mem=a.mem,
        prefix_cache=True, log_level=a.log_level, engine_extra=a.engine_extra, load_format="auto")


def run_child(a, res: dict) -> None:
    """Run one mode in one Engine; fills ``res`` as it goes (a crash keeps the finished points)."""
    maps = load_maps(a.pair_dir)
    check_classes(a, maps)
    eng = engine.start_engine(engine_kwargs(a, a.child), res, a.child, plugin=a.child == "ours",
                              profile_every=a.profile_every if a.child != "plain" else 0)
    sp = lambda n: {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}  # noqa: E731
    sims = {}
    try:
        for ctx, cls, bs in dict(plan(a))[a.child]:
            c = maps["classes"][cls]
            if cls not in sims:  # the outputs of every request of the class (its last token decides them)
                sims[cls] = accept_pair.simulate(maps, [c["last_token"]], a.new_tokens, a.steps)
            sim = sims[cls]
            prompts = accept_pair.speedup_prompts(maps, ctx, bs, cls, maps["shape"]["vocab"])
            # where this point's profile lines start in the log (speedup_report.profile_segments)
            print(speedup_report.POINT_MARK + json.dumps({"context": ctx, "bs": bs, "cls": cls}), flush=True)
            eng.generate(input_ids=prompts, sampling_params=sp(a.warmup_tokens))
            engine.engine_state(eng)  # drains the probe
            t1_runs, tn_runs = [], []
            for _ in range(a.repeats):
                t = time.perf_counter()
                eng.generate(input_ids=prompts, sampling_params=sp(1))
                t1_runs.append(time.perf_counter() - t)
                t = time.perf_counter()
                outs = eng.generate(input_ids=prompts, sampling_params=sp(a.new_tokens))
                tn_runs.append(time.perf_counter() - t)
            t1, tn = statistics.median(t1_runs), statistics.median(tn_runs)
            st = engine.engine_state(eng)
            outs = outs if isinstance(outs, list) else [outs]
            metas = [o["meta_info"] for o in outs]
            ph = {"context": ctx, "bs": bs, "cls": cls, "agree": c["agree"],
                  "target_accept_length": c.get("target_accept_length"),
                  "predicted_accept_length": round(accept_pair.sglang_accept_length(sim), 4),
                  "predicted_verify_ct": len(sim["accepted"]), "t1_s": round(t1, 4), "tn_s": round(tn, 4),
                  "t1_runs_s": [round(x, 4) for x in t1_runs], "tn_runs_s": [round(x, 4) for x in tn_runs],
                  "completion_tokens": [m.get("completion_tokens") for m in metas],
                  "spec_verify_ct": [m.get("spec_verify_ct") for m in metas],
                  "spec_accept_length": [m.get("spec_accept_length") for m in metas],
                  "e2e_latency": [m.get("e2e_latency") for m in metas],
                  "histogram": [accept_pair.trim_histogram(m.get("spec_correct_drafts_histogram") or [])
                                for m in metas[:1]],
                  "predicted_histogram": accept_pair.accepted_histogram(sim["accepted"]),
                  "outputs_match": sum(o.get("output_ids") == sim["output_ids"] for o in outs)}
            ph.update(verify_probe.summarize_probe(st["probe"], bs))
            res["phases"].append(ph)
            print("BENCH phase " + json.dumps(ph, default=sorted), flush=True)
        res["plugin_after"] = engine.engine_state(eng)["plugin"]
        res["ok"] = True
    finally:
        eng.shutdown()


def child_dir(a) -> str:
    """The folder of the children's logs and result files: ``--log-dir``, else
    ``<folder of --out>/speedup_logs``."""
    return a.log_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "speedup_logs")


def mode_file(a, mode: str, ext: str) -> str:
    """``<child_dir>/bench_<mode>.<ext>``: a mode child's log (``log``) or result (``json``)."""
    return os.path.join(child_dir(a), f"bench_{mode}.{ext}")


def replay_failures(modes: dict) -> list:
    """Why an ``ours`` engine did not serve every verify step from our graph (``[]`` if it did)."""
    return _replay_failures({k: v for k, v in modes.items() if v.get("mode") == "ours"})


def report(a, modes: dict, meta: dict) -> dict:
    """Rows, advisor rows, tables and check lines of the finished modes."""
    rows = speedup_report.build_rows(modes)
    adv = speedup_report.advisor_rows(rows, a.steps)
    if a.profile_every:  # the advisor as a user runs it: --from-log on each point's profile lines
        speedup_report.add_log_predictions(adv, {m: mode_file(a, m, "log") for m in modes}, child_dir(a))
    md = ("Decode tokens/s per request / per server (prefill left out), speed-ups of decode server "
          "tok/s; accept = SGLang's completion tokens / verify steps.\n\n" + speedup_report.speedup_table(rows)
          + "\n\nAdvisor (GPU ms per replay, decode accept length) vs measured speed-up over plain:\n\n"
          + speedup_report.advisor_table(adv) + "\n"
          + ("\nThe advisor on each point's profile log (`--from-log`, `--decode-ms` = plain's decode GPU ms) "
             "vs measured:\n\n" + speedup_report.advisor_log_table(adv) + "\n" if a.profile_every else ""))
    refused = [f"ctx={x['context']} bs={x['bs']} class={x['cls']} {x['mode']}: {x['advisor_error']}"
               for x in adv if x.get("advisor_error")]
    return {"rows": rows, "advisor": adv, "table_md": md, "gaps": speedup_report.big_gaps(adv),
            "advisor_errors": refused, "output_checks": speedup_report.check_outputs(modes)}


def result_lines(rep: dict, meta: dict, max_list: int = 10) -> list:
    """The ``RESULT`` lines: mode status, the output check, advisor gaps over 10% (at most
    ``max_list`` of each, the rest counted), both tables, then the run's meta lines."""
    def capped(prefix, items):
        out = [f"RESULT {prefix}: {x}" for x in items[:max_list]]
        return out + ([f"RESULT {prefix}: ... {len(items) - max_list} more in the JSON"] if len(items) > max_list else [])

    lines = [f"RESULT mode {m}: {st}" for m, st in meta["mode_status"].items()]
    lines += capped("check FAILED", rep["output_checks"]) or [
        "RESULT check: every output and verify count as predicted"]
    lines += capped("advisor gap > 10%", rep["gaps"])
    lines += capped("advisor refused", rep.get("advisor_errors", []))
    lines += ["RESULT " + ln for ln in rep["table_md"].splitlines() if ln.strip()]
    lines += [f"RESULT hardware: {meta['hardware']}", "RESULT versions: " + json.dumps(meta["versions"]),
              f"RESULT flags: {meta['flags']}", f"RESULT command: {meta['command']}"]
    return lines


def run_parent(a) -> int:
    t_start = time.time()
    os.makedirs(child_dir(a), exist_ok=True)
    say = lambda s: print(s, flush=True)  # noqa: E731
    build = not pair_ready(a.pair_dir)
    maps = load_maps(a.pair_dir) if not build else default_maps()
    check_classes(a, maps)
    est = estimate_s(a, maps, build)
    say(f"ESTIMATE ~{est['total']:.0f} s (pair build {est['build']:.0f} s, {len(a.modes)} engine starts "
        f"{est['engines']:.0f} s, points {est['points']:.0f} s)")
    meta = {"model": PAIR, "hardware": engine.hardware(), "versions": engine.versions(),
            "mode_status": {}, "estimate_s": est, "command": shlex.join([sys.executable] + sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "flags": f"contexts={a.contexts} batch_sizes={a.batch_sizes} classes={a.classes} "
                     f"new_tokens={a.new_tokens} steps={a.steps} mem={a.mem} modes={a.modes} "
                     f"profile_every={a.profile_every}"}
    meta["pair_build_s"] = ensure_pair(a.pair_dir, say)
    maps = load_maps(a.pair_dir)
    check_classes(a, maps)
    meta["classes"] = [{k: c.get(k) for k in ("agree", "target_accept_length", "last_token")} for c in maps["classes"]]
    modes, child = {}, {"p": None}

    def finish(code, show=True):
        rep = report(a, modes, meta)
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rep["rows"], "advisor": rep["advisor"], "gaps": rep["gaps"],
                       "output_checks": rep["output_checks"], "table_md": rep["table_md"], "modes": modes},
                      f, indent=1)
        if a.md:
            with open(a.md, "w") as f:
                f.write(rep["table_md"])
        if not show:
            return code
        for ln in result_lines(rep, meta):
            say(ln)
        say(f"RESULT wrote {a.out} in {time.time() - t_start:.0f}s (estimate {est['total']:.0f}s)")
        return code

    engine.stop_on_sigterm(child, meta, finish)
    for mode in a.modes:
        jf, log = mode_file(a, mode, "json"), mode_file(a, mode, "log")
        if os.path.exists(jf):
            os.remove(jf)
        cmd = engine.child_command("speedup", a.argv, mode, jf)
        t0 = time.time()
        rc = engine.run_logged(cmd, log, a.mode_timeout, child)
        res = engine.read_child(jf, mode)
        if not res.get("phases"):  # killed (timeout, OOM): keep the points it finished
            res.update(phases_from_log(log))
        res.setdefault("mode", mode)
        if rc != 0 and res.get("ok") is not True:
            tail = open(log, errors="replace").read().splitlines()[-25:]
            res.setdefault("error", f"rc={rc}; " + " | ".join(ln for ln in tail if "rror" in ln)[-600:])
            say(f"BENCH mode {mode} failed rc={rc}; last lines of {log}:\n  " + "\n  ".join(tail))
        modes[mode] = res
        meta["mode_status"][mode] = mode_status(res) + f" ({time.time() - t0:.0f}s)"
        say(f"BENCH mode {mode}: {meta['mode_status'][mode]}")
        finish(0, show=False)  # partial results on disk after every mode
    bad = replay_failures(modes) if "ours" in modes else []
    for b in bad:
        meta["mode_status"].setdefault("require_replays", "FAILED")
        say(f"BENCH require-replays FAILED: {b}")
    checks = speedup_report.check_outputs(modes)
    ok = all(m.get("ok") for m in modes.values()) and not bad and not checks
    return finish(0 if ok else 1)
