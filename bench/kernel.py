"""Attention-op benchmark of one verify layer on the GPU: our chain kernel vs what SGLang 0.5.16's
triton backend runs for the same step, each replayed from a CUDA graph (median of
``bench.lib.timing.graph_ms``, ms per call = one layer).

Columns (same KV pool, page table and q in every column):
  decode   : ``decode_attention_fwd`` for 1 token/request (what a plain decode step runs)
  upstream : ``extend_attention_fwd`` with the FULL tree mask, as upstream's graphed
             TARGET_VERIFY runs it (prefix via flat kv_indices, drafts from k/v_extend)
  splitkv  : SGLang's own ``verify_splitkv_fwd`` (gated to AMD gfx95 in production; MHA only)
  ours     : ``chain_verify_attention_fwd`` (split-KV over the page table, chain-causal)
It also checks ours against upstream's output (relative error, bf16).

Shapes: Llama-3.1-8B at TP 1 (32 q heads, 8 KV heads, 128) and one Kimi-K2.5 TP-8 shard in
absorbed MLA (8 q heads, 1 latent head, Dk 576 = 512 + rope 64, Dv 512).

  python -m bench kernel [--contexts 1024 8192] [--bs 1 8] [--ndt 3] [--out f.json]
      [--block-rows 16 32]   # also time ours with BLOCK_R forced (the row-block A/B; same inputs)
  python -m bench kernel --tune --shapes kimi_tp8_mla --contexts 1024 4096 16384 \
      --bs 1 4 8 16 32 --ndt 3 4 --out tune.json
      # launch-setting search for ours: every candidate of TUNE_GRID at the --focus points, then the
      # best --top of them and the policy at every point; same inputs, outputs checked against the
      # policy's (max abs difference), decode's time beside each point
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import triton

from bench.lib.timing import graph_ms
from sglang_verify_graph.kernel import (ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits,
                                        launch_config, launch_with_config, workspace_numel)
from sglang_verify_graph.kernel.chain_verify_attention import BLOCK_R_CHOICES

SHAPES = {
    "llama8b_tp1": dict(h=32, kvh=8, dk=128, dv=128, rope=0),
    "kimi_tp8_mla": dict(h=8, kvh=1, dk=576, dv=512, rope=64),
}


def bench(fn, rep: int = 100) -> float:
    """Median GPU ms per call of ``fn`` replayed from a CUDA graph (``rep`` timed replays)."""
    return graph_ms(fn, replays=rep)


def run_point(name, s, ctx, bs, ndt, block_rows=(), device="cuda"):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    dt = torch.bfloat16
    inputs = make_inputs(s, ctx, bs, ndt, device)
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    t = bs * ndt
    scale = dk ** -0.5
    res = {}

    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def time_ours(shape):  # (ms per call, splits, output) of our kernel with this shape's tiling
        ns = choose_num_kv_splits(shape, bs, sms)
        n_out, n_lse = workspace_numel(shape, bs, ns)
        ao, al = torch.empty(n_out, device=device), torch.empty(n_lse, device=device)
        o = torch.empty(t, h, dv, device=device, dtype=dt)
        f = lambda: chain_verify_attention_fwd(q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns, scale, ao, al)
        f()
        return bench(f), ns, o

    # ours
    shape = ChainVerifyShape(h, kvh, dk, dv, ndt, rope)
    res["ours_ms"], res["ours_splits"], o_ours = time_ours(shape)
    res["ours_block_r"] = shape.block_r
    # the same kernel with a forced row-block size (--block-rows), in the same process and inputs
    for b in block_rows:
        res[f"ours_r{b}_ms"], res[f"ours_r{b}_splits"], ob = time_ours(ChainVerifyShape(h, kvh, dk, dv, ndt, rope, b))
        res[f"ours_r{b}_vs_ours_max_abs"] = (ob.float() - o_ours.float()).abs().max().item()

    # upstream verify: prefix through kv_indices, draft K/V as extend tensors, FULL custom mask
    draft_locs = r2t[:, ctx:ctx + ndt].reshape(-1).long()
    k_ext, v_ext = k_buf[draft_locs].contiguous(), v_buf[draft_locs].contiguous()
    kv_indptr = torch.arange(0, (bs + 1) * ctx, ctx, device=device, dtype=torch.int32)
    kv_indices = r2t[:, :ctx].reshape(-1).long().contiguous()
    qo_indptr = torch.arange(0, (bs + 1) * ndt, ndt, device=device, dtype=torch.int32)
    mask_len = ndt * (ctx + ndt)
    mask_indptr = torch.arange(0, (bs + 1) * mask_len, mask_len, device=device, dtype=torch.int64)
    tri = torch.ones(ndt, ctx + ndt, dtype=torch.bool, device=device)
    tri[:, ctx:] = torch.tril(torch.ones(ndt, ndt, dtype=torch.bool, device=device))
    custom_mask = tri.reshape(-1).repeat(bs).to(torch.uint8)
    o_up = torch.empty(t, h, dv, device=device, dtype=dt)
    f_up = lambda: extend_attention_fwd(q, k_ext, v_ext, o_up, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                        custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale)
    f_up()
    res["upstream_ms"] = bench(f_up)
    res["ours_vs_upstream_rel_err"] = ((o_ours.float() - o_up.float()).norm() / o_up.float().norm()).item()

    # SGLang's own split-KV verify (MHA only; NV-safe per its docstring)
    if not rope:
        try:
            from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

            o_sk = torch.empty_like(o_up)
            f_sk = lambda: verify_splitkv_fwd(q, k_ext, v_ext, o_sk, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                              custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale, max_bs=bs)
            assert f_sk()
            res["splitkv_ms"] = bench(f_sk)
        except Exception as e:  # report, don't hide
            res["splitkv_error"] = f"{type(e).__name__}: {e}"[:200]

    # plain decode (1 token per request, ctx + 1 keys)
    res["decode_ms"] = decode_ms(s, inputs, ndt, device)
    return dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, **res)


# The tuning search: KV-split policy (programs per SM, split cap) x stage-1 launch settings.
TUNE_GRID = dict(pps=(2, 4, 8), max_splits=(256,), BLOCK_N=(16, 32, 64), num_warps=(4, 8),
                 num_stages=(1, 2))
POLICY = {}  # the kernel's own choices (empty: no override)


def tune_candidates() -> list[dict]:
    """Every combination of :data:`TUNE_GRID` (one dict per candidate)."""
    out = [dict()]
    for k, vals in TUNE_GRID.items():
        out = [dict(c, **{k: v}) for c in out for v in vals]
    return out


def tune_splits(shape, bs: int, num_sms: int, programs_per_sm: int, max_splits: int) -> int:
    """KV splits of a tuning candidate: enough (bs x KV heads x row blocks) programs per split
    for ``programs_per_sm`` programs on each of ``num_sms`` SMs, rounded up to a power of two,
    at most ``max_splits``."""
    base = max(1, bs * shape.num_kv_heads * shape.row_blocks)
    return max(1, min(max_splits, triton.next_power_of_2(max(1, math.ceil(programs_per_sm * num_sms / base)))))


def cfg_name(c: dict) -> str:
    if not c:
        return "policy"
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in c.items())


def make_inputs(s, ctx, bs, ndt, device="cuda"):
    """One point's KV pool, page table and q (seeded by ctx + bs): (k_buf, v_buf, req_to_token,
    req_pool_indices, seq_lens, q); for MLA (``rope``) v_buf is a view of k_buf's first dv columns."""
    torch.manual_seed(ctx + bs)
    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    dt = torch.bfloat16
    slots = bs * (ctx + ndt) + 1
    k_buf = torch.randn(slots, kvh, dk, device=device, dtype=dt)
    v_buf = k_buf[..., :dv] if rope else torch.randn(slots, kvh, dv, device=device, dtype=dt)
    perm = torch.randperm(slots - 1, device=device) + 1
    r2t = perm.view(-1)[: bs * (ctx + ndt)].view(bs, ctx + ndt).to(torch.int32).contiguous()
    rpi = torch.arange(bs, device=device, dtype=torch.int64)
    seq = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    q = torch.randn(bs * ndt, h, dk, device=device, dtype=dt)
    return k_buf, v_buf, r2t, rpi, seq, q


def time_config(s, inputs, ndt, cfg, sms, device="cuda", rep=100):
    """(ms, splits, output) of ours with the tuning config ``cfg``; (None, splits, error) when it
    does not build or launch on this device."""
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, dv = rpi.shape[0], s["h"], s["dv"]
    shape = ChainVerifyShape(h, s["kvh"], s["dk"], dv, ndt, s["rope"])
    cfg = dict(cfg)
    pps, cap = cfg.pop("pps", None), cfg.pop("max_splits", None)
    if pps:
        ns = tune_splits(shape, bs, sms, pps, cap or 256)
    else:
        ns = choose_num_kv_splits(shape, bs, sms)
    n_out, n_lse = workspace_numel(shape, bs, ns)
    ao, al = torch.empty(n_out, device=device), torch.empty(n_lse, device=device)
    o = torch.empty(bs * ndt, h, dv, device=device, dtype=torch.bfloat16)
    if cfg or pps:  # a candidate: the bench's own launch settings over the kernel's defaults
        cfg1, cfg2 = launch_config(shape)
        cfg1.update(cfg)
        f = lambda: launch_with_config(q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns, s["dk"] ** -0.5,  # noqa: E731
                                       ao, al, cfg1, cfg2)
    else:
        f = lambda: chain_verify_attention_fwd(q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns,  # noqa: E731
                                               s["dk"] ** -0.5, ao, al)
    try:
        f()
        torch.cuda.synchronize()
        return bench(f, rep), ns, o
    except Exception as e:  # OutOfResources etc.: reported, not hidden
        return None, ns, f"{type(e).__name__}: {e}"[:160]


def decode_ms(s, inputs, ndt, device="cuda"):
    """ms per call of SGLang's ``decode_attention_fwd`` on the first token of each request (ctx + 1
    keys), as a plain decode step runs it."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.srt.layers.attention.triton_backend import _mla_decode_kv_splits_cap

    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, dk, dv, rope = rpi.shape[0], s["h"], s["dk"], s["dv"], s["rope"]
    ctx = int(seq[0])
    max_splits = _mla_decode_kv_splits_cap(8, 132, 32768) if rope else 8
    d_indptr = torch.arange(0, (bs + 1) * (ctx + 1), ctx + 1, device=device, dtype=torch.int32)
    d_indices = r2t[:, :ctx + 1].reshape(-1).long().contiguous()
    qd = q.view(bs, ndt, h, dk)[:, 0].contiguous()
    od = torch.empty(bs, h, dv, device=device, dtype=q.dtype)
    logits = torch.empty(bs, h, max_splits, dv, device=device, dtype=torch.float32)
    lse = torch.empty(bs, h, max_splits, device=device, dtype=torch.float32)
    nsp = torch.full((bs,), max_splits, device=device, dtype=torch.int32)
    f = lambda: decode_attention_fwd(qd, k_buf, v_buf, od, d_indptr, d_indices, logits, lse, nsp, max_splits,
                                     dk ** -0.5, 1.0, 1.0, has_mla=bool(rope))
    f()
    return bench(f)


def run_tune(a):
    """The tuning search (see the module docstring); returns the JSON record."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    focus = [tuple(int(x) for x in f.split(":")) for f in a.focus]  # ctx:bs:ndt
    rec = {"grid": {k: list(v) for k, v in TUNE_GRID.items()}, "focus": focus, "phase_a": [], "phase_b": []}
    for name in a.shapes:
        s = SHAPES[name]
        cands = tune_candidates()
        scores = {cfg_name(c): [] for c in cands}
        for ctx, bs, ndt in focus:
            inp = make_inputs(s, ctx, bs, ndt)
            t_pol, ns_pol, o_pol = time_config(s, inp, ndt, POLICY, sms)
            for c in cands:
                t, ns, o = time_config(s, inp, ndt, c, sms, rep=40)
                row = dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, cfg=cfg_name(c), ms=t, splits=ns,
                           policy_ms=t_pol, policy_splits=ns_pol)
                if t is None:
                    row["error"] = o
                else:
                    row["max_abs_vs_policy"] = (o.float() - o_pol.float()).abs().max().item()
                    scores[cfg_name(c)].append(t / t_pol)
                rec["phase_a"].append(row)
                print("TUNE_A " + json.dumps(row), flush=True)
        full = {k: v for k, v in scores.items() if len(v) == len(focus)}
        gm = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in full.items()}
        ranked = sorted(gm, key=gm.get)
        top = ranked[: a.top]
        for i in range(len(focus)):  # and the best at each focus point
            best = min(full, key=lambda k: full[k][i])
            if best not in top:
                top.append(best)
        print(f"TUNE ranking {name}: " + "; ".join(f"{k} {gm[k]:.3f}" for k in ranked[:10]), flush=True)
        by_name = {cfg_name(c): c for c in cands}
        for ctx in a.contexts:
            for bs in a.bs:
                for ndt in a.ndt:
                    inp = make_inputs(s, ctx, bs, ndt)
                    row = dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, decode_ms=decode_ms(s, inp, ndt))
                    t_pol, row["policy_splits"], o_pol = time_config(s, inp, ndt, POLICY, sms)
                    row["policy_ms"] = t_pol
                    for k in top:
                        t, ns, o = time_config(s, inp, ndt, by_name[k], sms)
                        row[k] = dict(ms=t, splits=ns, **({"error": o} if t is None else
                                      {"max_abs_vs_policy": (o.float() - o_pol.float()).abs().max().item()}))
                    rec["phase_b"].append(row)
                    print("TUNE_B " + json.dumps(row), flush=True)
        rec.setdefault("ranking", {})[name] = [(k, gm[k]) for k in ranked]
        rec.setdefault("top", {})[name] = top
    return rec


def print_tune(rec):
    print("\ntuning: ms per layer (CUDA-graph replay median), ratio = config / policy")
    for name, top in rec["top"].items():
        print(f"{name}: " + " | ".join(f"[{i}] {k}" for i, k in enumerate(top)))
        print(f"{'ctx':>6s} {'bs':>3s} {'ndt':>3s} {'decode':>8s} {'policy':>8s} {'pol/dec':>7s} "
              + " ".join(f"{'[' + str(i) + ']':>7s}" for i in range(len(top))) + "  best/dec")
        for r in rec["phase_b"]:
            if r["shape"] != name:
                continue
            ts = [r[k]["ms"] for k in top]
            best = min([r["policy_ms"]] + [t for t in ts if t])
            print(f"{r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} {r['decode_ms']:8.4f} {r['policy_ms']:8.4f} "
                  f"{r['policy_ms'] / r['decode_ms']:7.3f} "
                  + " ".join(f"{t / r['policy_ms']:7.3f}" if t else "      -" for t in ts)
                  + f"  {best / r['decode_ms']:7.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ndt", type=int, nargs="+", default=[3])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--block-rows", type=int, nargs="*", default=[],
                    help="also time ours with ChainVerifyShape.block_rows forced to each of these (16, 32)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the points and exit (no GPU)")
    ap.add_argument("--tune", action="store_true", help="the launch-setting search instead of the columns")
    ap.add_argument("--focus", nargs="+", default=["16384:16:4", "16384:8:3", "16384:1:3", "1024:16:4"],
                    help="ctx:bs:ndt points where --tune tries every candidate")
    ap.add_argument("--top", type=int, default=3, help="--tune: candidates carried to every point")
    a = ap.parse_args(argv)
    bad = [b for b in a.block_rows if b not in BLOCK_R_CHOICES]
    if bad:
        ap.error(f"--block-rows {bad}: the kernel takes {BLOCK_R_CHOICES}")
    if a.tune and a.dry_run:
        for name in a.shapes:
            n = len(tune_candidates())
            print(f"KERNEL dry-run tune {name}: {n} candidates x focus {a.focus}; top {a.top} + policy at "
                  f"contexts={a.contexts} bs={a.bs} ndt={a.ndt}")
        return 0
    if a.tune:
        rec = run_tune(a)
        rec["device"] = torch.cuda.get_device_name(0)
        print_tune(rec)
        if a.out:
            json.dump(rec, open(a.out, "w"), indent=1)
        return 0
    if a.dry_run:
        for name in a.shapes:
            for ndt in a.ndt:
                s = SHAPES[name]
                pol = ChainVerifyShape(s["h"], s["kvh"], s["dk"], s["dv"], ndt, s["rope"]).block_r
                print(f"KERNEL dry-run {name} ndt={ndt} policy block_r={pol} contexts={a.contexts} "
                      f"bs={a.bs} forced={a.block_rows}")
        return 0
    rows = []
    for name in a.shapes:
        for ctx in a.contexts:
            for bs in a.bs:
                for ndt in a.ndt:
                    rows.append(run_point(name, SHAPES[name], ctx, bs, ndt, a.block_rows))
                    r = rows[-1]
                    print("KERNEL " + json.dumps(r), flush=True)
    dev = torch.cuda.get_device_name(0)
    print(f"\n{dev}, torch {torch.__version__}, triton {triton.__version__}; ms per layer, CUDA-graph replay median")
    hdr = f"{'shape':14s} {'ctx':>6s} {'bs':>3s} {'ndt':>3s} {'decode':>8s} {'upstream':>9s} {'splitkv':>8s} {'ours':>8s} {'ours/up':>8s} {'ours/dec':>8s} {'relerr':>8s}"
    print(hdr)
    for r in rows:
        sk = r.get("splitkv_ms")
        print(f"{r['shape']:14s} {r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} {r['decode_ms']:8.4f} {r['upstream_ms']:9.4f} "
              f"{(f'{sk:8.4f}' if sk else '       -')} {r['ours_ms']:8.4f} {r['ours_ms'] / r['upstream_ms']:8.3f} "
              f"{r['ours_ms'] / r['decode_ms']:8.3f} {r['ours_vs_upstream_rel_err']:8.1e}")
    if a.block_rows:  # the row-block A/B: ms per layer with BLOCK_R forced, and over the policy's
        print(f"\nrow blocks (BLOCK_R) forced; policy = ours' own choice; ratio = forced / policy")
        print(f"{'shape':14s} {'ctx':>6s} {'bs':>3s} {'ndt':>3s} {'policy':>6s} {'ours':>8s} "
              + " ".join(f"{'r' + str(b):>8s} {'r' + str(b) + '/ours':>8s}" for b in a.block_rows))
        for r in rows:
            print(f"{r['shape']:14s} {r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} {r['ours_block_r']:6d} {r['ours_ms']:8.4f} "
                  + " ".join(f"{r[f'ours_r{b}_ms']:8.4f} {r[f'ours_r{b}_ms'] / r['ours_ms']:8.3f}" for b in a.block_rows))
    if a.out:
        json.dump({"device": dev, "rows": rows}, open(a.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
