"""One command on a GPU machine: plain decoding, upstream EAGLE-3 and ``--enable-verify-cuda-graph``.

    python -m bench demo [--model llama-8b] [--context 1024] [--new-tokens 64]
        [--concurrency 8] [--repeats 3] [--workdir DIR] [--out FILE] [--dry-run]

What it does, in order:

1. writes config-only model folders (random weights, ``--load-format dummy``;
   :mod:`bench.models.dummy_models`) for the target and its EAGLE-3 draft into
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
import). Run time: three server starts plus about 10 s of requests per server (a few minutes
with the default llama-8b; ``docs/gpu_testing.md``).

Modules: ``bench.demo.report`` (constants, step-time arithmetic, checks, the table),
``bench.demo.measure`` (the requests), ``bench.lib.server`` (server start/stop with progress),
this one (arguments, command lines, ``main``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Dict, List, Optional, Sequence

from bench.models import dummy_models
from bench.demo.report import (
    DEFAULT_WORKDIR,
    DESCRIPTION,
    DemoError,
    FLAG,
    NUM_DRAFT_TOKENS,
    NUM_STEPS,
    PROFILE_FLAG,
    RUN_ORDER,
    SERVABLE_MODELS,
    SPECULATIVE,
    build_report,
    print_report,
)
from bench.demo.measure import measure_server
from bench.lib.server import ServerStartError, free_port, start_server, stop_server

# ----------------------------------------------------------------------------- arguments

def _int_at_least(low: int, high: Optional[int] = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text!r} must be >= {low}" + (f" and <= {high}" if high is not None else ""))
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Start the stock SGLang server three times on a dummy-weight model - upstream "
            "EAGLE-3 (top-k 1, 3 steps, triton), the same with --enable-verify-cuda-graph, and "
            "plain decoding - send the same greedy requests to each through /generate, and print "
            "one table: client ms per decode step at concurrency 1, verify device ms (per-phase "
            "profile), tokens/s at concurrency 1 and --concurrency, accept length; plus the "
            "verify-graph counters. Exits 1 if ours did not replay every verify step or the "
            "greedy outputs differ. Needs one CUDA GPU and sglang 0.5.16-0.5.23 with this "
            "plugin installed (except --dry-run). Takes a few minutes."),
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
    ap.add_argument("--port", type=_int_at_least(0, 65535), default=0,
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
        f"bench.demo.cli: plain decoding vs upstream EAGLE-3 vs {FLAG}, "
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




def run_mode(mode: str, a: argparse.Namespace, env: dict) -> tuple:
    """Start, measure and stop one server; returns ``(command, results)``."""
    port = a.port or free_port()
    cmd = server_command(mode, a, port)
    log_path = os.path.join(a.workdir, f"server_{mode}.log")
    print(f"[{mode}] {DESCRIPTION[mode]}; log {log_path}", flush=True)
    try:
        proc, startup_s = start_server(mode, cmd, env, f"http://127.0.0.1:{port}", log_path,
                                       a.start_timeout, timeout_flag="--start-timeout")
    except ServerStartError as ex:
        raise DemoError(str(ex)) from None
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
