"""The attention part on the GPU: ours (``chain_verify_attention_fwd``), SGLang's decode and its
verify (``extend_attention_fwd``) over one KV pool, each timed from a CUDA graph; and the device
copy bandwidth the bytes model divides by."""

from __future__ import annotations


from bench.lib.timing import time_calls
from bench.parts.model import kv_slots, LayerShape, rel_err


def measure_copy_bandwidth(gib: float, replays: int) -> dict:
    """Device-to-device ``copy_`` of ``gib`` GiB: TB/s = (bytes read + bytes written) / median time."""
    import torch

    n = int(gib * 2 ** 30) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = time_calls([lambda: dst.copy_(src)], replays, 3, min_calls=1)
    assert torch.equal(dst[:1024], src[:1024]), "copy kernel wrote wrong data"
    t.pop("samples")
    return {"bytes_each_side": 2 * n, "time": t, "tbps": 4 * n / (t["median_ms"] * 1e-3) / 1e12}

# ---- (a) attention ----

def bench_attention(a, shape: LayerShape, ctx: int, bs: int, copies: int, num_sms: int, checks: bool,
                    device: str = "cuda", dtype=None, timer=None) -> list:
    """One (ctx, bs) point: decode once, ours and upstream per ndt; ``copies`` KV buffers
    [slots, 1, 576] (``dtype``, default bf16, random normal), one page table [bs, ctx + max ndt]
    int32 of distinct slots >= 1. ``timer``: ``time_calls`` unless given. Returns one dict per ndt."""
    import torch
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    from sglang.srt.layers.attention.triton_backend import _mla_decode_kv_splits_cap
    from sglang_verify_graph.kernel import ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits, workspace_numel

    use_pdl = False
    if device == "cuda":  # as TritonAttnBackend: PDL where the architecture supports it
        try:
            from sgl_kernel.utils import is_arch_support_pdl

            use_pdl = bool(is_arch_support_pdl())
        except Exception:
            pass
    timer = timer or time_calls
    dev, dt = device, dtype or torch.bfloat16
    h, dk, dv = shape.heads, shape.qk_dim, shape.kv_lora
    max_ndt = max(a.ndt)
    slots = kv_slots(bs, ctx, max_ndt)
    torch.manual_seed(a.seed * 7919 + ctx * 31 + bs)
    kv_all = torch.randn(copies, slots, 1, dk, device=dev, dtype=dt)
    k_bufs = [kv_all[c] for c in range(copies)]
    v_bufs = [k[..., :dv] for k in k_bufs]
    r2t = (torch.randperm(slots - 1, device=dev)[: bs * (ctx + max_ndt)] + 1).view(bs, ctx + max_ndt).to(torch.int32)
    rpi = torch.arange(bs, device=dev, dtype=torch.int64)
    seq = torch.full((bs,), ctx, device=dev, dtype=torch.int64)
    scale = shape.sm_scale

    # decode: 1 token per request over ctx + 1 keys (seq_lens include the new token)
    max_splits = _mla_decode_kv_splits_cap(8, num_sms, shape.max_context_len)
    d_seq = torch.full((bs,), ctx + 1, device=dev, dtype=torch.int64)
    d_indptr = torch.arange(0, (bs + 1) * (ctx + 1), ctx + 1, device=dev, dtype=torch.int32)
    d_indices = r2t[:, :ctx + 1].reshape(-1).to(torch.int64).contiguous()
    nsp = torch.empty(bs, device=dev, dtype=torch.int32)
    get_num_kv_splits_triton[(1,)](nsp, d_seq, bs, 1, h, 1, max_splits, num_sms,
                                   MAX_NUM_SEQ=256 if bs < 256 else 1 << (bs - 1).bit_length())
    logits = torch.empty(bs, h, max_splits, dv, device=dev, dtype=torch.float32)
    lse = torch.empty(bs, h, max_splits, device=dev, dtype=torch.float32)
    qd = torch.randn(bs, h, dk, device=dev, dtype=dt)
    od = torch.empty(bs, h, dv, device=dev, dtype=dt)

    def dec(c):
        return lambda: decode_attention_fwd(qd, k_bufs[c], v_bufs[c], od, d_indptr, d_indices, logits, lse, nsp,
                                            max_splits, scale, 1.0, 1.0, has_mla=True, use_pdl=use_pdl)

    t_dec = timer([dec(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
    meta_dec = {"max_kv_splits": max_splits, "num_kv_splits": nsp.tolist()[:4], "use_pdl": use_pdl}
    out = []
    for ndt in a.ndt:
        t = bs * ndt
        q = torch.randn(t, h, dk, device=dev, dtype=dt)
        q.view(bs, ndt, h, dk)[:, 0] = qd  # the decode token is each chain's first row
        cshape = ChainVerifyShape(h, 1, dk, dv, ndt, shape.rope)
        ns = choose_num_kv_splits(cshape, bs, num_sms)
        n_out, n_lse = workspace_numel(cshape, bs, ns)
        ao, al = torch.empty(n_out, device=dev), torch.empty(n_lse, device=dev)
        o = torch.empty(t, h, dv, device=dev, dtype=dt)

        def ours(c):
            return lambda: chain_verify_attention_fwd(q, k_bufs[c], v_bufs[c], o, r2t, rpi, seq, cshape, ns, scale,
                                                      ao, al)

        draft_locs = r2t[:, ctx:ctx + ndt].reshape(-1).long()
        k_ext = k_bufs[0][draft_locs].contiguous()
        v_ext = v_bufs[0][draft_locs].contiguous()
        kv_indptr = torch.arange(0, (bs + 1) * ctx, ctx, device=dev, dtype=torch.int32)
        kv_indices = r2t[:, :ctx].reshape(-1).to(torch.int64).contiguous()
        qo_indptr = torch.arange(0, (bs + 1) * ndt, ndt, device=dev, dtype=torch.int32)
        mask_len = ndt * (ctx + ndt)
        mask_indptr = torch.arange(0, (bs + 1) * mask_len, mask_len, device=dev, dtype=torch.int64)
        tri = torch.ones(ndt, ctx + ndt, dtype=torch.bool, device=dev)
        tri[:, ctx:] = torch.tril(torch.ones(ndt, ndt, dtype=torch.bool, device=dev))
        custom_mask = tri.reshape(-1).repeat(bs)
        o_up = torch.empty(t, h, dv, device=dev, dtype=dt)

        def up(c):
            return lambda: extend_attention_fwd(q, k_ext, v_ext, o_up, k_bufs[c], v_bufs[c], qo_indptr, kv_indptr,
                                                kv_indices, custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale)

        res = {"bs": bs, "ctx": ctx, "ndt": ndt, "copies": copies, "kv_bytes_per_copy": slots * dk * 2,
               "ours_kv_splits": ns, "ours_block_r": cshape.block_r, "decode_meta": meta_dec}
        res["ours"] = timer([ours(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
        res["upstream"] = timer([up(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
        res["decode"] = t_dec
        if checks:  # copy 0, outputs poisoned first: every element written, and the three agree
            for buf in (o, o_up, od):
                buf.fill_(float("nan"))
            ours(0)()
            up(0)()
            dec(0)()
            if dev == "cuda":
                torch.cuda.synchronize()
            res["check"] = {
                "ours_finite": bool(torch.isfinite(o).all()), "upstream_finite": bool(torch.isfinite(o_up).all()),
                "decode_finite": bool(torch.isfinite(od).all()),
                "ours_vs_upstream_rel_err": rel_err(o, o_up),
                "decode_vs_ours_first_row_rel_err": rel_err(od, o.view(bs, ndt, h, dv)[:, 0])}
        out.append(res)
    return out
