"""The two Triton programs of the chain verify attention (launched by
:mod:`sglang_verify_graph.kernel.chain_verify_attention`, which states the problem, the shapes and
the launch policy).

Stage 1, grid ``(bs, kv_heads * ROW_BLOCKS, num_splits)``: one program holds ``BLOCK_R`` query
rows (draft position x GQA head) of one KV head and one KV split, reads each key's slot from
``req_to_token`` and writes the split's normalised partial output ``Att_Out`` [T, H, splits, Dv]
(fp32) and its log-sum-exp ``Att_Lse`` [T, H, splits] (fp32; ``-inf`` for a split with no visible
key). Stage 2, grid ``(T, H)``: merges a row's splits by log-sum-exp into ``O`` [T, H, Dv].

``FAULT`` (stage 1, tests only; 0: none; the launcher maps the fault names,
:mod:`sglang_verify_graph.kernel.faults` states their arithmetic): 1 causal plus
one (draft position ``j`` also sees key ``prefix + j + 1``, keys past the chain stay unread), 2
causal minus one (it does not see its own key ``prefix + j``), 3 drop first split (a request with
``eff_splits > 1`` reads no key of split 0), 4 middle page entry (a request with ``prefix > 0``
reads the key and value of position ``prefix // 2`` from the slot ``req_to_token[req, prefix // 2
+ 1]``), 5 drop middle split (a request with ``eff_splits >= 3`` reads no key of split
``eff_splits // 2``). Codes 1-3 serve the verify and the draft-extend (``CHAIN_IN_SEQ``) faults
alike, with ``prefix`` the launch's own; ``FAULT == 0`` takes none of the fault branches.
"""

import triton
import triton.language as tl


@triton.jit
def _chain_verify_stage1(
    Q, K_Buffer, V_Buffer, Req_to_token, Req_pool_indices, Seq_lens,
    Att_Out, Att_Lse,
    sm_scale, logit_cap,
    stride_qt, stride_qh,
    stride_kbs, stride_kh,
    stride_vbs, stride_vh,
    stride_r2t,
    stride_ot, stride_oh, stride_os,
    stride_lt, stride_lh,
    num_splits,
    NDT: tl.constexpr, GROUP: tl.constexpr, ROW_BLOCKS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DPE: tl.constexpr, BLOCK_DV: tl.constexpr,
    LK: tl.constexpr, LV: tl.constexpr, MIN_SPLIT: tl.constexpr, USE_CAP: tl.constexpr,
    CHAIN_IN_SEQ: tl.constexpr, FAULT: tl.constexpr = 0,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1) // ROW_BLOCKS
    rb = tl.program_id(1) % ROW_BLOCKS
    split = tl.program_id(2)

    req = tl.load(Req_pool_indices + b)
    prefix = tl.load(Seq_lens + b).to(tl.int32)
    if CHAIN_IN_SEQ:
        prefix = tl.maximum(prefix - NDT, 0)
    total = prefix + NDT
    eff_splits = tl.minimum(num_splits, tl.cdiv(total, MIN_SPLIT))
    split_len = tl.cdiv(total, eff_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, total)
    if FAULT == 3:  # test fault drop first split: the first of several splits reads no key
        end = tl.where((split == 0) & (eff_splits > 1), start, end)
    if FAULT == 5:  # test fault drop middle split: split eff_splits // 2 of >= 3 reads no key
        end = tl.where((split == eff_splits // 2) & (eff_splits >= 3), start, end)

    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < NDT * GROUP
    j = rows // GROUP
    tok = b * NDT + j
    head = kvh * GROUP + rows % GROUP
    limit = prefix + j + 1  # keys [0, limit) are visible to draft position j
    if FAULT == 1:  # test fault causal plus one (keys past the chain stay unread: end <= total)
        limit = limit + 1
    if FAULT == 2:  # test fault causal minus one
        limit = limit - 1

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < (LK - BLOCK_DPE)
    dv_ok = offs_dv < LV
    q_ptr = Q + tok[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptr + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if BLOCK_DPE > 0:
        offs_pe = (LK - BLOCK_DPE) + tl.arange(0, BLOCK_DPE)
        q_pe = tl.load(q_ptr + offs_pe[None, :], mask=row_ok[:, None], other=0.0)

    e_max = tl.zeros([BLOCK_R], dtype=tl.float32) - float("inf")
    e_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    if split < eff_splits:
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < end
            col = offs_n
            if FAULT == 4:  # test fault middle page entry: position prefix // 2 reads the next slot
                col = tl.where((offs_n == prefix // 2) & (prefix > 0), offs_n + 1, offs_n)
            loc = tl.load(Req_to_token + req * stride_r2t + col, mask=n_ok, other=0).to(tl.int64)
            k = tl.load(
                K_Buffer + loc[None, :] * stride_kbs + kvh * stride_kh + offs_d[:, None],
                mask=n_ok[None, :] & d_ok[:, None], other=0.0,
            )
            qk = tl.dot(q, k.to(q.dtype))
            if BLOCK_DPE > 0:
                k_pe = tl.load(
                    K_Buffer + loc[None, :] * stride_kbs + kvh * stride_kh + offs_pe[:, None],
                    mask=n_ok[None, :], other=0.0,
                )
                qk += tl.dot(q_pe, k_pe.to(q_pe.dtype))
            qk *= sm_scale
            if USE_CAP:
                qk = logit_cap * (2.0 / (1.0 + tl.exp(-2.0 * qk / logit_cap)) - 1.0)
            vis = (offs_n[None, :] < limit[:, None]) & n_ok[None, :] & row_ok[:, None]
            qk = tl.where(vis, qk, -1.0e30)
            n_e_max = tl.maximum(tl.max(qk, 1), e_max)
            re_scale = tl.exp(e_max - n_e_max)
            p = tl.where(vis, tl.exp(qk - n_e_max[:, None]), 0.0)
            v = tl.load(
                V_Buffer + loc[:, None] * stride_vbs + kvh * stride_vh + offs_dv[None, :],
                mask=n_ok[:, None] & dv_ok[None, :], other=0.0,
            )
            acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v)
            e_sum = e_sum * re_scale + tl.sum(p, 1)
            e_max = n_e_max
        has = e_sum > 0.0
        out = acc / tl.where(has, e_sum, 1.0)[:, None]
        lse = tl.where(has, e_max + tl.log(tl.where(has, e_sum, 1.0)), float("-inf"))
        o_ptr = Att_Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + split * stride_os
        tl.store(o_ptr + offs_dv[None, :], out, mask=row_ok[:, None] & dv_ok[None, :])
        tl.store(Att_Lse + tok * stride_lt + head * stride_lh + split, lse, mask=row_ok)


@triton.jit
def _chain_verify_stage2(
    Att_Out, Att_Lse, O, Seq_lens,
    stride_ot, stride_oh, stride_os,
    stride_lt, stride_lh,
    stride_obs, stride_oh_out,
    num_splits,
    NDT: tl.constexpr, BLOCK_DV: tl.constexpr, LV: tl.constexpr, MIN_SPLIT: tl.constexpr,
    CHAIN_IN_SEQ: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    prefix = tl.load(Seq_lens + tok // NDT).to(tl.int32)
    if CHAIN_IN_SEQ:
        prefix = tl.maximum(prefix - NDT, 0)
    total = prefix + NDT
    eff_splits = tl.minimum(num_splits, tl.cdiv(total, MIN_SPLIT))
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < LV
    m = float("-inf")
    s = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for sp in range(0, eff_splits):
        lse = tl.load(Att_Lse + tok * stride_lt + head * stride_lh + sp)
        o = tl.load(Att_Out + tok * stride_ot + head * stride_oh + sp * stride_os + offs_dv,
                    mask=dv_ok, other=0.0)
        n_m = tl.maximum(m, lse)
        w_old = tl.where(m > float("-inf"), tl.exp(m - n_m), 0.0)
        w_new = tl.where(lse > float("-inf"), tl.exp(lse - n_m), 0.0)
        acc = acc * w_old + o * w_new
        s = s * w_old + w_new
        m = n_m
    tl.store(O + tok * stride_obs + head * stride_oh_out + offs_dv,
             (acc / s).to(O.dtype.element_ty), mask=dv_ok)
