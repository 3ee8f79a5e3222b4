#!/usr/bin/env python3
"""Per-step GPU time of the EAGLE-3 (topk 1) target verify: ours vs upstream vs plain decode.

    python3 bench/verify.py [--model llama-8b|llama-small|kimi-small|kimi-small-mla|kimi-k25-shard|...]
        [--contexts 1024,8192] [--batch-sizes 1,8] [--new-tokens 64] [--steps 2 | --steps 1,2,3,5]
        [--modes ours,upstream,plain] [--out results.json] [--quick]
        [--moe-runner-backend triton] [--cuda-graph-bs 1,8,32] [--engine-extra JSON] [--require-replays]

Kimi-K2.5 TP-8 shard (``kimi-k25-shard``: 61 layers, INT4 routed experts, 72 GiB with the drafter),
the full per-phase sweep: ``--model kimi-k25-shard --steps 2,3 --contexts 1024,4096,16384
--batch-sizes 1,4,8,16,32 --prefix-cache --mem 0.85 --moe-runner-backend triton --cuda-graph-bs
1,4,8,16,32`` (``--moe-runner-backend`` omitted: SGLang's default, Marlin WNA16, whose JIT build
takes minutes on a cold cache). ``kimi-k25-shard-wrapped`` (KimiK25ForConditionalGeneration) runs
with ``enable_multimodal=False``: the text model alone, as for any ``text_config`` wrapper.

Modes, each in its own subprocess with a fresh ``sglang.Engine`` (so GPU memory is freed between):
  plain     no speculation (target DECODE graph);
  upstream  EAGLE3, topk 1, ``--steps`` S draft steps, S+1 draft tokens (upstream TARGET_VERIFY graph);
  ours      the same with env ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` (the plugin's VerifyCudaGraphRunner);
  plain_end with ``--plain-twice``: a second ``plain`` engine, started last; per point the decode
            baseline is the lower of the two medians and points whose medians differ by > 5% are
            listed (``RESULT baseline`` lines; ``baseline.py``: one plain engine start has read
            8-34% slow);
  ours_profile  ``ours`` with the per-phase profile on (``SGLANG_VERIFY_GRAPH_PROFILE_EVERY``
            = ``--profile-every``, default 20): the decode part of its ``--new-tokens``
            generation over ``ours``'s, minus 1, is the profile's overhead (column ``prof_ovh%``,
            in percent): ``(tn - t1_mean) / (tn' - t1_mean) - 1`` with ``t1_mean`` the mean
            1-token (prefill) time of the two engines, divided by the verify steps when their
            counts differ. Each engine's own ``t1`` would carry the noise of one 1-token request
            (32.3 vs 28.7 ms measured on an H200); leaving prefill in ``tn`` would dilute the
            ratio (no radix cache: prefill is up to 78% of ``tn`` at 8k, bs 8). Its
            ``verify_graph_profile`` log lines
            (parsed from the mode's log) give the phase-sum check: mean cycle time (device) vs
            device span per cycle (``1000 * tokens / tok_s / cycles``, gaps included).

What is measured: inside the scheduler process (this module is re-imported there by
multiprocessing spawn as ``__mp_main__``) ``execute`` of every graph runner class
(DecodeCudaGraphRunner, VerifyCudaGraphRunner, EAGLEDraftCudaGraphRunner,
EAGLEDraftExtendCudaGraphRunner) is wrapped with CUDA events recorded before/after the outermost
call per runner instance (read back later, no synchronize in the step) and a host clock.
Results are keyed by runner class, worker (target/draft), forward mode and raw/padded batch size,
and fetched per phase through ``Engine.get_server_info()`` (the scheduler's internal state).
Per (context, bs) phase: prompts of ``context`` random token ids, warm-up, then ``--new-tokens``
greedy tokens with ``ignore_eos``. Reported, in ms: median GPU time per graph replay of target
decode, target verify, draft decode (all ``--steps`` draft steps of one cycle: one replay), draft
extend, and their sum per cycle (draft + verify + draft-extend); host time per replay; and e2e ms per step
= (wall of N tokens - wall of 1 token, the faster of two) / steps (steps = max spec_verify_ct,
or N-1 for plain; none when the difference is not positive).
With dummy random weights no draft token is accepted (accept length 1.0): this measures the cost
of a speculation cycle, not a speed-up. Prints one table and writes ``--out`` (JSON).

``--prefix-cache`` (for large sweeps): the radix cache is on and request i of a context has
the same prompt at every batch size, so each context's prompts are prefilled once (by the first
point's warm-up) and the 1-token and N-token requests hit the cache. Without it every point
prefills bs x context tokens four times (warm-up, two 1-token, one N-token request): at 16k x bs
32 that is 2.1M prefill tokens per point and engine. The per-replay GPU times are the same replays
either way (the verify reads the same prefix from the KV pool); the e2e figure then is pure
decode time per step. The pool must hold the largest point (bs x (context + tokens)); raise
``--mem`` for 16k x bs 32 on llama-8b (~0.8).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # verify_probe (also in the spawned scheduler process), capture_log
import baseline  # noqa: E402
from capture_log import format_capture, target_capture  # noqa: E402
PROBE_ENV = "BENCH_VERIFY_PROBE"
PLUGIN_ENV = "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
PROFILE_ENV = "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"
MODES = ("plain", "upstream", "ours", "ours_profile")


if __name__ == "__mp_main__" and os.environ.get(PROBE_ENV) == "1":  # scheduler process (spawn)
    try:
        import verify_probe

        verify_probe.install_probe()
    except Exception as _ex:  # keep the engine running without the probe
        print(f"PROBE install failed: {_ex!r}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- child: one mode, one engine
def model_paths(a):
    d = os.path.abspath(a.models_dir)
    if not os.path.isfile(os.path.join(d, a.model, "config.json")):
        subprocess.run([sys.executable, "-m", "bench.models.dummy_models", d, "--only", a.model],
                       check=True)
    return os.path.join(d, a.model), os.path.join(d, a.model + "-eagle3")


def bench_prompts(ctx: int, bs: int, vocab: int, shared: bool) -> list:
    """``bs`` prompts of ``ctx`` random token ids in ``[10, vocab - 1)``.

    ``shared`` (``--prefix-cache``): prompt ``i`` depends on ``(ctx, i)`` only, so a larger batch
    at the same context starts with the smaller batch's prompts (radix-cache hits); otherwise the
    batch is drawn from one seed per ``(ctx, bs)``."""
    if shared:
        return [_prompt(random.Random(1000003 * ctx + i), ctx, vocab) for i in range(bs)]
    rng = random.Random(1000 * ctx + bs)
    return [_prompt(rng, ctx, vocab) for _ in range(bs)]


def _prompt(rng, ctx: int, vocab: int) -> list:
    return [rng.randrange(10, vocab - 1) for _ in range(ctx)]


def target_config(a) -> dict:
    """The target's ``config.json``; a multimodal wrapper's text fields come from ``text_config``
    (with ``"wrapper": True``)."""
    with open(os.path.join(model_paths(a)[0], "config.json")) as f:
        cfg = json.load(f)
    return dict(cfg["text_config"], wrapper=True) if "text_config" in cfg else cfg


def engine_kwargs(a, mode: str) -> dict:
    target, draft = model_paths(a)
    cfg = target_config(a)
    max_pos = cfg["max_position_embeddings"]
    need = max(a.contexts) + a.new_tokens + a.warmup_tokens + 2 * (a.steps + 1) + 64
    capture = dict(cuda_graph_bs_decode=a.cuda_graph_bs) if a.cuda_graph_bs else {}
    kw = dict(model_path=target, load_format="dummy", attention_backend=a.attention_backend,
              sampling_backend="pytorch", mem_fraction_static=a.mem,
              cuda_graph_max_bs_decode=max(a.cuda_graph_bs) if a.cuda_graph_bs else max(8, max(a.batch_sizes)),
              **capture, cuda_graph_backend_prefill="disabled", disable_radix_cache=not a.prefix_cache,
              skip_tokenizer_init=True,
              grammar_backend="none", log_level=a.log_level, random_seed=0,
              context_length=min(max_pos, -(-need // 256) * 256))
    if cfg.get("wrapper"):  # e.g. KimiK25ForConditionalGeneration: the text model alone (no HF processor)
        kw["enable_multimodal"] = False
    if a.moe_runner_backend:
        kw["moe_runner_backend"] = a.moe_runner_backend
    if mode != "plain":
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_eagle_topk=1,
                  speculative_num_steps=a.steps, speculative_num_draft_tokens=a.steps + 1)
        if a.draft_attention_backend:
            kw["speculative_draft_attention_backend"] = a.draft_attention_backend
    kw.update(json.loads(a.engine_extra))
    return kw


def _state(eng) -> dict:
    st = eng.get_server_info()["internal_states"][0]
    return {"probe": st.get("bench_probe", {}), "plugin": st.get("verify_cuda_graph")}


def start_engine(kw: dict, res: dict, mode: str, plugin: bool, profile_every: int = 0):
    """``sglang.Engine(**kw)`` for one mode's child process, with the per-replay probe on, the
    plugin's flag set only when ``plugin`` and its profile every ``profile_every`` cycles (0: off);
    ``mode``, ``engine_kwargs``, ``startup_s`` (s), an empty ``phases`` and ``plugin_before``
    (the plugin's counters, None without it) go into ``res``. Returns the engine."""
    os.environ[PROBE_ENV] = "1"
    os.environ.pop(PLUGIN_ENV, None)
    os.environ.pop(PROFILE_ENV, None)
    if plugin:
        os.environ[PLUGIN_ENV] = "1"
    if profile_every:
        os.environ[PROFILE_ENV] = str(profile_every)
    print("BENCH engine_kwargs " + json.dumps(kw), flush=True)
    from sglang.srt.entrypoints.engine import Engine

    t0 = time.perf_counter()
    eng = Engine(**kw)
    res.update(mode=mode, engine_kwargs=kw, startup_s=round(time.perf_counter() - t0, 1), phases=[])
    print(f"BENCH startup {res['startup_s']}s", flush=True)
    res["plugin_before"] = _state(eng)["plugin"]
    return eng


def e2e_ms_per_step(tn_s: float, t1_s: float, steps: int) -> float | None:
    """Wall ms per decode step, ``1000 * (tn_s - t1_s) / steps``: the N-token generation's wall
    (s) less the 1-token one's (s, the faster of two) over its verify (or decode) steps; ``None``
    when ``tn_s <= t1_s`` (the 1-token wall held a one-off: no figure rather than a negative one)."""
    if tn_s <= t1_s:
        return None
    return round(1000 * (tn_s - t1_s) / max(steps, 1), 4)


def run_child(a, res: dict) -> None:
    """Run one mode in one Engine; fills ``res`` as it goes (so a crash keeps the finished phases)."""
    import verify_probe

    kw = engine_kwargs(a, a.child)
    eng = start_engine(kw, res, a.child, plugin=a.child in ("ours", "ours_profile"),
                       profile_every=a.profile_every if a.child == "ours_profile" else 0)
    vocab = target_config(a)["vocab_size"]
    sp = lambda n: {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}  # noqa: E731
    try:
        for ctx in ([] if a.capture_only else a.contexts):  # capture only: start, record, stop
            for bs in a.batch_sizes:
                prompts = bench_prompts(ctx, bs, vocab, a.prefix_cache)
                eng.generate(input_ids=prompts, sampling_params=sp(a.warmup_tokens))
                _state(eng)
                t1s = []
                for _ in range(2):  # the first 1-token request of a point can carry one-off host work
                    t = time.perf_counter()
                    eng.generate(input_ids=prompts, sampling_params=sp(1))
                    t1s.append(time.perf_counter() - t)
                t1 = min(t1s)
                t = time.perf_counter()
                outs = eng.generate(input_ids=prompts, sampling_params=sp(a.new_tokens))
                tn = time.perf_counter() - t
                st = _state(eng)
                outs = outs if isinstance(outs, list) else [outs]
                metas = [o["meta_info"] for o in outs]
                vct = [m.get("spec_verify_ct") or 0 for m in metas]
                steps = max(vct) if any(vct) else a.new_tokens - 1
                ph = {"context": ctx, "bs": bs, "t1_s": round(t1, 4), "tn_s": round(tn, 4), "steps": steps,
                      "e2e_ms_per_step": e2e_ms_per_step(tn, t1, steps),
                      "completion_tokens": [m.get("completion_tokens") for m in metas],
                      "accept_len": [m.get("spec_accept_length") for m in metas], "spec_verify_ct": vct}
                ph.update(verify_probe.summarize_probe(st["probe"], bs))
                res["phases"].append(ph)
                print("BENCH phase " + json.dumps(ph), flush=True)
        res["plugin_after"] = _state(eng)["plugin"]
        res["ok"] = True
    finally:
        eng.shutdown()


# ----------------------------------------------------------------- parent: modes, table, JSON
def _versions() -> dict:
    from importlib import metadata

    out = {}
    for p in ("torch", "sglang", "triton", "sglang-kernel", "flashinfer-python", "transformers", "sglang-verify-graph"):
        try:
            out[p] = metadata.version(p)
        except Exception:
            out[p] = None
    out["python"] = sys.version.split()[0]
    return out


def _hardware() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or "?"
    except Exception as ex:
        return f"nvidia-smi unavailable: {ex}"


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


def _mode_status(res) -> str:
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


def run_logged(cmd: list, log: str, timeout: float, child: dict):
    """Run one engine subprocess with stdout+stderr to ``log``; ``child["p"]`` holds it meanwhile
    (for a SIGTERM handler to kill). Returns its exit code, or ``"timeout"`` after ``timeout`` s
    (its process tree killed)."""
    with open(log, "w") as lf:
        child["p"] = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
        try:
            rc = child["p"].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(child["p"])
            rc = "timeout"
    child["p"] = None
    return rc


def _kill_tree(p) -> None:
    """SIGKILL a child and all its descendants (the Engine's scheduler/detokenizer processes), by pid."""
    try:
        import psutil

        procs = psutil.Process(p.pid).children(recursive=True)
    except Exception:
        procs = []
    for q in procs:
        try:
            q.kill()
        except Exception:
            pass
    if p.poll() is None:
        p.kill()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def run_parent(a) -> int:
    t_start = time.time()
    log_dir = a.log_dir or os.path.join(os.path.dirname(os.path.abspath(a.out)), "bench_logs")
    os.makedirs(log_dir, exist_ok=True)
    model_paths(a)
    modes, child = {}, {"p": None}
    meta = {"model": a.model, "hardware": _hardware(), "versions": _versions(), "mode_status": {},
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

    def on_term(signum, frame):
        if child["p"] is not None:
            _kill_tree(child["p"])
        meta["mode_status"].setdefault("interrupted", f"signal {signum}")
        sys.exit(finish(124))

    signal.signal(signal.SIGTERM, on_term)
    runs = [(mode, k, mode_key(a, mode, k)) for k in a.steps_list for mode in a.modes
            if mode != "plain" or k == a.steps_list[0]]
    if a.plain_twice:  # the same baseline again, last (baseline.py)
        runs.append(("plain", a.steps_list[0], "plain_end"))
    for mode, k, key in runs:
        jf, log = os.path.join(log_dir, f"bench_{key}.json"), os.path.join(log_dir, f"bench_{key}.log")
        if os.path.exists(jf):
            os.remove(jf)
        cmd = ([sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
               + ["--steps", str(k), "--child", mode, "--child-out", jf])
        t0 = time.time()
        rc = run_logged(cmd, log, a.mode_timeout, child)
        res = json.load(open(jf)) if os.path.exists(jf) else {"mode": mode, "ok": False}
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
        meta["mode_status"][key] = _mode_status(res) + f" ({time.time() - t0:.0f}s)"
        print(f"BENCH mode {key}: {meta['mode_status'][key]}", flush=True)
        finish(0, show=False)  # partial results on disk after every mode
    bad = replay_failures(modes) if a.require_replays else []
    for b in bad:
        meta["mode_status"].setdefault("require_replays", "FAILED")
        print(f"BENCH require-replays FAILED: {b}", flush=True)
    if a.require_replays and not bad:
        print("BENCH require-replays ok: every ours engine replayed every verify step, no fallback", flush=True)
    return finish(0 if all(m.get("ok") for m in modes.values()) and not bad else 1)


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
    inputs = first.get("inputs") or [_mode_status(first)]
    return dict(first, phases=first["phases"] + later["phases"], ok=bool(first.get("ok") and later.get("ok")),
                partial=bool(first.get("partial") or later.get("partial")), inputs=inputs + [_mode_status(later)])


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
            raise MergeError(f"--merge {path}: not a bench_verify.py --out file ({type(ex).__name__}); "
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
            modes[key] = dict(have, ok=False, inputs=(have.get("inputs") or [_mode_status(have)]) + [_mode_status(res)])
    elif have.get("phases"):  # the same mode again: other points of it
        modes[key] = _join_mode(have, res, key, base)
    elif res.get("from_log") and have.get("error"):  # a failed JSON mode, filled from its log
        modes[key] = dict(res, error=have["error"], from_log=False)
    else:  # a failed mode with no points, then a run of it that has them
        modes[key] = dict(res, ok=False, inputs=[_mode_status(have), _mode_status(res)])


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
        meta["mode_status"][key] = _mode_status(res)
    return a, modes, meta


def run_merge(a) -> int:
    """``--merge``: write ``--out`` and print the table from earlier runs; 2 with one line on bad input."""
    try:
        if any(os.path.realpath(p) == os.path.realpath(a.out) for p in a.merge):
            raise MergeError(f"--merge: --out {a.out} is one of the inputs; give --out another file")
        ma, modes, meta = merge_runs(a.merge)
    except MergeError as ex:
        print(f"bench_verify.py: {ex}", file=sys.stderr)
        return 2
    rows = build_rows(ma, modes)
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "modes": modes}, f, indent=1)
    print(format_table(rows, meta), flush=True)
    print(f"RESULT merged {len(a.merge)} inputs into {a.out}", flush=True)
    return 0


def profile_lines(log_path: str) -> list:
    """The ``verify_graph_profile`` lines of a mode log as ``key=value`` dicts (str values), each
    with ``span_per_cycle_ms`` (device span / cycles) and ``phase_sum_vs_span`` (cycle_mean_ms,
    i.e. the four phases' sum, over it: 1.0 when the cycles fill the GPU timeline)."""
    out = []
    with open(log_path, errors="replace") as f:
        for line in f:
            if "verify_graph_profile " not in line or "cycles=" not in line:
                continue
            words = line[line.index("verify_graph_profile "):].split()[1:]
            p = dict(w.split("=", 1) for w in words if "=" in w)
            try:
                span = 1000.0 * float(p["tokens"]) / float(p["tok_s"]) / float(p["cycles"])
                p["span_per_cycle_ms"] = round(span, 4)
                p["phase_sum_vs_span"] = round(float(p["cycle_mean_ms"]) / span, 4)
            except (KeyError, ValueError, ZeroDivisionError):
                p["span_per_cycle_ms"] = p["phase_sum_vs_span"] = None
            out.append(p)
    return out


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in str(s).split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-8b", choices=["llama-8b", "llama-small", "kimi-small", "kimi-small-mla",
                                                            "kimi-k25-shard", "kimi-k25-shard-wrapped"])
    ap.add_argument("--models-dir", default=os.environ.get("MODELS_DIR", "/tmp/models"),
                    help="folder of python -m bench.models.dummy_models output (made if missing)")
    ap.add_argument("--contexts", type=ints, default=[1024, 8192], help="prompt lengths in tokens, comma list")
    ap.add_argument("--batch-sizes", type=ints, default=[1, 8], help="comma list")
    ap.add_argument("--new-tokens", type=int, default=64, help="generated tokens per measured request")
    ap.add_argument("--warmup-tokens", type=int, default=4)
    ap.add_argument("--steps", type=ints, default=[2],
                    help="EAGLE-3 draft steps S (S+1 draft tokens); a comma list sweeps num_steps "
                         "(one engine per mode and S; plain decode once)")
    ap.add_argument("--modes", default="ours,upstream,plain", type=lambda s: [m for m in s.split(",") if m],
                    help="comma list of " + ", ".join(MODES))
    ap.add_argument("--profile-every", type=int, default=20, help="ours_profile: cycles per profile line")
    ap.add_argument("--attention-backend", default="triton")
    ap.add_argument("--draft-attention-backend", default=None,
                    help="--speculative-draft-attention-backend (the Llama-style draft on flashmla needs triton)")
    ap.add_argument("--mem", type=float, default=0.6, help="mem_fraction_static")
    ap.add_argument("--prefix-cache", action="store_true",
                    help="radix cache on, prompts shared across batch sizes: each context prefilled once (sweep)")
    ap.add_argument("--capture-only", action="store_true",
                    help="start each engine and shut it down, no phase (its capture line is the result; "
                         "bench/capture.py)")
    ap.add_argument("--plain-twice", action="store_true",
                    help="start a second plain engine last (plain_end): decode = the lower median per point, "
                         "points whose two medians differ by > 5%% listed (bench/lib/baseline.py)")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--engine-extra", default="{}", help="JSON dict of extra Engine/ServerArgs kwargs (applied last)")
    ap.add_argument("--moe-runner-backend", default=None,
                    help="--moe-runner-backend of every engine (e.g. triton: CompressedTensorsWNA16TritonMoE on the "
                         "INT4 shard); unset: SGLang's default (auto; Marlin WNA16 there)")
    ap.add_argument("--cuda-graph-bs", type=ints, default=None,
                    help="decode CUDA-graph batch sizes to capture (cuda_graph_bs_decode, comma list; its max is "
                         "the max bs); unset: every default bucket up to max(8, max batch size)")
    ap.add_argument("--require-replays", action="store_true",
                    help="exit 1 unless every ours engine served every verify step from VerifyCudaGraphRunner "
                         "(replays == verify_steps > 0, no fallback)")
    ap.add_argument("--mode-timeout", type=float, default=300, help="seconds per mode subprocess")
    ap.add_argument("--out", default="results.json")
    ap.add_argument("--log-dir", default=None, help="child logs + JSON (default: <out dir>/bench_logs)")
    ap.add_argument("--quick", action="store_true", help="smoke: llama-small, context 1024, bs 1, 32 tokens")
    ap.add_argument("--dry-run", action="store_true", help="print the Engine kwargs per mode (makes models) and exit")
    ap.add_argument("--merge", nargs="+", metavar="FILE",
                    help="run nothing: one table and --out from earlier runs' --out JSON files and mode logs "
                         "(bench_<mode>.log, for a mode killed before it wrote its JSON)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.quick:
        a.model, a.contexts, a.batch_sizes, a.new_tokens = "llama-small", [1024], [1], 32
    bad = [m for m in a.modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}")
    if a.plain_twice and "plain" not in a.modes:
        ap.error("--plain-twice needs plain in --modes")
    if a.plain_twice and a.capture_only:
        ap.error("--plain-twice times the decode baseline; --capture-only runs no decode: drop one")
    a.contexts, a.batch_sizes = sorted(a.contexts), sorted(a.batch_sizes)
    if a.cuda_graph_bs:
        a.cuda_graph_bs = sorted(set(a.cuda_graph_bs))
        if max(a.batch_sizes) > max(a.cuda_graph_bs):
            ap.error(f"--cuda-graph-bs {a.cuda_graph_bs} has no bucket for bs {max(a.batch_sizes)}: "
                     "the verify step would run eager")
    if not a.steps or min(a.steps) < 1:
        ap.error("--steps needs integers >= 1")
    a.steps_list = list(dict.fromkeys(a.steps))  # the sweep (order kept, duplicates dropped)
    a.steps = a.steps_list[-1]  # a child gets one value (--steps N appended last)
    return a


def child_main(a, run, json_default=None) -> int:
    """One mode's engine subprocess: ``run(a, res)`` fills ``res`` (``{"mode", "ok", "phases"}``
    to start); ``res`` is written to ``a.child_out`` (JSON, ``json_default`` for what json cannot
    encode) whatever happens, an exception's type and message in ``res["error"]`` (its traceback
    on stderr). Returns 0 when ``res["ok"]``, else 1."""
    res = {"mode": a.child, "ok": False, "phases": []}
    try:
        run(a, res)
    except BaseException as ex:
        import traceback

        res["error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
        traceback.print_exc()
    finally:
        with open(a.child_out, "w") as f:
            json.dump(res, f, indent=1, default=json_default)
    return 0 if res.get("ok") else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge:
        return run_merge(a)
    if a.dry_run:
        if not a.child:  # the engines run_parent would start, in order
            runs = [mode_key(a, m, k) for k in a.steps_list for m in a.modes if m != "plain" or k == a.steps_list[0]]
            print("BENCH plan: " + ", ".join(runs + (["plain_end"] if a.plain_twice else [])), flush=True)
        for m in ([a.child] if a.child else a.modes):
            print(f"DRYRUN {m}: " + json.dumps(engine_kwargs(a, m)))
        if a.plain_twice and not a.child:
            print("DRYRUN plain_end: " + json.dumps(engine_kwargs(a, "plain")))
        return 0
    if a.child:
        return child_main(a, run_child)
    return run_parent(a)


if __name__ == "__main__":
    sys.exit(main())
