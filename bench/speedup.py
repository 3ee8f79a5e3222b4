#!/usr/bin/env python3
"""Measured EAGLE-3 speed-up at the Llama-3.1-8B shape with set accept lengths: plain / upstream / ours.

    python3 bench/speedup.py [--pair-dir /tmp/models] [--modes plain,upstream,ours]
        [--contexts 1024,8192] [--batch-sizes 1,4,16] [--classes 0,1,2,3] [--new-tokens 128] [--repeats 3]
        [--out speedup_results.json] [--md speedup_table.md] [--dry-run]

The model is the attention pair of ``bench/models/accept_pair.py --shape llama8b --attention`` (built
under ``--pair-dir`` when missing, ~3.2 GiB of ``pytorch_model.bin``): a Llama-3.1-8B-shape
target whose greedy token goes through its layer-0 attention and a Llama-3.1-8B EAGLE-3-shape
draft, both at full size (every layer computes; layers 1-31 write nothing), whose agreement is
set per class of token: a request's accept length is its class's (``accept_pair.make_class_maps``;
the default classes give about 1.5, 2.0, 2.5 and 3.0 at num_steps 3). One engine per mode, each
in its own subprocess (``bench_verify.run_logged``), ``sglang.Engine`` with the weights loaded
(``load_format`` auto), triton attention, radix cache on, greedy, ``ignore_eos``:

  plain     no speculation;
  upstream  EAGLE3, top-k 1, ``--steps`` S draft steps, S + 1 draft tokens (SGLang's verify graph);
  ours      the same with ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` (``--enable-verify-cuda-graph``).

Per point (context, bs, agreement class; plain once per (context, bs), its speed does not depend
on acceptance): ``bs`` prompts of ``context`` tokens (``accept_pair.speedup_prompts``: shared
by every batch size and class, so each is prefilled once per engine), a warm-up request, then a
1-token and a ``--new-tokens`` generation, timed on the host, ``--repeats`` times (default 3;
``t1_s`` / ``tn_s`` are the medians, every run in ``t1_runs_s`` / ``tn_runs_s``); SGLang's ``meta_info``
(``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``, the accepted-draft
histogram) gives the measured accept length beside each speed; the outputs and verify steps are
checked against ``accept_pair.simulate``. ``verify_probe`` (CUDA events around every graph
replay in the scheduler process, as in ``bench_verify.py``) gives the GPU ms per replay of the
plain decode, the draft steps, the verify and the draft extend: the inputs of the advisor check
(``speedup_report.advisor_rows``). Results: ``--out`` (JSON: meta, rows, advisor, modes) and
``--md`` (the speed-up table and the advisor table); ``RESULT`` lines on stdout. Exit status 0
when every mode ran, every output and verify count matched the prediction and (``ours``)
every verify step replayed our graph; 1 otherwise; 2 for a bad flag (one line naming it).

Time (printed before the run, ``ESTIMATE``): the pair's build (~15 s, skipped when present),
per mode ~75 s outside its points (child process, engine start with 3.2 GiB read, 16 GiB to the
GPU and graph capture, shutdown) and each point's generation from the per-replay costs of
``docs/benchmarks.md`` section 12. The default grid (3 engines x 2 contexts x 3 batch sizes x 4
classes, 3 repeats per point) takes about 7.5 minutes on one H200; ``--repeats 1`` about 4.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _p in (HERE, os.path.join(REPO, "scripts")):
    if _p not in sys.path:
        sys.path.insert(0, _p)  # bench_verify, verify_probe, speedup_report; accept_pair
import accept_pair  # noqa: E402
import bench_verify  # noqa: E402
import speedup_report  # noqa: E402

MODES = ("plain", "upstream", "ours")
PAIR = accept_pair.LLAMA8B.folder(True)  # llama8b-pair-attn (+ -eagle3)
WEIGHTS = "pytorch_model.bin"
# The estimate's constants (H200, section 12 of docs/benchmarks.md): seconds per mode outside its
# points (child process, engine start with 3.2 GiB read, 16 GiB to the GPU and graph capture,
# shutdown: 103 / 62 / 60 s for plain / upstream / ours, the first start compiling), seconds to build
# the pair (14 s), host seconds per point, prefill tokens per second; per-step GPU ms: cycle_ms.
START_S, BUILD_S, POINT_OVERHEAD_S, PREFILL_TOK_S = 75.0, 15.0, 0.3, 40000.0

if __name__ == "__mp_main__" and os.environ.get(bench_verify.PROBE_ENV) == "1":  # scheduler process (spawn)
    try:
        import verify_probe

        verify_probe.install_probe()
    except Exception as _ex:  # keep the engine running without the probe
        print(f"PROBE install failed: {_ex!r}", file=sys.stderr, flush=True)


class FlagError(ValueError):
    """A bad flag value: the message is the one line to print (it names the flag)."""


class PairBuildError(RuntimeError):
    """``accept_pair.py --shape llama8b`` failed: the message holds its last output."""


# ----------------------------------------------------------------- the pair
def pair_paths(pair_dir: str) -> tuple:
    """``(target_dir, draft_dir)`` of the attention pair under ``pair_dir``."""
    d = os.path.abspath(pair_dir)
    return os.path.join(d, PAIR), os.path.join(d, PAIR + "-eagle3")


def pair_ready(pair_dir: str) -> bool:
    """Both folders hold config.json and their weights, and pair_maps.json is the default
    build's (the llama8b shape, :data:`accept_pair.AGREE_LLAMA8B`, seed 0): a pair left by an
    older build is built again."""
    if not all(os.path.isfile(os.path.join(d, f)) for d in pair_paths(pair_dir)
               for f in ("config.json", "pair_maps.json", WEIGHTS)):
        return False
    try:
        maps = load_maps(pair_dir)
    except (OSError, ValueError):
        return False
    want = json.loads(json.dumps(dataclasses.asdict(accept_pair.LLAMA8B)))
    return (maps.get("agree") == list(accept_pair.AGREE_LLAMA8B) and maps.get("seed") == 0
            and maps.get("shape") == want and maps.get("attention") is True)


def ensure_pair(pair_dir: str, log) -> float:
    """Build the pair under ``pair_dir`` unless :func:`pair_ready`; returns the seconds spent (0.0
    when it was there). Raises PairBuildError with the builder's last lines when it fails."""
    if pair_ready(pair_dir):
        return 0.0
    t0 = time.time()
    cmd = [sys.executable, os.path.join(REPO, "scripts", "accept_pair.py"), pair_dir, "--shape", "llama8b",
           "--attention"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    log(f"BENCH pair: {shlex.join(cmd)} rc={r.returncode} in {time.time() - t0:.1f}s: "
        + " | ".join((r.stdout + r.stderr).strip().splitlines()[-3:]))
    if r.returncode or not pair_ready(pair_dir):
        raise PairBuildError("accept_pair.py --shape llama8b failed: " + (r.stdout + r.stderr).strip()[-600:])
    return round(time.time() - t0, 1)


def load_maps(pair_dir: str) -> dict:
    """The pair's ``pair_maps.json`` (maps, classes, shape)."""
    with open(os.path.join(pair_paths(pair_dir)[0], "pair_maps.json")) as f:
        return json.load(f)


def default_maps() -> dict:
    """The maps the default build writes (for ``--dry-run`` without a pair on disk)."""
    maps = accept_pair.make_class_maps(accept_pair.VOCAB, accept_pair.AGREE_LLAMA8B, 0)
    for c, t in zip(maps["classes"], accept_pair.ACCEPT_TARGETS):
        c["target_accept_length"] = t
    return maps


def check_classes(a, maps: dict) -> None:
    """``--classes`` against the pair's classes; raises FlagError naming the flag."""
    n = len(maps["classes"])
    if a.classes is None:
        a.classes = list(range(n))
    bad = [c for c in a.classes if not 0 <= c < n]
    if bad:
        have = ", ".join(f"{i}: agree {c['agree']}" for i, c in enumerate(maps["classes"]))
        raise FlagError(f"--classes {','.join(map(str, a.classes))}: the pair has classes 0-{n - 1} ({have})")


# ----------------------------------------------------------------- engines
def verify_args(a, models_dir: str) -> argparse.Namespace:
    """The ``bench_verify`` arguments its ``engine_kwargs`` reads, for this run."""
    return argparse.Namespace(
        models_dir=models_dir, model=PAIR, contexts=a.contexts, batch_sizes=a.batch_sizes,
        new_tokens=a.new_tokens, warmup_tokens=a.warmup_tokens, steps=a.steps, cuda_graph_bs=None,
        attention_backend="triton", draft_attention_backend=None, mem=a.mem, prefix_cache=True,
        log_level=a.log_level, moe_runner_backend=None, engine_extra=a.engine_extra)


def engine_kwargs(a, mode: str, models_dir: str | None = None) -> dict:
    """``bench_verify.engine_kwargs`` for the pair, with its weights loaded (``load_format``
    auto: the folder's ``pytorch_model.bin``) instead of dummy ones."""
    kw = bench_verify.engine_kwargs(verify_args(a, models_dir or a.pair_dir), mode)
    kw["load_format"] = "auto"
    kw.update(json.loads(a.engine_extra))
    return kw


def plan(a) -> list:
    """``[(mode, [(context, cls, bs), ...]), ...]``: the points each engine measures, in order
    (plain: the first class only)."""
    out = []
    for m in a.modes:
        classes = a.classes[:1] if m == "plain" else a.classes
        out.append((m, [(ctx, c, bs) for ctx in a.contexts for c in classes for bs in a.batch_sizes]))
    return out


def run_child(a, res: dict) -> None:
    """Run one mode in one Engine; fills ``res`` as it goes (a crash keeps the finished points)."""
    maps = load_maps(a.pair_dir)
    check_classes(a, maps)
    import verify_probe

    eng = bench_verify.start_engine(engine_kwargs(a, a.child), res, a.child, plugin=a.child == "ours",
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
            bench_verify._state(eng)  # drains the probe
            t1_runs, tn_runs = [], []
            for _ in range(a.repeats):
                t = time.perf_counter()
                eng.generate(input_ids=prompts, sampling_params=sp(1))
                t1_runs.append(time.perf_counter() - t)
                t = time.perf_counter()
                outs = eng.generate(input_ids=prompts, sampling_params=sp(a.new_tokens))
                tn_runs.append(time.perf_counter() - t)
            t1, tn = statistics.median(t1_runs), statistics.median(tn_runs)
            st = bench_verify._state(eng)
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
        res["plugin_after"] = bench_verify._state(eng)["plugin"]
        res["ok"] = True
    finally:
        eng.shutdown()


# ----------------------------------------------------------------- estimate
def _decode_ms(ctx: int, bs: int) -> float:
    k = ctx / 1024
    return 4.63 + 0.359 * k + 0.032 * bs * k


def cycle_ms(mode: str, ctx: int, bs: int) -> float:
    """Estimated GPU ms of one decode step (plain) or one EAGLE-3 cycle at num_steps 3 on the
    H200 (fit to the pair's decode and verify times of section 12 of ``docs/benchmarks.md``; an
    estimate, not a measurement)."""
    dec = _decode_ms(ctx, bs)
    if mode == "plain":
        return dec
    side = 1.2 + 0.05 * bs + 0.05 * ctx / 1024  # draft steps + draft extend
    k = ctx / 1024
    ratio = 1.0 if mode == "ours" else 1.17 + 0.185 * k + 0.057 * bs + 0.0193 * k * bs
    return dec * ratio + side


def estimate_s(a, maps: dict, build: bool) -> dict:
    """Estimated seconds of the run: ``{"build", "engines", "points", "total"}``."""
    points = 0.0
    for mode, pts in plan(a):
        seen_prefill = set()
        for ctx, cls, bs in pts:
            acc = 1.0 if mode == "plain" else (maps["classes"][cls].get("target_accept_length") or 2.0)
            steps = (a.warmup_tokens + a.repeats * (1 + a.new_tokens)) / acc
            new = [i for i in range(bs) if (ctx, i) not in seen_prefill]
            seen_prefill.update((ctx, i) for i in new)
            points += 1.1 * steps * cycle_ms(mode, ctx, bs) / 1000 + POINT_OVERHEAD_S + len(new) * ctx / PREFILL_TOK_S
    out = {"build": BUILD_S if build else 0.0, "engines": START_S * len(a.modes), "points": round(points, 1)}
    out["total"] = round(sum(out.values()), 1)
    return out


# ----------------------------------------------------------------- parent
def child_dir(a) -> str:
    """The folder of the children's logs and result files: ``--log-dir``, else
    ``<folder of --out>/speedup_logs``."""
    return a.log_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "speedup_logs")


def mode_file(a, mode: str, ext: str) -> str:
    """``<child_dir>/bench_<mode>.<ext>``: a mode child's log (``log``) or result (``json``)."""
    return os.path.join(child_dir(a), f"bench_{mode}.{ext}")


def mode_status(res: dict) -> str:
    return bench_verify._mode_status(res)


def replay_failures(modes: dict) -> list:
    """Why an ``ours`` engine did not serve every verify step from our graph (``[]`` if it did)."""
    return bench_verify.replay_failures({k: v for k, v in modes.items() if v.get("mode") == "ours"})


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


def _read_child(path: str, mode: str) -> dict:
    """A child's result file, or ``{"mode": mode, "ok": False}`` when it is missing or cut short
    (a child killed while writing it): the parent then keeps what the child's log holds."""
    try:
        with open(path) as f:
            res = json.load(f)
        return res if isinstance(res, dict) else {"mode": mode, "ok": False}
    except (OSError, ValueError):
        return {"mode": mode, "ok": False}


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
    meta = {"model": PAIR, "hardware": bench_verify._hardware(), "versions": bench_verify._versions(),
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

    def on_term(signum, frame):
        if child["p"] is not None:
            bench_verify._kill_tree(child["p"])
        meta["mode_status"].setdefault("interrupted", f"signal {signum}")
        sys.exit(finish(124))

    signal.signal(signal.SIGTERM, on_term)
    for mode in a.modes:
        jf, log = mode_file(a, mode, "json"), mode_file(a, mode, "log")
        if os.path.exists(jf):
            os.remove(jf)
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + ["--child", mode, "--child-out", jf]
        t0 = time.time()
        rc = bench_verify.run_logged(cmd, log, a.mode_timeout, child)
        res = _read_child(jf, mode)
        if not res.get("phases"):  # killed (timeout, OOM): keep the points it finished
            res.update(bench_verify.phases_from_log(log))
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


def parse_args(argv=None):
    def ints(flag, lo):
        def parse(s):
            try:
                v = [int(x) for x in str(s).split(",") if x.strip()]
            except ValueError:
                raise argparse.ArgumentTypeError(f"{s!r}: want a comma list of integers >= {lo}")
            if not v or min(v) < lo:
                raise argparse.ArgumentTypeError(f"{s!r}: want a comma list of integers >= {lo}")
            return v
        return parse

    def at_least(lo):
        def parse(s):
            try:
                v = int(s)
            except ValueError:
                v = lo - 1
            if v < lo:
                raise argparse.ArgumentTypeError(f"{s!r}: want an integer >= {lo}")
            return v
        return parse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair-dir", default=os.environ.get("MODELS_DIR", "/tmp/models"),
                    help=f"folder of the pair ({PAIR} and {PAIR}-eagle3; built there when missing)")
    ap.add_argument("--modes", default="plain,upstream,ours", type=lambda s: [m for m in s.split(",") if m],
                    help="comma list of " + ", ".join(MODES))
    ap.add_argument("--contexts", type=ints("--contexts", 16), default=[1024, 8192],
                    help="prompt lengths in tokens, comma list")
    ap.add_argument("--batch-sizes", type=ints("--batch-sizes", 1), default=[1, 4, 16],
                    help="requests per batch (concurrency), comma list")
    ap.add_argument("--classes", type=ints("--classes", 0), default=None,
                    help="agreement classes of the pair, comma list (default all: accept length about "
                         "1.5, 2.0, 2.5, 3.0 at num_steps 3)")
    ap.add_argument("--new-tokens", type=at_least(2), default=accept_pair.SPEEDUP_NEW_TOKENS,
                    help="generated tokens per measured request (the classes are calibrated at 128)")
    ap.add_argument("--warmup-tokens", type=at_least(1), default=4)
    ap.add_argument("--repeats", type=at_least(1), default=3,
                    help="timed (1-token, --new-tokens) generation pairs per point; their medians count")
    ap.add_argument("--steps", type=at_least(1), default=accept_pair.NUM_STEPS,
                    help="EAGLE-3 draft steps S (S + 1 draft tokens)")
    ap.add_argument("--mem", type=float, default=0.75, help="mem_fraction_static")
    ap.add_argument("--profile-every", type=at_least(0), default=0,
                    help="speculative engines log the per-phase profile every N cycles "
                         "(--verify-graph-profile-every) and the advisor reads each point's lines "
                         "(--from-log) beside its probe-fed prediction (0: off)")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--engine-extra", default="{}", help="JSON dict of extra Engine/ServerArgs kwargs (applied last)")
    ap.add_argument("--mode-timeout", type=float, default=240, help="seconds per mode subprocess")
    ap.add_argument("--out", default="speedup_results.json")
    ap.add_argument("--md", default=None, help="also write the markdown tables here")
    ap.add_argument("--log-dir", default=None, help="child logs + JSON (default: <out dir>/speedup_logs)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan, the estimate and each engine's kwargs; build and start nothing")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    bad = [m for m in a.modes if m not in MODES]
    if bad or not a.modes or len(set(a.modes)) != len(a.modes):
        ap.error(f"--modes {','.join(a.modes)}: want each of {', '.join(MODES)} at most once")
    if not 0.0 < a.mem < 1.0:
        ap.error(f"--mem {a.mem}: want a fraction in (0, 1)")
    try:
        extra = json.loads(a.engine_extra)
        if not isinstance(extra, dict):
            raise ValueError
    except ValueError:
        ap.error(f"--engine-extra {a.engine_extra!r}: want a JSON object")
    if not a.mode_timeout > 0:
        ap.error(f"--mode-timeout {a.mode_timeout}: want seconds > 0")
    a.contexts, a.batch_sizes = sorted(set(a.contexts)), sorted(set(a.batch_sizes))
    need = max(a.contexts) + a.new_tokens + a.warmup_tokens + 2 * (a.steps + 1) + 64  # bench_verify.engine_kwargs'
    if need > accept_pair.LLAMA8B.max_position:
        ap.error(f"--contexts {max(a.contexts)}: with --new-tokens {a.new_tokens} the requests need {need} positions "
                 f"(context + new + warm-up tokens + 2 x (steps + 1) + 64); the pair has "
                 f"{accept_pair.LLAMA8B.max_position}")
    if a.classes is not None:
        a.classes = list(dict.fromkeys(a.classes))
    return a


def dry_run(a) -> int:
    """Print the plan, the estimate and the kwargs of each engine (config-only folders in a
    temporary directory when the pair is not built)."""
    built = pair_ready(a.pair_dir)
    maps = load_maps(a.pair_dir) if built else default_maps()
    check_classes(a, maps)
    est = estimate_s(a, maps, not built)
    print("BENCH plan: " + "; ".join(f"{m}: {len(p)} points" for m, p in plan(a)), flush=True)
    print(f"ESTIMATE ~{est['total']:.0f} s (pair build {est['build']:.0f} s, {len(a.modes)} engine starts "
          f"{est['engines']:.0f} s, points {est['points']:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        models = a.pair_dir
        if not built:
            mm, tcfg, dcfg = accept_pair.shape_configs(accept_pair.LLAMA8B)
            for name, cfg in ((PAIR, tcfg), (PAIR + "-eagle3", dcfg)):
                mm.write_model(tmp, name, cfg)
            models = tmp
            print(f"DRYRUN pair: {PAIR} not built under {a.pair_dir}: the run builds it first", flush=True)
        for m in a.modes:
            kw = engine_kwargs(a, m, models)
            if not built:
                kw = {k: (v.replace(tmp, os.path.abspath(a.pair_dir)) if isinstance(v, str) else v)
                      for k, v in kw.items()}
            print(f"DRYRUN {m}: " + json.dumps(kw), flush=True)
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if a.dry_run:
            return dry_run(a)
        if a.child:
            return bench_verify.child_main(a, run_child, json_default=sorted)
        return run_parent(a)
    except FlagError as ex:
        print(f"bench_speedup.py: error: {ex}", file=sys.stderr)
        return 2
    except PairBuildError as ex:
        print(f"bench_speedup.py: {ex}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
