"""Measured EAGLE-3 speed-up at the Llama-3.1-8B shape with set accept lengths: plain / upstream / ours.

    python -m bench speedup [--pair-dir /tmp/models] [--modes plain,upstream,ours]
        [--contexts 1024,8192] [--batch-sizes 1,4,16] [--classes 0,1,2,3] [--new-tokens 128] [--repeats 3]
        [--out speedup_results.json] [--md speedup_table.md] [--dry-run]

The model is the attention pair of ``python -m bench models pair DIR --shape llama8b --attention``
(built under ``--pair-dir`` when missing, a few GiB of ``pytorch_model.bin``): a Llama-3.1-8B-shape
target whose greedy token goes through its layer-0 attention and a Llama-3.1-8B EAGLE-3-shape
draft, both at full size (every layer computes; layers 1-31 write nothing), whose agreement is
set per class of token: a request's accept length is its class's (``accept_pair.make_class_maps``;
the default classes give about 1.5, 2.0, 2.5 and 3.0 at num_steps 3). One engine per mode, each
in its own subprocess (``bench.lib.engine.run_logged``), ``sglang.Engine`` with the weights loaded
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
checked against ``accept_pair.simulate``. ``bench.lib.verify_probe`` (CUDA events around every
graph replay in the scheduler process, as in ``python -m bench verify``) gives the GPU ms per replay of the
plain decode, the draft steps, the verify and the draft extend: the inputs of the advisor check
(``bench.speedup.report.advisor_rows``). Results: ``--out`` (JSON: meta, rows, advisor, modes) and
``--md`` (the speed-up table and the advisor table); ``RESULT`` lines on stdout. Exit status 0
when every mode ran, every output and verify count matched the prediction and (``ours``)
every verify step replayed our graph; 1 otherwise; 2 for a bad flag (one line naming it).

Time (printed before the run, ``ESTIMATE``, ``bench.speedup.estimate``): the pair's build
(skipped when present), per mode a fixed cost outside its points (child process, engine start,
weights to the GPU and graph capture, shutdown) and each point's generation from a fitted
per-cycle cost.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from bench.lib import engine
from bench.models import accept_pair
from bench.speedup import run as speedup_run
from bench.speedup.estimate import estimate_s, plan
from bench.speedup.pair import PAIR, FlagError, PairBuildError, check_classes, default_maps, load_maps, pair_ready
from bench.speedup.run import MODES


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

    ap = argparse.ArgumentParser(prog="python -m bench speedup", description=__doc__.split("\n\n")[0])
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
    a.argv = list(sys.argv[1:] if argv is None else argv)
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
    need = max(a.contexts) + a.new_tokens + a.warmup_tokens + 2 * (a.steps + 1) + 64  # bench.lib.engine.engine_kwargs'
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
            kw = speedup_run.engine_kwargs(a, m, models)
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
            return engine.child_main(a, speedup_run.run_child, json_default=sorted)
        return speedup_run.run_parent(a)
    except FlagError as ex:
        print(f"python -m bench speedup: error: {ex}", file=sys.stderr)
        return 2
    except PairBuildError as ex:
        print(f"python -m bench speedup: {ex}", file=sys.stderr)
        return 1
