"""One command on a GPU machine: plain decoding, upstream EAGLE-3 and ``--enable-verify-cuda-graph``.

    python -m sglang_verify_graph.demo [--model llama-8b] [--context 1024] [--new-tokens 64]
        [--concurrency 8] [--repeats 3] [--workdir DIR] [--out FILE] [--dry-run]

What it does, in order:

1. writes config-only model folders (random weights, ``--load-format dummy``;
   :mod:`sglang_verify_graph.dummy_models`) for the target and its EAGLE-3 draft into
   ``WORKDIR/models``;
2. starts the stock ``python -m sglang.launch_server`` three times, one after another (each is
   stopped before the next starts), with the same target, flags and seed:

   * ``upstream``: EAGLE-3, top-k 1, 3 draft steps, 4 draft tokens, ``--attention-backend
     triton``: SGLang's own TARGET_VERIFY CUDA graph;
   * ``ours``: the same plus ``--enable-verify-cuda-graph``;
   * ``plain``: no speculation (the target's decode graph).

   ``upstream`` runs first: it is stock SGLang, so if it cannot start the problem lies in the
   environment, not in this plugin, and that is reported before time goes to the other two;
   ``ours`` follows right after it so the two speculative servers run back to back.
   Both speculative servers get ``--verify-graph-profile-every N`` (the plugin's per-phase
   profile, which works with and without the flag);
3. on each server, through ``/generate``: a prompt of ``--context`` random token ids; greedy,
   ``ignore_eos``; at concurrency 1 a warm-up, then ``--repeats`` x (a 1-token request and a
   ``--new-tokens`` request of the same prompt); at concurrency ``--concurrency``, as many
   concurrent ``--new-tokens`` requests (distinct prompts), ``--repeats`` times after a warm-up;
4. measures, the same way for all three: the time per decode step at concurrency 1 from the
   client, ``(t_N - t_1) / steps`` (``steps`` = N - 1 for plain, the request's
   ``spec_verify_ct`` for the speculative modes, i.e. one draft + verify + draft-extend cycle),
   output tokens/s at both concurrencies, and for the speculative modes the device time of the
   verify phase from the profile lines in the server log; for ``ours`` also the verify-graph
   counters of ``/get_server_info``;
5. prints the counters and one table, writes the same as JSON to ``--out``, and exits 1 with one
   ``error:`` line if ``ours`` did not replay every verify step (a fallback or no replays) or if
   the greedy output ids of the concurrency-1 request differ between the three servers.

With dummy weights the draft almost never guesses the target's token (accept length ~1.0), so
the table shows what one speculation cycle costs against a plain decode step, not a speed-up.

``--dry-run`` prints the plan and the three server command lines and exits (no GPU, no SGLang
import). Run time on one H200 with the default llama-8b: 311 s on a cold kernel cache (server
starts of 137 s for the first, which compiles the Triton kernels, then 64 s and 77 s; ~10 s of
requests per server); less with warm caches.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence

from sglang_verify_graph import dummy_models

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


# ----------------------------------------------------------------------------- arguments

def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {low}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sglang_verify_graph.demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start the stock SGLang server three times on a dummy-weight model - upstream "
            "EAGLE-3 (top-k 1, 3 steps, triton), the same with --enable-verify-cuda-graph, and "
            "plain decoding - send the same greedy requests to each through /generate, and print "
            "one table: client ms per decode step at concurrency 1, verify device ms (per-phase "
            "profile), tokens/s at concurrency 1 and --concurrency, accept length; plus the "
            "verify-graph counters. Exits 1 if ours did not replay every verify step or the "
            "greedy outputs differ. Needs one CUDA GPU and sglang 0.5.16 with this plugin "
            "installed (except --dry-run). Takes a few minutes."),
        epilog=("Dummy weights accept almost no draft token, so the table shows the cost of a "
                "speculation cycle against a plain decode step, not a speed-up."))
    ap.add_argument("--model", default="llama-8b", metavar="NAME",
                    help=f"dummy-weight target (+ its EAGLE-3 draft): {', '.join(SERVABLE_MODELS)} "
                         "(default llama-8b: the Llama-3.1-8B shape; kimi-*: a Kimi-K2-shaped "
                         "MLA + MoE target, one TP-8 shard's widths)")
    ap.add_argument("--workdir", default=DEFAULT_WORKDIR,
                    help=f"folder for the models, server logs and results (default {DEFAULT_WORKDIR})")
    ap.add_argument("--out", default=None,
                    help="results JSON (default WORKDIR/demo_results.json)")
    ap.add_argument("--context", type=_int_at_least(1), default=1024,
                    help="prompt length in tokens (random token ids; default 1024)")
    ap.add_argument("--new-tokens", type=_int_at_least(2), default=64,
                    help="generated tokens per measured request (default 64)")
    ap.add_argument("--concurrency", type=_int_at_least(1), default=8,
                    help="concurrent requests of the second load level (default 8)")
    ap.add_argument("--repeats", type=_int_at_least(1), default=3,
                    help="measured rounds per load level; medians are reported (default 3)")
    ap.add_argument("--profile-every", type=_int_at_least(1), default=8,
                    help=f"{PROFILE_FLAG} of the speculative servers: EAGLE cycles per profile "
                         "log line (default 8)")
    ap.add_argument("--start-timeout", type=float, default=600.0,
                    help="seconds each server may take to become healthy (default 600)")
    ap.add_argument("--request-timeout", type=float, default=300.0,
                    help="seconds per HTTP request (default 300)")
    ap.add_argument("--port", type=_int_at_least(0), default=0,
                    help="server port (default 0: a free port for each start)")
    ap.add_argument("--server-args", default="",
                    help="extra flags for all three servers, one quoted string, e.g. "
                         "\"--mem-fraction-static 0.6\" (appended last)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan and the three server command lines; start nothing")
    return ap


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parsed and checked options; bad input ends with one usage line naming the flag (exit 2)."""
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.model not in SERVABLE_MODELS:
        why = (" (its multimodal architecture makes the stock server load a remote-code processor "
               "a config-only folder lacks; it runs through sglang.Engine in test/gpu)"
               if a.model in dummy_models.MODELS else "")
        ap.error(f"--model {a.model}: not servable here{why}; choose one of "
                 f"{', '.join(SERVABLE_MODELS)}")
    if not a.start_timeout > 0:
        ap.error(f"--start-timeout {a.start_timeout}: must be > 0 seconds")
    if not a.request_timeout > 0:
        ap.error(f"--request-timeout {a.request_timeout}: must be > 0 seconds")
    try:
        a.extra_server_args = shlex.split(a.server_args)
    except ValueError as ex:
        ap.error(f"--server-args {a.server_args!r}: {ex}; quote it as one shell word")
    target, _ = dummy_models.MODELS[a.model]()
    max_pos = dummy_models.text_config(target)["max_position_embeddings"]
    if a.context + a.new_tokens + 2 * NUM_DRAFT_TOKENS > max_pos:
        ap.error(f"--context {a.context} + --new-tokens {a.new_tokens}: the {a.model} target holds "
                 f"{max_pos} positions; pass a --context of at most "
                 f"{max_pos - a.new_tokens - 2 * NUM_DRAFT_TOKENS}")
    a.max_position_embeddings = max_pos
    a.vocab_size = dummy_models.text_config(target)["vocab_size"]
    a.workdir = os.path.abspath(a.workdir)
    a.out = os.path.abspath(a.out or os.path.join(a.workdir, "demo_results.json"))
    return a


# ----------------------------------------------------------------------------- commands

def model_paths(workdir: str, model: str) -> tuple:
    """``(target_dir, draft_dir)`` under ``WORKDIR/models``."""
    root = os.path.join(workdir, "models")
    return os.path.join(root, model), os.path.join(root, model + "-eagle3")


def context_length(context: int, new_tokens: int, max_pos: int) -> int:
    """``--context-length`` of the servers (tokens): prompt + output + two draft chains of
    headroom, rounded up to 256, at most the model's ``max_position_embeddings``."""
    need = context + new_tokens + 2 * NUM_DRAFT_TOKENS + 64
    return min(max_pos, -(-need // 256) * 256)


def server_command(mode: str, a: argparse.Namespace, port: int) -> List[str]:
    """The ``python -m sglang.launch_server`` argv of one mode (``plain``, ``upstream``, ``ours``).

    All three share the target, attention backend, seed and server flags; the speculative two
    add the same EAGLE-3 flags and the profile interval; only ``ours`` adds
    ``--enable-verify-cuda-graph``. ``--server-args`` come last (argparse: the last value wins)."""
    if mode not in RUN_ORDER:
        raise ValueError(f"unknown mode {mode!r}; modes are {', '.join(RUN_ORDER)}")
    target, draft = model_paths(a.workdir, a.model)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", target,
           "--host", "127.0.0.1", "--port", str(port),
           "--load-format", "dummy", "--random-seed", "0", "--skip-tokenizer-init",
           "--attention-backend", "triton", "--sampling-backend", "pytorch",
           "--grammar-backend", "none", "--cuda-graph-backend-prefill", "disabled",
           "--cuda-graph-max-bs-decode", str(max(8, a.concurrency)),
           "--context-length", str(context_length(a.context, a.new_tokens,
                                                  a.max_position_embeddings))]
    if mode in SPECULATIVE:
        cmd += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
                "--speculative-eagle-topk", "1", "--speculative-num-steps", str(NUM_STEPS),
                "--speculative-num-draft-tokens", str(NUM_DRAFT_TOKENS),
                PROFILE_FLAG, str(a.profile_every)]
    if mode == "ours":
        cmd.append(FLAG)
    return cmd + list(a.extra_server_args)


def server_env(base: Optional[Dict[str, str]] = None) -> tuple:
    """``(env, dropped)``: the environment for the servers without this plugin's variables
    (``SGLANG_ENABLE_VERIFY_CUDA_GRAPH``, ``SGLANG_VERIFY_GRAPH_*``), so that the command line
    alone decides what each server runs; ``dropped`` lists the names removed."""
    base = dict(os.environ if base is None else base)
    dropped = sorted(k for k in base if k == "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
                     or k.startswith("SGLANG_VERIFY_GRAPH_"))
    for k in dropped:
        del base[k]
    return base, dropped


def plan_lines(a: argparse.Namespace) -> List[str]:
    """What the demo will do, as printed before it starts (and by ``--dry-run``)."""
    target, draft = model_paths(a.workdir, a.model)
    c = a.concurrency
    lines = [
        f"sglang_verify_graph.demo: plain decoding vs upstream EAGLE-3 vs {FLAG}, "
        f"dummy-weight {a.model}",
        f"work dir {a.workdir}: models in models/, server logs server_<mode>.log, "
        f"results {a.out}",
        f"1. write {target} and {draft} (config-only; --load-format dummy: random weights)",
        "2. start each server in turn (each stopped before the next):",
    ]
    for i, mode in enumerate(RUN_ORDER):
        lines.append(f"   {chr(ord('a') + i)}. {mode:<8} {DESCRIPTION[mode]}")
    lines += [
        f"3. per server: prompts of {a.context} random token ids, greedy, ignore_eos; "
        f"c=1: warm-up, then {a.repeats} x (1-token + {a.new_tokens}-token request); "
        f"c={c}: warm-up, then {a.repeats} x {c} concurrent {a.new_tokens}-token requests",
        f"4. step ms (c=1) = (t_{a.new_tokens} - t_1) / steps (plain: {a.new_tokens - 1}; "
        "speculative: spec_verify_ct); verify ms = device median of the verify phase "
        f"({PROFILE_FLAG} {a.profile_every}, lines at bs 1); counters of ours from /get_server_info",
        "5. fail (exit 1) if ours fell back on any verify step, or if the c=1 greedy output ids "
        "differ between the servers",
    ]
    return lines


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
    (``bs=`` is the window's mean batch size, so a window across two load levels is left out),
    parsed by :func:`sglang_verify_graph.advisor_inputs.parse_profile_log`: ``verify_ms``,
    ``draft_ms``, ``draft_extend_ms``, ``other_ms`` (device ms per cycle, whole batch),
    ``cycle_ms`` (device ms; median of the lines' own field), ``accept_length``, ``lines``.
    ``None`` when no line ran at ``bs``."""
    from sglang_verify_graph.advisor_inputs import parse_profile_log

    picked = [ln for ln in lines if _field(ln, "bs") is not None and float(_field(ln, "bs")) == bs]
    if not picked:
        return None
    summary = parse_profile_log(picked)
    steps = summary.main_steps()
    out = {k: summary.value(k, steps) for k in ("verify_ms", "draft_ms", "draft_extend_ms",
                                                 "other_ms", "accept_length")}
    out["cycle_ms"] = median(float(_field(ln, "cycle_ms")) for ln in picked
                             if _field(ln, "cycle_ms") is not None)
    out["lines"] = summary.lines
    return out


def _field(line: str, key: str) -> Optional[str]:
    """Value of ``key=value`` in a profile log line (after its tag), or ``None``."""
    words = line.split()
    if PROFILE_TAG not in words:
        return None
    for w in words[words.index(PROFILE_TAG) + 1:]:
        if w.startswith(key + "="):
            return w[len(key) + 1:]
    return None


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


# ----------------------------------------------------------------------------- servers

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_NOISE = ("warnings.warn(", "UserWarning", "FutureWarning", "DeprecationWarning")


def last_log_line(path: str, limit: int = 4096) -> str:
    """The last non-empty line of a log file that is not a Python warning's echo ("" when there
    is none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.replace("\r", "\n").split("\n")
             if ln.strip() and not any(n in ln for n in _NOISE)]
    return lines[-1] if lines else ""


class Progress:
    """Start-up progress: one updating line on a terminal, else a line every ``every_s``."""

    def __init__(self, label: str, log_path: str, every_s: float = 5.0, stream=None):
        self.label, self.log_path, self.every_s = label, log_path, every_s
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last = -every_s
        self.width = 0

    def update(self, elapsed: float) -> None:
        if not self.tty and elapsed - self.last < self.every_s:
            return
        self.last = elapsed
        text = (f"  {self.label}: starting, {elapsed:4.0f} s | "
                f"{last_log_line(self.log_path) or '(log empty so far)'}")
        if self.tty:
            import shutil

            cols = shutil.get_terminal_size((120, 20)).columns - 1
            text = text[:cols]
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text[:200] + "\n")
        self.stream.flush()

    def done(self, message: str) -> None:
        if self.tty:
            self.stream.write("\r" + message.ljust(self.width) + "\n")
        else:
            self.stream.write(message + "\n")
        self.stream.flush()


def start_server(label: str, cmd: List[str], env: dict, base_url: str, log_path: str,
                 timeout_s: float):
    """Start one server with stdout+stderr to ``log_path``; returns ``(Popen, seconds to
    healthy)``. Polls ``/health_generate`` each second while showing progress. Raises
    :class:`DemoError` (one line with the log path) if it exits or is not healthy within
    ``timeout_s`` seconds (then it is stopped first)."""
    import subprocess

    import requests

    log = open(log_path, "w")
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        log.close()  # the child holds its own descriptor
    progress = Progress(label, log_path)
    t0 = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - t0
            rc = proc.poll()
            if rc is not None:
                progress.done(f"  {label}: exited")
                raise DemoError(f"the {label} server exited with code {rc} while starting "
                                f"(last log line: {last_log_line(log_path)[:200]!r}); "
                                f"log: {log_path}")
            if elapsed > timeout_s:
                progress.done(f"  {label}: not ready")
                raise DemoError(f"the {label} server was not healthy after {timeout_s:.0f} s "
                                f"(--start-timeout); log: {log_path}")
            try:
                if requests.get(f"{base_url}/health_generate", timeout=5).status_code == 200:
                    progress.done(f"  {label}: ready in {elapsed:.0f} s")
                    return proc, round(elapsed, 1)
            except requests.RequestException:
                pass
            progress.update(elapsed)
            time.sleep(1.0)
    except BaseException:
        stop_server(proc)
        raise


def stop_server(proc) -> None:
    """Stop a server and every process it started (SGLang's ``kill_process_tree``), and wait
    for them, so the GPU memory is free for the next one."""
    import subprocess

    try:
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(proc.pid, wait_timeout=60)
    except Exception as ex:  # fall back to the direct child at least
        print(f"  warning: kill_process_tree({proc.pid}) failed ({ex!r}); killing pid {proc.pid}",
              flush=True)
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# ----------------------------------------------------------------------------- requests

def prompts(context: int, count: int, vocab: int, seed: int = PROMPT_SEED) -> List[List[int]]:
    """``count`` prompts of ``context`` random token ids in ``[10, vocab - 1)`` (the same ones on
    every server)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 1) for _ in range(context)] for _ in range(count)]


def _generate(base_url: str, ids: List[int], new_tokens: int, timeout_s: float) -> tuple:
    """``(wall seconds, answer JSON)`` of one greedy ``/generate`` request."""
    import requests

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens,
                                                  "temperature": 0.0, "ignore_eos": True}}
    t = time.perf_counter()
    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout_s)
    wall = time.perf_counter() - t
    if r.status_code != 200:
        raise DemoError(f"/generate answered HTTP {r.status_code}: {r.text[:200]!r}")
    return wall, r.json()


def _concurrent(base_url: str, batch: List[List[int]], new_tokens: int, timeout_s: float) -> tuple:
    """``(wall seconds from the first send to the last answer, answers)`` of one request per
    prompt, all in flight at once."""
    from concurrent.futures import ThreadPoolExecutor

    t = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        answers = [w_out[1] for w_out in pool.map(
            lambda ids: _generate(base_url, ids, new_tokens, timeout_s), batch)]
    return time.perf_counter() - t, answers


def verify_graph_states(base_url: str) -> List[Optional[dict]]:
    """``internal_states[i]["verify_cuda_graph"]`` of every rank (``None`` entries without it)."""
    import requests

    info = requests.get(f"{base_url}/get_server_info", timeout=30).json()
    return [st.get("verify_cuda_graph") for st in info.get("internal_states") or []]


def measure_server(mode: str, base_url: str, a: argparse.Namespace, log_path: str) -> dict:
    """Requests against one running server (module docstring, step 3) and its numbers: times in
    seconds (``*_s``) and milliseconds (``*_ms``), throughput in output tokens per second."""
    c1_prompt, *batch = prompts(a.context, 1 + a.concurrency, a.vocab_size)
    t_out = a.request_timeout
    _generate(base_url, c1_prompt, a.new_tokens, t_out)  # warm-up: prefix cached, graphs warm
    rounds = []
    for _ in range(a.repeats):
        t1, _ = _generate(base_url, c1_prompt, 1, t_out)
        tn, ans = _generate(base_url, c1_prompt, a.new_tokens, t_out)
        meta = ans.get("meta_info", {})
        done = int(meta.get("completion_tokens") or len(ans.get("output_ids") or []))
        steps = decode_steps(mode, meta, done)
        rounds.append({"t1_s": round(t1, 4), "tn_s": round(tn, 4), "steps": steps,
                       "completion_tokens": done, "step_ms": step_ms(t1, tn, steps),
                       "tok_s": done / tn if tn > 0 else None,
                       "accept_length": meta.get("spec_accept_length"),
                       "output_ids": ans.get("output_ids")})
    print(f"  {mode}: c=1 step ms {_fmt([r['step_ms'] for r in rounds])}", flush=True)
    _concurrent(base_url, batch, 4, t_out)  # warm-up: prefixes cached
    rounds_n = []
    for _ in range(a.repeats):
        wall, answers = _concurrent(base_url, batch, a.new_tokens, t_out)
        done = sum(int(x.get("meta_info", {}).get("completion_tokens") or 0) for x in answers)
        rounds_n.append({"wall_s": round(wall, 4), "completion_tokens": done,
                         "tok_s": done / wall if wall > 0 else None})
    print(f"  {mode}: c={a.concurrency} tok/s {_fmt([r['tok_s'] for r in rounds_n], 1)}",
          flush=True)
    out = {"step_ms_c1": median(r["step_ms"] for r in rounds),
           "tok_s_c1": median(r["tok_s"] for r in rounds),
           "tok_s_cN": median(r["tok_s"] for r in rounds_n),
           "accept_length": median(r["accept_length"] for r in rounds),
           "output_ids_c1": rounds[0]["output_ids"],
           "rounds_c1": [{k: v for k, v in r.items() if k != "output_ids"} for r in rounds],
           "rounds_cN": rounds_n,
           "verify_cuda_graph": verify_graph_states(base_url)}
    same = all(r["output_ids"] == rounds[0]["output_ids"] for r in rounds)
    out["c1_outputs_repeatable"] = same
    if mode in SPECULATIVE:
        time.sleep(1.0)  # let the last profile line reach the log
        with open(log_path, errors="replace") as f:
            lines = [ln for ln in f if PROFILE_TAG in ln]
        out["profile_c1"] = profile_at_batch(lines, 1)
        out["profile_cN"] = profile_at_batch(lines, a.concurrency)
        out["profile_lines"] = len(lines)
        out["verify_ms_c1"] = (out["profile_c1"] or {}).get("verify_ms")
    return out


def _fmt(values, digits: int = 2) -> str:
    return " ".join("-" if v is None else f"{v:.{digits}f}" for v in values)


def run_mode(mode: str, a: argparse.Namespace, env: dict) -> tuple:
    """Start, measure and stop one server; returns ``(command, results)``."""
    port = a.port or _free_port()
    cmd = server_command(mode, a, port)
    log_path = os.path.join(a.workdir, f"server_{mode}.log")
    print(f"[{mode}] {DESCRIPTION[mode]}; log {log_path}", flush=True)
    proc, startup_s = start_server(mode, cmd, env, f"http://127.0.0.1:{port}", log_path,
                                   a.start_timeout)
    try:
        res = measure_server(mode, f"http://127.0.0.1:{port}", a, log_path)
    except DemoError as ex:
        raise DemoError(f"{mode}: {ex}; log: {log_path}")
    except Exception as ex:  # requests errors, a server dying mid-run
        raise DemoError(f"{mode}: requests failed ({type(ex).__name__}: {str(ex)[:200]}); "
                        f"log: {log_path}")
    finally:
        stop_server(proc)
    res.update(startup_s=startup_s, log=log_path)
    return cmd, res


def _plugin_installed() -> bool:
    from importlib import metadata

    try:
        eps = metadata.entry_points(group="sglang.srt.plugins")
    except TypeError:  # Python < 3.10
        eps = metadata.entry_points().get("sglang.srt.plugins", [])
    return any(e.value.startswith("sglang_verify_graph.") for e in eps)


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = parse_args(argv)
    for ln in plan_lines(a):
        print(ln)
    if a.dry_run:
        print("server command lines:")
        for mode in RUN_ORDER:
            print(f"  {mode}: {shlex.join(server_command(mode, a, a.port or 30000))}")
        print("(dry run: nothing started; port 0 picks a free port per server, shown as 30000)")
        return 0
    if not _plugin_installed():
        print("error: the sglang.srt.plugins entry point of sglang-verify-graph is not installed, "
              f"so the servers would reject {FLAG}; run `pip install -e .` in the repository",
              file=sys.stderr)
        return 1
    os.makedirs(a.workdir, exist_ok=True)
    env, dropped = server_env()
    if dropped:
        print(f"(not passed to the servers: {', '.join(dropped)}; the command lines decide)")
    target_cfg, draft_cfg = dummy_models.MODELS[a.model]()
    dummy_models.check_pair(a.model, target_cfg, draft_cfg)
    for sub, cfg in ((a.model, target_cfg), (f"{a.model}-eagle3", draft_cfg)):
        dummy_models.write_model(os.path.join(a.workdir, "models"), sub, cfg)
    print(f"wrote {' and '.join(model_paths(a.workdir, a.model))}", flush=True)
    t0 = time.monotonic()
    modes, commands = {}, {}
    try:
        for mode in RUN_ORDER:
            commands[mode], modes[mode] = run_mode(mode, a, env)
    except DemoError as ex:
        _write(a.out, {"error": str(ex), "modes": modes,
                       "commands": {m: shlex.join(c) for m, c in commands.items()}})
        print(f"error: {ex}", file=sys.stderr)
        return 1
    report = build_report(a, modes, commands)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    print()
    print_report(report)
    _write(a.out, report)
    print(f"wrote {a.out} ({report['wall_s']:.0f} s)")
    if report["failures"]:
        print(f"error: {report['failures'][0]}"
              + (f" (and {len(report['failures']) - 1} more in {a.out})"
                 if len(report["failures"]) > 1 else ""), file=sys.stderr)
        return 1
    return 0


def _write(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
