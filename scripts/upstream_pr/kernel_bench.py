"""Micro-benchmark of the EAGLE topk == 1 target-verify attention kernels of the Triton backend.

For each (shape, context, batch size, draft tokens) it builds one verify batch (a KV pool, a page
table, the chain's K/V already written) and times, as CUDA-graph replays (median ms):

  extend   extend_attention_fwd with the chain's tree mask (the backend's path on CUDA today)
  splitkv  verify_splitkv_fwd (one program per query head; MHA/GQA only)
  shared   verify_shared_kv_fwd (grouped heads: MLA, or GQA with a power-of-two group)
  chain    chain_verify_fwd (this kernel)

and each one's largest per-(token, head) relative difference from a float64 reference. A kernel
that refuses the shape prints "-". The split-KV kernels are called directly, whatever the
backend's platform gate says.

Usage:
  python bench_chain_verify.py [--shapes llama-8b,kimi-tp8] [--ctx 1024,8192]
      [--bs 1,8,32] [--ndt 2,4] [--num-kv-splits 8] [--json out.json]
"""

import argparse
import json

import torch
import triton

from sglang.kernels.ops.attention.chain_verify import (
    chain_verify_fwd,
    workspace_numel_bound,
)
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.kernels.ops.attention.verify_mla import verify_shared_kv_fwd
from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

# name -> (q heads, kv heads, head_dim_qk, head_dim_v) of one TP rank
SHAPES = {
    "llama-8b": (32, 8, 128, 128),
    "llama-70b-tp8": (8, 1, 128, 128),
    "qwen3-32b-tp2": (32, 4, 128, 128),
    "kimi-tp8": (8, 1, 576, 512),
    "kimi-tp4": (16, 1, 576, 512),
}


def mla_num_kv_splits(num_kv_splits: int, num_sms: int, ctx: int) -> int:
    """The Triton backend widens --triton-attention-num-kv-splits for MLA this way."""
    from sglang.srt.layers.attention.triton_backend import _mla_decode_kv_splits_cap

    return _mla_decode_kv_splits_cap(num_kv_splits, num_sms, ctx)


def make_batch(heads, kv_heads, dk, dv, ndt, bs, ctx, dtype=torch.bfloat16):
    slots = bs * (ctx + ndt) + 1
    k_buffer = torch.randn(slots, kv_heads, dk, dtype=dtype, device="cuda")
    if dk > dv:  # absorbed MLA: V is the latent's first dv columns
        v_buffer = k_buffer[..., :dv]
    else:
        v_buffer = torch.randn(slots, kv_heads, dv, dtype=dtype, device="cuda")
    perm = torch.randperm(slots - 1, device="cuda") + 1
    req_to_token = perm[: bs * (ctx + ndt)].view(bs, ctx + ndt).to(torch.int32)
    rows = req_to_token.long()
    seq_lens = torch.full((bs,), ctx, dtype=torch.int64, device="cuda")
    q = torch.randn(bs * ndt, heads, dk, dtype=dtype, device="cuda")
    chain = rows[:, ctx:].reshape(-1)
    mask = torch.ones(ndt, ctx + ndt, dtype=torch.bool, device="cuda").tril(ctx)
    return dict(
        q=q,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(bs, device="cuda"),
        seq_lens=seq_lens,
        k_extend=k_buffer[chain].contiguous(),
        v_extend=v_buffer[chain].contiguous(),
        qo_indptr=torch.arange(0, (bs + 1) * ndt, ndt, dtype=torch.int32, device="cuda"),
        kv_indptr=torch.arange(0, (bs + 1) * ctx, ctx, dtype=torch.int32, device="cuda"),
        kv_indices=rows[:, :ctx].reshape(-1).contiguous(),
        custom_mask=mask.reshape(1, -1).expand(bs, -1).reshape(-1).contiguous(),
        mask_indptr=torch.arange(
            0, (bs + 1) * ndt * (ctx + ndt), ndt * (ctx + ndt), dtype=torch.int64, device="cuda"
        ),
    )


def reference(b, ndt, ctx, sm_scale, rows=4):
    """Float64 chain attention of the first ``rows`` requests."""
    heads, kv_heads = b["q"].shape[1], b["k_buffer"].shape[1]
    out = []
    for i in range(min(rows, b["seq_lens"].shape[0])):
        locs = b["req_to_token"][i, : ctx + ndt].long()
        k = b["k_buffer"][locs].double().repeat_interleave(heads // kv_heads, 1)
        v = b["v_buffer"][locs].double().repeat_interleave(heads // kv_heads, 1)
        s = torch.einsum("jhd,lhd->jhl", b["q"][i * ndt : (i + 1) * ndt].double(), k)
        s = s * sm_scale
        limit = ctx + torch.arange(ndt, device="cuda") + 1
        cols = torch.arange(ctx + ndt, device="cuda")
        s = s.masked_fill(cols[None, None, :] >= limit[:, None, None], float("-inf"))
        out.append(torch.einsum("jhl,lhd->jhd", s.softmax(-1), v))
    return torch.cat(out)


def row_error(o, ref):
    o = o[: ref.shape[0]].double()
    return ((o - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)).max().item()


def bench_point(shape, ctx, bs, ndt, num_kv_splits):
    heads, kv_heads, dk, dv = SHAPES[shape]
    b = make_batch(heads, kv_heads, dk, dv, ndt, bs, ctx)
    sm_scale = dk**-0.5
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = num_kv_splits
    if dk != dv:
        splits = mla_num_kv_splits(num_kv_splits, num_sms, ctx + ndt)
    n_out, n_lse = workspace_numel_bound(heads, dv, ndt, bs, splits, num_sms)
    att_out = torch.empty(n_out, dtype=torch.float32, device="cuda")
    att_lse = torch.empty(n_lse, dtype=torch.float32, device="cuda")
    ext_args = lambda o, mask: (  # noqa: E731
        b["q"], b["k_extend"], b["v_extend"], o, b["k_buffer"], b["v_buffer"],
        b["qo_indptr"], b["kv_indptr"], b["kv_indices"], mask, True,
        b["mask_indptr"], ndt, 1.0, 1.0, sm_scale,
    )
    kernels = {
        "extend": lambda o: extend_attention_fwd(*ext_args(o, b["custom_mask"])) or True,
        "splitkv": lambda o: verify_splitkv_fwd(*ext_args(o, None), max_bs=bs),
        "shared": lambda o: verify_shared_kv_fwd(*ext_args(o, None), max_bs=bs),
        "chain": lambda o: chain_verify_fwd(
            b["q"], o, b["k_buffer"], b["v_buffer"], b["req_to_token"],
            b["req_pool_indices"], b["seq_lens"], ndt, sm_scale, att_out, att_lse,
            max_kv_splits=splits, num_sms=num_sms,
        ),
    }
    ref = reference(b, ndt, ctx, sm_scale)
    row = dict(shape=shape, ctx=ctx, bs=bs, ndt=ndt, num_kv_splits=splits)
    for name, fn in kernels.items():
        o = torch.empty(bs * ndt, heads, dv, dtype=b["q"].dtype, device="cuda")
        if not fn(o):  # warm-up / compile; False: the kernel refuses this shape
            row[name + "_ms"] = row[name + "_err"] = None
            continue
        torch.cuda.synchronize()
        row[name + "_err"] = row_error(o, ref)
        row[name + "_ms"] = triton.testing.do_bench_cudagraph(
            lambda: fn(o), rep=50, return_mode="median"
        )
    return row


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="llama-8b,kimi-tp8")
    ap.add_argument("--ctx", default="1024,4096,8192,16384")
    ap.add_argument("--bs", default="1,8,32")
    ap.add_argument("--ndt", default="2,3,4")
    ap.add_argument(
        "--num-kv-splits",
        type=int,
        default=8,
        help="as --triton-attention-num-kv-splits (widened for MLA as the backend does)",
    )
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        ap.error(f"--shapes: unknown {unknown}; use some of {sorted(SHAPES)}")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    print(f"# {torch.cuda.get_device_name(0)}, triton {triton.__version__}, torch {torch.__version__}")
    print("| shape | ctx | bs | ndt | splits | extend ms | splitkv ms | shared ms | chain ms "
          "| chain / best other | max row err (ext, splitkv, shared, chain) |")
    print("|" + "---|" * 11)
    rows = []
    for shape in args.shapes.split(","):
        for ctx in ints(args.ctx):
            for bs in ints(args.bs):
                for ndt in ints(args.ndt):
                    r = bench_point(shape, ctx, bs, ndt, args.num_kv_splits)
                    rows.append(r)
                    others = [r[k] for k in ("extend_ms", "splitkv_ms", "shared_ms") if r[k]]
                    ratio = r["chain_ms"] / min(others) if r["chain_ms"] and others else None
                    errs = ", ".join(
                        fmt(r[k + "_err"], ".1e") for k in ("extend", "splitkv", "shared", "chain")
                    )
                    print(
                        f"| {shape} | {ctx} | {bs} | {ndt} | {r['num_kv_splits']} "
                        f"| {fmt(r['extend_ms'], '.4f')} | {fmt(r['splitkv_ms'], '.4f')} "
                        f"| {fmt(r['shared_ms'], '.4f')} | {fmt(r['chain_ms'], '.4f')} "
                        f"| {fmt(ratio, '.2f')} | {errs} |",
                        flush=True,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
