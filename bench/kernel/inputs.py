"""One benchmark point's inputs and the float32 reference every kernel is checked against.

Shapes (:data:`SHAPES`): Llama-3.1-8B at TP 1 (32 q heads, 8 KV heads, 128) and one Kimi-K2.5 TP-8
shard in absorbed MLA (8 q heads, 1 latent head, Dk 576 = 512 + rope 64, Dv 512).
"""

from __future__ import annotations

import math

import torch

from bench.lib.timing import graph_ms

SHAPES = {
    "llama8b_tp1": dict(h=32, kvh=8, dk=128, dv=128, rope=0),
    "kimi_tp8_mla": dict(h=8, kvh=1, dk=576, dv=512, rope=64),
}
RTOL = 2.0 ** -6  # per draft row: max |out - ref| <= ATOL + RTOL * max |ref| (bf16 output)
ATOL = 1e-3


def bench(fn, rep: int = 100) -> float:
    """Median GPU ms per call of ``fn`` replayed from a CUDA graph (``rep`` timed replays)."""
    return graph_ms(fn, replays=rep)


def make_inputs(s, ctx, bs, ndt, device="cuda", dtype=torch.bfloat16):
    """One point's KV pool, page table and q (seeded by ctx + bs): (k_buf [S, KVH, Dk],
    v_buf [S, KVH, Dv], req_to_token [bs, ctx + ndt] int32 (random distinct slots >= 1),
    req_pool_indices [bs] int64, seq_lens [bs] int64 (= ctx), q [bs * ndt, H, Dk]), floats in
    ``dtype``; for MLA (``rope``) v_buf is a view of k_buf's first dv columns."""
    torch.manual_seed(ctx + bs)
    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    dt = dtype
    slots = bs * (ctx + ndt) + 1
    k_buf = torch.randn(slots, kvh, dk, device=device, dtype=dt)
    v_buf = k_buf[..., :dv] if rope else torch.randn(slots, kvh, dv, device=device, dtype=dt)
    perm = torch.randperm(slots - 1, device=device) + 1
    r2t = perm.view(-1)[: bs * (ctx + ndt)].view(bs, ctx + ndt).to(torch.int32).contiguous()
    rpi = torch.arange(bs, device=device, dtype=torch.int64)
    seq = torch.full((bs,), ctx, device=device, dtype=torch.int64)
    q = torch.randn(bs * ndt, h, dk, device=device, dtype=dt)
    return k_buf, v_buf, r2t, rpi, seq, q


def boost_drafts(s: dict, inputs: tuple, ndt: int) -> None:
    """Add to each draft key (req_to_token columns ctx .. ctx+ndt-1 of every request) ``c * u``:
    ``u`` the unit direction of the sum of the request's query rows of that KV head (all draft
    rows, all heads of its group), ``c`` such that the mean score ``sm_scale * q . (c u)`` over
    those rows is ln(ctx + ndt). In place on ``k_buf`` (MLA: V is K's first Dv columns, so the
    draft values move too). Every kernel and the reference read the same modified pool."""
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    bs, h, kvh, dk = rpi.shape[0], s["h"], s["kvh"], s["dk"]
    ctx = int(seq[0])
    g = h // kvh
    ssum = q.float().view(bs, ndt, kvh, g, dk).sum(dim=(1, 3))  # [bs, kvh, dk]
    norm = ssum.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    mean_dot = norm / (ndt * g)  # mean of q_r . u over the group's rows
    c = math.log(ctx + ndt) / (dk ** -0.5 * mean_dot)
    add = (c * ssum / norm)[:, None].expand(bs, ndt, kvh, dk)
    locs = r2t[rpi, ctx:ctx + ndt].long()  # [bs, ndt]
    k_buf[locs] = (k_buf[locs].float() + add).to(k_buf.dtype)


def chain_reference(q, k_buf, v_buf, r2t, rpi, seq, ndt: int, sm_scale: float, shift: int = 0) -> torch.Tensor:
    """float32 attention of the topk-1 verify chain: [T, H, Dv] for q [T = bs*ndt, H, Dk]; draft
    row j of request i attends to the keys ``req_to_token[rpi[i], : seq[i] + j + 1 + shift]``
    (its prefix and drafts 0..j; ``shift`` != 0 only to show the check catches a wrong mask),
    K/V [S, KVH, Dk/Dv] of any float dtype, read in float32."""
    t, h, dk = q.shape
    kvh, dv = k_buf.shape[1], v_buf.shape[2]
    g = h // kvh
    out = torch.empty(t, h, dv, dtype=torch.float32, device=q.device)
    for i in range(rpi.shape[0]):
        n = int(seq[i]) + ndt
        locs = r2t[int(rpi[i]), :n].long()
        kk, vv = k_buf[locs].float(), v_buf[locs].float()  # [n, kvh, d]
        qi = q[i * ndt:(i + 1) * ndt].float().view(ndt, kvh, g, dk)
        sc = torch.einsum("jkgd,nkd->jkgn", qi, kk) * sm_scale
        lim = (int(seq[i]) + 1 + shift + torch.arange(ndt, device=q.device)).clamp(max=n)  # visible keys per row
        vis = torch.arange(n, device=q.device)[None, :] < lim[:, None]  # [ndt, n]
        sc = sc.masked_fill(~vis[:, None, None, :], float("-inf"))
        o = torch.einsum("jkgn,nkd->jkgd", torch.softmax(sc, dim=-1), vv)
        out[i * ndt:(i + 1) * ndt] = o.reshape(ndt, h, dv)
    return out


def check_rows(out: torch.Tensor, ref: torch.Tensor, ndt: int) -> dict:
    """Per draft row (one token: all heads x Dv) of ``out`` against ``ref`` ([T, H, Dv]): max abs
    error, pass iff <= ATOL + RTOL * max |ref| of the row. Returns ``max_abs``, ``max_abs_by_draft``
    (ndt values: the worst request at each draft position), ``ref_max_abs``, ``worst_row``
    ([request, draft]), ``rows``, ``rows_failed``, ``nan_rows``, ``pass``, ``rtol``, ``atol``."""
    o = out.float()
    err = (o - ref).abs().flatten(1).amax(dim=1)  # [T]
    scale = ref.abs().flatten(1).amax(dim=1)
    nan = torch.isnan(o).flatten(1).any(dim=1)
    err = torch.where(nan, torch.full_like(err, float("inf")), err)
    bad = err > ATOL + RTOL * scale
    by_draft = err.view(-1, ndt).amax(dim=0)
    w = int(err.argmax())
    return dict(max_abs=float(err.max()), max_abs_by_draft=[float(x) for x in by_draft],
                ref_max_abs=float(scale.max()), worst_row=[w // ndt, w % ndt], rows=int(err.numel()),
                rows_failed=int(bad.sum()), nan_rows=int(nan.sum()), **{"pass": not bool(bad.any())},
                rtol=RTOL, atol=ATOL)


def upstream_layout(r2t, k_buf, v_buf, bs: int, ctx: int, ndt: int, device):
    """The TARGET_VERIFY inputs of SGLang's extend-shaped kernels for the same batch: draft K/V
    [T, KVH, D] gathered from the pool, kv_indptr [bs+1] int32 and flat kv_indices [bs*ctx] int64
    of the prefixes, qo_indptr [bs+1] int32, the FULL chain mask (uint8, ndt x (ctx + ndt) per
    request) and its mask_indptr [bs+1] int64. Built once, outside every timed call."""
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
    return k_ext, v_ext, kv_indptr, kv_indices, qo_indptr, custom_mask, mask_indptr


def decode_ms(s, inputs, ndt, device="cuda", rep=100):
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
    return bench(f, rep)
