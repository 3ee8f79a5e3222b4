"""Split-KV attention for the EAGLE topk=1 verify *chain*, reading the page table directly.

Problem. In ``ForwardMode.TARGET_VERIFY`` with ``speculative_eagle_topk == 1`` every request
``i`` carries ``num_draft_tokens = num_steps + 1`` query tokens (the bonus token and the drafts)
at positions ``seq_lens[i] .. seq_lens[i] + num_draft_tokens - 1``. Draft position ``j`` sees the
``seq_lens[i] + j + 1`` keys ``req_to_token[req_pool_indices[i], 0 : seq_lens[i] + j + 1]``: the
tree is a causal chain, so no tree mask is needed. The caller writes the draft tokens' K/V into
the KV pool at ``out_cache_loc`` (= ``req_to_token[req, seq_lens : seq_lens + num_draft_tokens]``)
before calling this kernel, exactly as the eager verify does.

SGLang 0.5.16's triton verify runs ``extend_attention_fwd`` with grid
``(bs, heads, cdiv(ndt, BLOCK_M))`` and no KV split: 8 thread blocks at bs 1 for a Kimi TP-8
shard on a 132-SM H200, each reading the whole context
(``sglang/kernels/ops/attention/extend_attention.py``). SGLang's own split-KV verify kernel
(``sglang/kernels/ops/attention/verify_splitkv.py``) is gated to AMD gfx95, runs one program per
*query head* (re-reading the KV of a GQA group, or MLA's shared latent, once per head), needs a
flat ``kv_indices`` array rebuilt for every replay, and does not mask non power-of-two head dims
(so it cannot serve MLA's 576-wide latent).

This kernel is decode-class instead (flash-decoding, as in SGLang's grouped decode kernel and
FlashMLA's q_len folding): grid ``(bs, kv_heads * row_blocks, num_kv_splits)``; each program
holds ``BLOCK_R`` (16 or 32) of the ``num_draft_tokens x (q_heads / kv_heads)`` query rows of one
KV head in one tile (``ChainVerifyShape.block_r``, the size that pads least; a chain of more rows
takes several row blocks, each reading the KV of its split again: MLA with 8 heads at 5-8 draft
tokens runs three 16-row blocks at 5-6 tokens and two 32-row blocks at 7-8), so each KV block
is read once per split and row block for the whole chain; rows are masked per draft position
(causal chain); the KV slot of each key is read from ``req_to_token`` itself, so no per-replay
index building is needed and the only per-replay metadata are ``req_pool_indices`` and
``seq_lens`` (already in the graph's static buffers). Stage 2 merges the splits by log-sum-exp.

Shapes and dtypes (``T = bs * num_draft_tokens``):
  q            [T, H, Dk]    bf16/fp16/fp32 (any strides with unit last-dim stride)
  k_buffer     [S, KVH, Dk]  KV pool keys for this layer (same dtype as q)
  v_buffer     [S, KVH, Dv]  KV pool values (for MLA a view of the latent: Dv = kv_lora_rank)
  o            [T, H, Dv]    output, q's dtype
  req_to_token [P, max_ctx]  int32 page table (page size 1 slot ids)
  req_pool_indices [bs] int64, seq_lens [bs] int32/int64: prefix length without drafts
Padded rows (``raw_bs <= row < bs``) may hold any ``req_pool_indices`` row and ``seq_lens >= 1``
whose first ``seq_lens + num_draft_tokens`` page-table entries are valid slot ids (SGLang pads
with row 0 and ``seq_len_fill_value = 1``): they read valid slots and never touch real rows.

Test fault switch (tests only): ``SGLANG_VERIFY_GRAPH_TEST_FAULT`` (:data:`TEST_FAULT_ENV`, read
once, at the first launch of the process) set to ``causal_plus_one`` (draft position ``j`` also
sees key ``seq_lens + j + 1``, within the chain), ``causal_minus_one`` (it does not see its own
key) or ``drop_first_split`` (a request with more than one KV split does not read the keys of
its first split) makes the verify launches (``seq_lens_include_chain=False``) compute that wrong
attention, so that a test can show it changes output tokens. The draft-extend launches are never
faulted (their callers' tests stay independent of it). Unset or empty: the constexpr ``FAULT`` is
not passed, the same build as without the switch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Keys per split never go below this (tokens): short contexts use fewer splits.
MIN_KEYS_PER_SPLIT = 64
# Upper bound on splits per request (keeps the fp32 partials buffer small).
MAX_KV_SPLITS = 64
# Aim for this many programs per SM in stage 1 (2 waves on an H200's 132 SMs).
PROGRAMS_PER_SM = 2
# Query rows per program (``BLOCK_R``) the kernel is built for: tl.dot needs >= 16, and 32 is the
# register cap with MLA's 512-wide fp32 accumulator.
BLOCK_R_CHOICES = (16, 32)
# Software-pipeline depths of stage 1, preferred first: 2 is the measured H200 choice. A device whose
# shared memory per block cannot hold that build gets the next (same arithmetic, no prefetch of the
# next key block): MLA's 512-wide latent at 32 rows takes 106 KB at 2 stages and 70 KB at 1 with
# Triton 3.6 and 3.8, and sm_86/89/120 parts offer 99 KB (test/cpu/test_chain_kernel_arch_fit.py).
STAGE1_NUM_STAGES = (2, 1)

TEST_FAULT_ENV = "SGLANG_VERIFY_GRAPH_TEST_FAULT"
"""Environment variable of the test fault switch (module docstring)."""
TEST_FAULTS = {"causal_plus_one": 1, "causal_minus_one": 2, "drop_first_split": 3}
"""Test fault name -> stage 1's ``FAULT`` constexpr (0: no fault)."""


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
    CHAIN_IN_SEQ: tl.constexpr, V_FROM_K: tl.constexpr = False, FAULT: tl.constexpr = 0,
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
    if FAULT == 3:  # test fault drop_first_split: the first of several splits reads no key
        end = tl.where((split == 0) & (eff_splits > 1), start, end)

    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < NDT * GROUP
    j = rows // GROUP
    tok = b * NDT + j
    head = kvh * GROUP + rows % GROUP
    limit = prefix + j + 1  # keys [0, limit) are visible to draft position j
    if FAULT == 1:  # test fault causal_plus_one (keys past the chain stay unread: end <= total)
        limit = limit + 1
    if FAULT == 2:  # test fault causal_minus_one
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
            loc = tl.load(Req_to_token + req * stride_r2t + offs_n, mask=n_ok, other=0).to(tl.int64)
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
            if V_FROM_K:  # V is the first LV columns of K (MLA's latent): reuse the loaded tile
                v = tl.trans(k)
            else:
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


@dataclass(frozen=True)
class ChainVerifyShape:
    """Static shape of one attention layer's chain verify (one per model, set at capture).

    num_q_heads / num_kv_heads: heads of this TP rank; head_dim_qk (Dk) and head_dim_v (Dv) in
    elements; rope_dim: trailing part of Dk loaded as a separate tile (MLA: 64, else 0);
    num_draft_tokens: tokens per request (num_steps + 1); block_rows: query rows per program, 16
    or 32, or 0 (default) for the policy of ``block_r``. Raises ValueError on any other value.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    num_draft_tokens: int
    rope_dim: int = 0
    block_rows: int = 0

    def __post_init__(self):
        if type(self.block_rows) is not int or self.block_rows not in (0,) + BLOCK_R_CHOICES:
            raise ValueError(f"ChainVerifyShape.block_rows={self.block_rows}: use 0 (policy) or one "
                             f"of {BLOCK_R_CHOICES}")

    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def rows(self) -> int:
        """Query rows per (request, KV head): num_draft_tokens x GQA group."""
        return self.num_draft_tokens * self.group

    @property
    def block_r(self) -> int:
        """Query rows per program (``BLOCK_R``): ``block_rows`` if set, else whichever of 16 and 32
        pads ``rows`` to the fewest rows, 32 on a tie (fewer row blocks, so fewer KV re-reads).

        32 is the cap for registers (MLA's 512-wide fp32 accumulator). So 40 and 48 rows (5 and 6
        draft tokens x 8 MLA heads) take three 16-row blocks (48 rows) instead of two 32-row blocks
        (64). Measured (docs/benchmarks.md 11.4, one H200, Kimi TP-8 shard, with the split count
        ``choose_num_kv_splits`` gives each tiling): faster at 12 of 18 op points (up to 22% less
        time), slower at 5 (up to 12% more: bs 1 at 4k/16k, 16k bs 32 with 5 tokens); the engine's
        6-token verify 4-8% faster at bs 16-32 and at 4k/16k bs 8, unchanged at bs 1.
        """
        if self.block_rows:
            return self.block_rows
        return min(sorted(BLOCK_R_CHOICES, reverse=True), key=lambda b: triton.cdiv(self.rows, b) * b)

    @property
    def row_blocks(self) -> int:
        return triton.cdiv(self.rows, self.block_r)


def choose_num_kv_splits(shape: ChainVerifyShape, bs: int, num_sms: int,
                         override: int | None = None, programs_per_sm: int = PROGRAMS_PER_SM,
                         max_splits: int = MAX_KV_SPLITS) -> int:
    """Splits per request for a batch of ``bs`` requests (a power of two in [1, max_splits]).

    Chosen so stage 1 launches about ``programs_per_sm * num_sms`` programs; at run time each
    request uses ``min(num_kv_splits, cdiv(seq_len + ndt, MIN_KEYS_PER_SPLIT))`` of them. Depends
    only on ``bs`` (a Python int), so it is fixed per captured bucket. ``programs_per_sm`` and
    ``max_splits`` default to the module's policy (``PROGRAMS_PER_SM``, ``MAX_KV_SPLITS``); the
    kernel benchmark's tuning mode varies them.
    """
    if override:
        return max(1, min(max_splits, int(override)))
    base = max(1, bs * shape.num_kv_heads * shape.row_blocks)
    want = max(1, math.ceil(programs_per_sm * num_sms / base))
    return max(1, min(max_splits, triton.next_power_of_2(want)))


def workspace_numel(shape: ChainVerifyShape, bs: int, num_kv_splits: int) -> tuple[int, int]:
    """Elements of the fp32 partial-output and LSE buffers for ``bs`` requests."""
    t = bs * shape.num_draft_tokens
    return t * shape.num_q_heads * num_kv_splits * shape.head_dim_v, t * shape.num_q_heads * num_kv_splits


def launch_config(shape: ChainVerifyShape, use_cap: bool = False,
                  chain_in_seq: bool = False) -> tuple[dict, dict]:
    """Constexprs and launch options of stage 1 and stage 2 for ``shape`` (new dicts, the keyword
    arguments of the two launches). ``use_cap``: a logit soft cap is set; ``chain_in_seq``: the
    ``seq_lens_include_chain`` lengths. Stage 1's ``num_stages`` is ``STAGE1_NUM_STAGES[0]``; the
    launcher lowers it on a device that cannot hold that build (``choose_num_stages``).

    Stage 1 runs 4 warps for every shape: with MLA's 512-wide latent, 4 warps x 32-key blocks took
    0.61-0.84x the time of 8 warps at bs 8-32 on the H200 (Kimi TP-8 shard, 3-4 draft tokens,
    1k-16k; ``bench_chain_kernel.py --tune``, docs/benchmarks.md section 10)."""
    block_dpe = shape.rope_dim
    block_d = triton.next_power_of_2(shape.head_dim_qk - block_dpe)
    block_dv = triton.next_power_of_2(shape.head_dim_v)
    big = block_d >= 256 or block_dv >= 256
    stage1 = dict(
        NDT=shape.num_draft_tokens, GROUP=shape.group, ROW_BLOCKS=shape.row_blocks,
        BLOCK_R=shape.block_r, BLOCK_N=32 if big else 64,
        BLOCK_D=block_d, BLOCK_DPE=block_dpe, BLOCK_DV=block_dv,
        LK=shape.head_dim_qk, LV=shape.head_dim_v,
        MIN_SPLIT=MIN_KEYS_PER_SPLIT, USE_CAP=bool(use_cap), CHAIN_IN_SEQ=bool(chain_in_seq),
        num_warps=4, num_stages=STAGE1_NUM_STAGES[0],
    )
    stage2 = dict(
        NDT=shape.num_draft_tokens, BLOCK_DV=block_dv, LV=shape.head_dim_v,
        MIN_SPLIT=MIN_KEYS_PER_SPLIT, CHAIN_IN_SEQ=bool(chain_in_seq),
        num_warps=4 if block_dv >= 256 else 2, num_stages=1,
    )
    return stage1, stage2


def choose_num_stages(shared_bytes, max_shared_mem: int) -> int:
    """Stage 1's ``num_stages`` for a device with ``max_shared_mem`` bytes of shared memory per
    block: the first of ``STAGE1_NUM_STAGES`` whose build fits (``shared_bytes(n)``: the compiled
    kernel's ``metadata.shared`` at ``num_stages=n``), else the last (whose launch Triton then
    refuses with OutOfResources, as it would any build that does not fit)."""
    for n in STAGE1_NUM_STAGES[:-1]:
        if shared_bytes(n) <= max_shared_mem:
            return n
    return STAGE1_NUM_STAGES[-1]


# (device, dtypes, stage-1 config) -> the num_stages chosen there; filled on first use.
_STAGE1_STAGES: dict = {}


def _stage1_num_stages(args: tuple, grid: tuple, cfg: dict) -> int:
    """``choose_num_stages`` for the current device, once per device, dtypes and configuration
    (it compiles without launching: Triton keeps the build for the launch that follows). Off a
    GPU (CPU tensors, TRITON_INTERPRET) the default ``cfg["num_stages"]``."""
    q, k_buffer, v_buffer = args[:3]
    if not q.is_cuda or not isinstance(_chain_verify_stage1, triton.runtime.JITFunction):
        return cfg["num_stages"]
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    key = (device, q.dtype, k_buffer.dtype, v_buffer.dtype, tuple(cfg.items()))
    n = _STAGE1_STAGES.get(key)
    if n is None:
        max_shared = driver.utils.get_device_properties(device)["max_shared_mem"]
        n = choose_num_stages(
            lambda s: _chain_verify_stage1.warmup(*args, grid=grid, **{**cfg, "num_stages": s}).metadata.shared,
            max_shared)
        _STAGE1_STAGES[key] = n
    return n


def parse_test_fault(raw: str | None) -> int:
    """The ``FAULT`` constexpr for a value of :data:`TEST_FAULT_ENV` (None or blank: 0).
    Raises ValueError, one line naming the variable and the valid values, on any other value."""
    value = (raw or "").strip()
    if not value:
        return 0
    if value not in TEST_FAULTS:
        raise ValueError(f"{TEST_FAULT_ENV}={raw!r}: use one of {', '.join(TEST_FAULTS)}, or unset "
                         f"it (a test-only fault of the chain verify attention)")
    return TEST_FAULTS[value]


_TEST_FAULT: list = []  # the parsed switch, once per process


def read_test_fault() -> int:
    """:func:`parse_test_fault` of the environment, read at the first call only."""
    if not _TEST_FAULT:
        _TEST_FAULT.append(parse_test_fault(os.environ.get(TEST_FAULT_ENV)))
    return _TEST_FAULT[0]




def v_is_k_prefix(k_buffer: torch.Tensor, v_buffer: torch.Tensor, shape: ChainVerifyShape) -> bool:
    """True when ``v_buffer`` is the first ``head_dim_v`` columns of ``k_buffer`` (MLA's latent:
    SGLang's MLA pool hands the kernel ``k_buffer[..., :kv_lora_rank]`` as the values) and those are
    exactly the non-rope part of the key, so stage 1 can reuse the loaded key tile as ``V``."""
    return (v_buffer.data_ptr() == k_buffer.data_ptr()
            and v_buffer.stride()[:2] == k_buffer.stride()[:2]
            and shape.head_dim_v == shape.head_dim_qk - shape.rope_dim
            and triton.next_power_of_2(shape.head_dim_v) == shape.head_dim_v)


def chain_verify_attention_fwd(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    shape: ChainVerifyShape, num_kv_splits: int, sm_scale: float,
    att_out_flat: torch.Tensor, att_lse_flat: torch.Tensor, logit_cap: float = 0.0,
    seq_lens_include_chain: bool = False, stage1_overrides: dict | None = None,
) -> torch.Tensor:
    """Run the two-stage chain verify attention; writes and returns ``o`` ([T, H, Dv]).

    ``att_out_flat`` / ``att_lse_flat``: fp32 scratch with at least ``workspace_numel(...)``
    elements (static buffers under a CUDA graph). ``seq_lens_include_chain``: ``seq_lens`` holds
    the length *with* the chain (``DRAFT_EXTEND_V2``: prefix + num_draft_tokens); the kernel then
    uses ``max(seq_lens - num_draft_tokens, 0)`` as the prefix, so a padded row with SGLang's
    ``seq_len_fill_value = 1`` reads only its ``num_draft_tokens`` chain slots. Raises ValueError
    on inconsistent shapes. ``stage1_overrides``: stage-1 launch settings replacing
    ``launch_config``'s (keys ``BLOCK_N``, ``num_warps``, ``num_stages``, ``V_FROM_K``; for the kernel
    benchmark's tuning mode); ``V_FROM_K`` needs ``v_buffer`` to be the first ``Dv`` columns of
    ``k_buffer`` with ``Dv == Dk - rope_dim`` (ValueError otherwise). With :data:`TEST_FAULT_ENV`
    set, a launch with ``seq_lens_include_chain=False`` computes that test fault (module
    docstring); an unknown value raises ValueError at the first launch.
    """
    bs = req_pool_indices.shape[0]
    t = bs * shape.num_draft_tokens
    h, dk, dv = shape.num_q_heads, shape.head_dim_qk, shape.head_dim_v
    if q.shape[0] != t or q.shape[1] != h or q.shape[2] != dk or o.shape[0] != t:
        raise ValueError(f"chain verify: q {tuple(q.shape)} / o {tuple(o.shape)} do not match "
                         f"bs={bs} x num_draft_tokens={shape.num_draft_tokens}, H={h}, Dk={dk}")
    if h % shape.num_kv_heads or k_buffer.shape[1] != shape.num_kv_heads:
        raise ValueError(f"chain verify: {h} query heads are not a multiple of "
                         f"{shape.num_kv_heads} KV heads (k_buffer {tuple(k_buffer.shape)})")
    bad = [n for n, x in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("o", o))
           if x.stride(-1) != 1]
    if bad:
        raise ValueError(f"chain verify: {', '.join(bad)} need a unit last-dim stride")
    n_out, n_lse = workspace_numel(shape, bs, num_kv_splits)
    if att_out_flat.numel() < n_out or att_lse_flat.numel() < n_lse:
        raise ValueError("chain verify: workspace too small for this batch")
    att_out = att_out_flat[:n_out].view(t, h, num_kv_splits, dv)
    att_lse = att_lse_flat[:n_lse].view(t, h, num_kv_splits)
    cfg1, cfg2 = launch_config(shape, logit_cap > 0, bool(seq_lens_include_chain))
    overrides = dict(stage1_overrides or {})
    unknown = set(overrides) - {"BLOCK_N", "num_warps", "num_stages", "V_FROM_K"}
    if unknown:
        raise ValueError(f"chain verify: stage1_overrides {sorted(unknown)}: use BLOCK_N, num_warps, "
                         f"num_stages, V_FROM_K")
    if overrides.get("V_FROM_K") and not v_is_k_prefix(k_buffer, v_buffer, shape):
        raise ValueError("chain verify: V_FROM_K needs v_buffer = k_buffer[..., :Dv] with "
                         "Dv = Dk - rope_dim")
    cfg1.update(overrides)
    fault = read_test_fault()  # validated for every role, applied to the verify role only
    if fault and not seq_lens_include_chain:
        cfg1["FAULT"] = fault
    grid1 = (bs, shape.num_kv_heads * shape.row_blocks, num_kv_splits)
    args1 = (
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, att_out, att_lse,
        sm_scale, logit_cap,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        att_out.stride(0), att_out.stride(1), att_out.stride(2),
        att_lse.stride(0), att_lse.stride(1),
        num_kv_splits,
    )
    if "num_stages" not in overrides:
        cfg1["num_stages"] = _stage1_num_stages(args1, grid1, cfg1)
    _chain_verify_stage1[grid1](*args1, **cfg1)
    _chain_verify_stage2[(t, h)](
        att_out, att_lse, o, seq_lens,
        att_out.stride(0), att_out.stride(1), att_out.stride(2),
        att_lse.stride(0), att_lse.stride(1), o.stride(0), o.stride(1),
        num_kv_splits,
        **cfg2,
    )
    return o


def chain_verify_attention_ref(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_draft_tokens: int, sm_scale: float, logit_cap: float = 0.0,
    seq_lens_include_chain: bool = False, fault: str | None = None, num_kv_splits: int = 1,
) -> torch.Tensor:
    """Plain PyTorch float64 reference of the same function (slow; for tests). Returns [T, H, Dv].

    ``fault``: one of :data:`TEST_FAULTS` (or None), computed as the kernel's test fault switch
    computes it (not for ``seq_lens_include_chain``); ``drop_first_split`` needs the launch's
    ``num_kv_splits``. Raises ValueError for another fault name."""
    if fault is not None and fault not in TEST_FAULTS:
        raise ValueError(f"chain verify reference: fault {fault!r}: use one of {', '.join(TEST_FAULTS)}")
    if seq_lens_include_chain:
        fault = None
    t, h, _ = q.shape
    kvh = k_buffer.shape[1]
    out = torch.empty(t, h, v_buffer.shape[2], dtype=torch.float64, device=q.device)
    for i in range(req_pool_indices.shape[0]):
        row = req_to_token[int(req_pool_indices[i])]
        for jj in range(num_draft_tokens):
            prefix = int(seq_lens[i])
            if seq_lens_include_chain:
                prefix = max(prefix - num_draft_tokens, 0)
            n = prefix + jj + 1
            first = 0
            if fault == "causal_plus_one":
                n = min(n + 1, prefix + num_draft_tokens)
            elif fault == "causal_minus_one":
                n -= 1
            elif fault == "drop_first_split":
                total = prefix + num_draft_tokens
                eff = min(num_kv_splits, -(-total // MIN_KEYS_PER_SPLIT))
                first = -(-total // eff) if eff > 1 else 0
            locs = row[first:n].long()
            tt = i * num_draft_tokens + jj
            for hh in range(h):
                g = hh // (h // kvh)
                s = (k_buffer[locs, g].double() @ q[tt, hh].double()) * sm_scale
                if logit_cap > 0:
                    s = logit_cap * torch.tanh(s / logit_cap)
                out[tt, hh] = torch.softmax(s, 0) @ v_buffer[locs, g].double()
    return out
