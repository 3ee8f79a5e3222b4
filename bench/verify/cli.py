"""Per-step GPU time of the EAGLE-3 (topk 1) target verify: ours vs upstream vs plain decode.

    python -m bench verify [--model llama-8b|llama-small|kimi-small|kimi-small-mla|kimi-k25-shard|...]
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
            listed (``RESULT baseline`` lines; ``bench.lib.baseline``);
  ours_profile  ``ours`` with the per-phase profile on (``SGLANG_VERIFY_GRAPH_PROFILE_EVERY``
            = ``--profile-every``, default 20): the decode part of its ``--new-tokens``
            generation over ``ours``'s, minus 1, is the profile's overhead (column ``prof_ovh%``,
            in percent): ``(tn - t1_mean) / (tn' - t1_mean) - 1`` with ``t1_mean`` the mean
            1-token (prefill) time of the two engines, divided by the verify steps when their
            counts differ. Each engine's own ``t1`` would carry the noise of one 1-token request;
            leaving prefill in ``tn`` would dilute the ratio (without the radix cache prefill
            can be most of ``tn``). Its
            ``verify_graph_profile`` log lines
            (parsed from the mode's log) give the phase-sum check: mean cycle time (device) vs
            device span per cycle (``1000 * tokens / tok_s / cycles``, gaps included).

What is measured: inside the scheduler process (the engine starts
``bench.lib.verify_probe.run_scheduler_process`` as its scheduler, ``bench.lib.engine``) ``execute`` of every graph runner class
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
32 that is over two million prefill tokens per point and engine. The per-replay GPU times are the same replays
either way (the verify reads the same prefix from the KV pool); the e2e figure then is pure
decode time per step. The pool must hold the largest point (bs x (context + tokens)); raise
``--mem`` for 16k x bs 32 on llama-8b (~0.8).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from bench.lib import engine
from bench.verify import child as verify_child
from bench.verify.merge import run_merge
from bench.verify.parent import run_parent
from bench.verify.table import MODES, mode_key


def parse_args(argv=None):
    ints = lambda s: [int(x) for x in str(s).split(",") if x]  # noqa: E731
    ap = argparse.ArgumentParser(prog="python -m bench verify", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-8b", choices=["llama-8b", "llama-small", "kimi-small", "kimi-small-mla",
                                                            "kimi-k25-shard", "kimi-k25-shard-wrapped"])
    ap.add_argument("--models-dir", default=os.environ.get("MODELS_DIR", "/tmp/models"),
                    help="folder of python -m bench models dummy output (made if missing)")
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
                         "python -m bench capture)")
    ap.add_argument("--plain-twice", action="store_true",
                    help="start a second plain engine last (plain_end): decode = the lower median per point, "
                         "points whose two medians differ by > 5%% listed (bench.lib.baseline)")
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
    a.argv = list(sys.argv[1:] if argv is None else argv)
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


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge:
        return run_merge(a)
    if a.dry_run:
        if not a.child:  # the engines run_parent would start, in order
            runs = [mode_key(a, m, k) for k in a.steps_list for m in a.modes if m != "plain" or k == a.steps_list[0]]
            print("BENCH plan: " + ", ".join(runs + (["plain_end"] if a.plain_twice else [])), flush=True)
        for m in ([a.child] if a.child else a.modes):
            print(f"DRYRUN {m}: " + json.dumps(verify_child.engine_kwargs(a, m)))
        if a.plain_twice and not a.child:
            print("DRYRUN plain_end: " + json.dumps(verify_child.engine_kwargs(a, "plain")))
        return 0
    if a.child:
        return engine.child_main(a, verify_child.run_child)
    return run_parent(a)


if __name__ == "__main__":
    sys.exit(main())
