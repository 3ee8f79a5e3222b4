"""Attention-op benchmark of one verify layer, head to head: our chain kernel against the kernels
SGLang has for the same topk-1 verify step, each replayed from a CUDA graph (median of
``bench.lib.timing.graph_ms``: ms per call = one layer), each checked against one float32
reference on the same inputs.

Kernels (``--kernels``; same KV pool, page table and q for all; each called directly, whatever
its production gate says):
  decode     ``decode_attention_fwd``, 1 token per request (a plain decode step; timing only)
  extend     ``extend_attention_fwd`` with the FULL tree mask, as the graphed TARGET_VERIFY runs it
             on CUDA (prefix via flat kv_indices, drafts from k/v_extend); installed SGLang
  splitkv    ``verify_splitkv_fwd`` (gated to gfx95 in production; its own ``can_handle``
             declines MLA from 0.5.23 on)
  shared_kv  ``verify_shared_kv_fwd`` (``verify_mla.py``, sglang#33981; gated to gfx95 and
             Kimi-K3 / Qwen3.5 in production; not in 0.5.16)
  ours       ``chain_verify_attention_fwd`` (split-KV over the page table, chain-causal)
  splitkv_installed  the installed release's ``verify_splitkv_fwd`` beside a ``--upstream-src``
             one (not run on MLA shapes: before 0.5.23 it neither masks head dims nor declines
             576/512)
splitkv and shared_kv come from ``--upstream-src`` (a 0.5.23 ``sglang`` folder or the tarball
``scripts/pack_bundle.sh`` writes; see ``bench.upstream_kernels``) when given, else from the
installed SGLang; the results record each one's source (origin, version, path, sha256). A
kernel that raises, declines the problem (returns False) or fails the accuracy check is
reported in its row, never left out.

Accuracy: every verify kernel's output [T, H, Dv] against :func:`chain_reference` (float32,
draft row j of a request sees its prefix and drafts 0..j), per draft row (one token, all heads):
max abs error, and pass iff it is <= ``ATOL + RTOL * max |ref|`` of that row (bf16 output:
``RTOL`` = 2^-6, ``ATOL`` = 1e-3). The draft keys are raised (:func:`boost_drafts`) so that
their mean score is ln(keys): the drafts then carry softmax mass comparable to the whole prefix
and a row that sees one draft too many or too few fails the check (with plain random keys at
16k keys it would differ by about 1e-4).

Shapes: Llama-3.1-8B at TP 1 (32 q heads, 8 KV heads, 128) and one Kimi-K2.5 TP-8 shard in
absorbed MLA (8 q heads, 1 latent head, Dk 576 = 512 + rope 64, Dv 512); each point's requests
all have ``ctx`` prefix keys.

  python -m bench kernel [--contexts 1024 16384] [--bs 1 8 32] [--ndt 2 3 4] [--out f.json]
      [--upstream-src DIR|TARBALL] [--kernels extend splitkv shared_kv ours] [--reps 100]
      [--budget-s 420]   # stop starting new points after this many seconds (the rest: "skipped")
      [--block-rows 16 32]   # also time ours with BLOCK_R forced (rows ours_r16 / ours_r32)
  TRITON_INTERPRET=1 python -m bench kernel --device cpu --contexts 64 --bs 2 --ndt 3
      # CPU: every kernel run once under the Triton interpreter (float32 inputs) and checked;
      # no timing
  python -m bench kernel --tune --shapes kimi_tp8_mla --contexts 1024 4096 16384 \
      --bs 1 4 8 16 32 --ndt 3 4 --out tune.json
      # launch-setting search for ours: every candidate of TUNE_GRID at the --focus points, then the
      # best --top of them and the policy at every point; same inputs, outputs checked against the
      # policy's (max abs difference), decode's time beside each point
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton

from bench.kernel.head_to_head import (CPU_SMS, DEFAULT_KERNELS, KERNELS, print_table, run_point, structure_lines,
                                       summary_lines)
from bench.kernel.inputs import ATOL, RTOL, SHAPES
from sglang_verify_graph.kernel import ChainVerifyShape
from sglang_verify_graph.kernel.chain_verify_attention import BLOCK_R_CHOICES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ndt", type=int, nargs="+", default=[3])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--kernels", nargs="+", default=list(DEFAULT_KERNELS),
                    help=f"which columns, of {', '.join(KERNELS)}")
    ap.add_argument("--upstream-src", default=os.environ.get("BENCH_UPSTREAM_SRC") or None,
                    help="SGLang source for splitkv / shared_kv: a folder holding sglang/ (or it), or a "
                         "tarball of one (env BENCH_UPSTREAM_SRC); default: the installed SGLang")
    ap.add_argument("--block-rows", type=int, nargs="*", default=[],
                    help="also time ours with ChainVerifyShape.block_rows forced to each of these (16, 32)")
    ap.add_argument("--reps", type=int, default=100, help="timed graph replays per kernel and point")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="start no new point after this many seconds (0: no limit); the rest are listed as skipped")
    ap.add_argument("--num-sms", type=int, default=None,
                    help=f"SM count for ours' split choice (default: the GPU's; {CPU_SMS} with --device cpu)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: every kernel once under TRITON_INTERPRET=1 (float32), checked, not timed")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the points and kernel sources and exit (no GPU)")
    ap.add_argument("--tune", action="store_true", help="the launch-setting search instead of the columns")
    ap.add_argument("--focus", nargs="+", default=["16384:16:4", "16384:8:3", "16384:1:3", "1024:16:4"],
                    help="ctx:bs:ndt points where --tune tries every candidate")
    ap.add_argument("--top", type=int, default=3, help="--tune: candidates carried to every point")
    a = ap.parse_args(argv)
    bad = [b for b in a.block_rows if b not in BLOCK_R_CHOICES]
    if bad:
        ap.error(f"--block-rows {bad}: the kernel takes {BLOCK_R_CHOICES}")
    bad = [k for k in a.kernels if k not in KERNELS]
    if bad:
        ap.error(f"--kernels {bad}: known kernels are {', '.join(KERNELS)}")
    bad = [n for n in a.shapes if n not in SHAPES]
    if bad:
        ap.error(f"--shapes {bad}: known shapes are {', '.join(SHAPES)}")
    bad = [f"{k} {v}" for k, vs in (("--contexts", a.contexts), ("--bs", a.bs), ("--ndt", a.ndt),
                                    ("--reps", [a.reps]), ("--num-sms", [a.num_sms or 1])) for v in vs if v < 1]
    if bad:
        ap.error(f"{bad[0]}: must be >= 1")
    if a.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("--device cpu runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
    if a.device == "cpu" and a.tune:
        ap.error("--tune times kernels: it needs --device cuda")
    if a.tune and a.dry_run:
        for name in a.shapes:
            from bench.kernel.tune import tune_candidates

            n = len(tune_candidates())
            print(f"KERNEL dry-run tune {name}: {n} candidates x focus {a.focus}; top {a.top} + policy at "
                  f"contexts={a.contexts} bs={a.bs} ndt={a.ndt}")
        return 0
    if a.tune:
        from bench.kernel.tune import print_tune, run_tune

        rec = run_tune(a)
        rec["device"] = torch.cuda.get_device_name(0)
        print_tune(rec)
        if a.out:
            json.dump(rec, open(a.out, "w"), indent=1)
        return 0
    from bench import upstream_kernels as uk

    want = [k for k in a.kernels if k in ("splitkv", "shared_kv")]
    try:
        upstream = uk.load_kernels(want, a.upstream_src) if want else {}
    except uk.UpstreamLoadError as e:
        ap.error(str(e))
    if "splitkv_installed" in a.kernels:
        upstream["splitkv_installed"] = uk.load_kernels(["splitkv"])["splitkv"]
        upstream["splitkv_installed"].name = "splitkv_installed"
    prov = uk.describe(upstream)
    for ln in prov:
        print(ln, flush=True)
    if a.dry_run:
        for name in a.shapes:
            for ndt in a.ndt:
                s = SHAPES[name]
                pol = ChainVerifyShape(s["h"], s["kvh"], s["dk"], s["dv"], ndt, s["rope"]).block_r
                print(f"KERNEL dry-run {name} ndt={ndt} policy block_r={pol} contexts={a.contexts} "
                      f"bs={a.bs} forced={a.block_rows} kernels={a.kernels}")
        return 0
    on_gpu = a.device == "cuda"
    dev = torch.cuda.get_device_name(0) if on_gpu else "cpu (Triton interpreter, float32, not timed)"
    import sglang

    meta = dict(device=dev, torch=torch.__version__, triton=triton.__version__,
                sglang_installed=getattr(sglang, "__version__", "-"), upstream_src=a.upstream_src,
                upstream={k: v.record() for k, v in upstream.items()}, kernels=a.kernels, reps=a.reps,
                num_sms=a.num_sms,
                tolerance=dict(rtol=RTOL, atol=ATOL, per="draft row (one token, all heads x Dv)"),
                inputs="random normal q/K/V; draft keys raised so their mean score is ln(keys) (boost_drafts)",
                timing="CUDA-graph replay median, ms per call (one layer); kv_indices / masks built outside "
                       "the timed call" if on_gpu else None,
                argv=list(argv) if argv is not None else None)
    points = [(n, c, b, d) for n in a.shapes for c in a.contexts for b in a.bs for d in a.ndt]
    rows, skipped = [], []
    t0 = time.monotonic()

    def dump():
        if a.out:
            with open(a.out, "w") as fh:
                json.dump(dict(meta, rows=rows, skipped=skipped, summary=summary_lines(rows),
                               elapsed_s=time.monotonic() - t0), fh, indent=1)

    for name, ctx, bs, ndt in points:
        if a.budget_s and time.monotonic() - t0 > a.budget_s:
            skipped.append(dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, reason=f"--budget-s {a.budget_s:g} reached"))
            continue
        tp = time.monotonic()
        r = run_point(name, SHAPES[name], ctx, bs, ndt, a.kernels, upstream, a.block_rows, a.device, a.reps,
                      a.num_sms)
        r["wall_s"] = round(time.monotonic() - tp, 2)  # the point's whole time: inputs, reference, calls, timing
        rows.append(r)
        print("KERNEL " + json.dumps(r), flush=True)
        dump()
    print(f"\n{dev}, torch {torch.__version__}, triton {triton.__version__}, sglang {meta['sglang_installed']}; "
          + ("ms per layer, CUDA-graph replay median" if on_gpu else "accuracy only"))
    for ln in prov:
        print(ln[:300])
    print_table(rows, a.kernels)
    if skipped:
        print(f"SKIPPED {len(skipped)} points (--budget-s {a.budget_s:g}): "
              + " ".join(f"{p['shape']}/{p['ctx']}/{p['bs']}/{p['ndt']}" for p in skipped[:20]))
    for ln in structure_lines(rows) + summary_lines(rows):
        print(ln)
    dump()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
