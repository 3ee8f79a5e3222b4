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

Test faults (tests only): ``chain_verify_attention_fwd(..., fault=NAME)`` with a name of
:data:`TEST_FAULTS` computes that wrong attention (``causal_plus_one``, ``causal_minus_one``,
``drop_first_split``, ``middle_page_entry``, ``drop_middle_split`` on verify launches; their
``draft_extend_`` namesakes of the first three on draft-extend launches), so that a server test
can show it changes output tokens; ``fault=None`` (the default) launches the same build as a
kernel without the switch. :mod:`sglang_verify_graph.kernel.faults` states the arithmetic of each
(a contract that :func:`chain_verify_attention_ref` computes and test models simulate). The
kernel reads no environment variable: the chain backends pass the fault their config parsed
(``SGLANG_VERIFY_GRAPH_TEST_FAULT``, ``sglang_verify_graph.env``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from sglang_verify_graph.kernel.faults import (  # noqa: F401 (TEST_FAULTS: the kernel's API)
    DRAFT_EXTEND_TEST_FAULTS,
    TEST_FAULTS,
    check_test_fault,
    visible_columns,
)
from sglang_verify_graph.kernel.triton_chain import _chain_verify_stage1, _chain_verify_stage2

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
        32 is the register cap (MLA's 512-wide fp32 accumulator), so 40 and 48 rows (5 and 6 draft
        tokens x 8 MLA heads) take three 16-row blocks (48 rows) rather than two 32-row blocks (64).
        """
        if self.block_rows:
            return self.block_rows
        return min(sorted(BLOCK_R_CHOICES, reverse=True), key=lambda b: triton.cdiv(self.rows, b) * b)

    @property
    def row_blocks(self) -> int:
        return triton.cdiv(self.rows, self.block_r)


def choose_num_kv_splits(shape: ChainVerifyShape, bs: int, num_sms: int,
                         override: int | None = None) -> int:
    """Splits per request for a batch of ``bs`` requests: a power of two in
    [1, ``MAX_KV_SPLITS``], or ``override`` (a user's count) clamped to that range.

    Chosen so stage 1 launches about ``PROGRAMS_PER_SM * num_sms`` programs; at run time each
    request uses ``min(num_kv_splits, cdiv(seq_len + ndt, MIN_KEYS_PER_SPLIT))`` of them. Depends
    only on ``bs`` (a Python int), so it is fixed per captured bucket.
    """
    if override:
        return max(1, min(MAX_KV_SPLITS, int(override)))
    base = max(1, bs * shape.num_kv_heads * shape.row_blocks)
    want = max(1, math.ceil(PROGRAMS_PER_SM * num_sms / base))
    return max(1, min(MAX_KV_SPLITS, triton.next_power_of_2(want)))


def workspace_numel(shape: ChainVerifyShape, bs: int, num_kv_splits: int) -> tuple[int, int]:
    """Elements of the fp32 partial-output and LSE buffers for ``bs`` requests."""
    t = bs * shape.num_draft_tokens
    return t * shape.num_q_heads * num_kv_splits * shape.head_dim_v, t * shape.num_q_heads * num_kv_splits


def launch_config(shape: ChainVerifyShape, use_cap: bool = False,
                  chain_in_seq: bool = False) -> tuple[dict, dict]:
    """Constexprs and launch options of stage 1 and stage 2 for ``shape`` (new dicts, the keyword
    arguments of the two launches). ``use_cap``: a logit soft cap is set; ``chain_in_seq``: the
    ``seq_lens_include_chain`` lengths. Stage 1's ``num_stages`` is ``STAGE1_NUM_STAGES[0]``; the
    launcher lowers it on a device that cannot hold that build (``choose_num_stages``). Stage 1
    runs 4 warps and 64-key blocks (32 when a head dim is 256 or wider) for every shape."""
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


def _workspace_views(q, k_buffer, v_buffer, o, req_pool_indices, shape: ChainVerifyShape,
                     num_kv_splits: int, att_out_flat, att_lse_flat):
    """The partial-output [T, H, splits, Dv] and LSE [T, H, splits] views of the scratch, after the
    shape checks of :func:`chain_verify_attention_fwd` (ValueError, one line, on a mismatch)."""
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
    return (att_out_flat[:n_out].view(t, h, num_kv_splits, dv),
            att_lse_flat[:n_lse].view(t, h, num_kv_splits))


def launch_with_config(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    shape: ChainVerifyShape, num_kv_splits: int, sm_scale: float,
    att_out_flat: torch.Tensor, att_lse_flat: torch.Tensor, stage1: dict, stage2: dict,
    logit_cap: float = 0.0,
) -> torch.Tensor:
    """Launch the two stages with the given keyword arguments (``stage1`` / ``stage2``: the
    constexprs and launch options, as :func:`launch_config` returns them) and no policy of its
    own; writes and returns ``o``. Arguments and errors as :func:`chain_verify_attention_fwd`."""
    att_out, att_lse = _workspace_views(q, k_buffer, v_buffer, o, req_pool_indices, shape,
                                        num_kv_splits, att_out_flat, att_lse_flat)
    t, h = att_out.shape[:2]
    grid1 = (req_pool_indices.shape[0], shape.num_kv_heads * shape.row_blocks, num_kv_splits)
    _chain_verify_stage1[grid1](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, att_out, att_lse,
        sm_scale, logit_cap,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
        att_out.stride(0), att_out.stride(1), att_out.stride(2),
        att_lse.stride(0), att_lse.stride(1),
        num_kv_splits, **stage1)
    _chain_verify_stage2[(t, h)](
        att_out, att_lse, o, seq_lens,
        att_out.stride(0), att_out.stride(1), att_out.stride(2),
        att_lse.stride(0), att_lse.stride(1), o.stride(0), o.stride(1),
        num_kv_splits, **stage2)
    return o


def chain_verify_attention_fwd(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    shape: ChainVerifyShape, num_kv_splits: int, sm_scale: float,
    att_out_flat: torch.Tensor, att_lse_flat: torch.Tensor, logit_cap: float = 0.0,
    seq_lens_include_chain: bool = False, fault: str | None = None,
) -> torch.Tensor:
    """Run the two-stage chain verify attention; writes and returns ``o`` ([T, H, Dv]).

    ``att_out_flat`` / ``att_lse_flat``: fp32 scratch with at least ``workspace_numel(...)``
    elements (static buffers under a CUDA graph). ``seq_lens_include_chain``: ``seq_lens`` holds
    the length *with* the chain (``DRAFT_EXTEND_V2``: prefix + num_draft_tokens); the kernel then
    uses ``max(seq_lens - num_draft_tokens, 0)`` as the prefix, so a padded row with SGLang's
    ``seq_len_fill_value = 1`` reads only its ``num_draft_tokens`` chain slots. ``fault``: a name
    of :data:`TEST_FAULTS` of this launch (tests only; ``kernel.faults`` states the
    arithmetic), or None (the build without the switch). Launch settings come from
    :func:`launch_config`, with stage 1's pipeline depth lowered on a device whose shared memory
    cannot hold the default (:func:`choose_num_stages`).

    Raises:
        ValueError: inconsistent shapes or strides, a workspace too small for the batch, an
            unknown ``fault``, or a fault of the other launch (a ``draft_extend_`` fault without
            ``seq_lens_include_chain``, a verify fault with it); one line each.
    """
    check_test_fault(fault, seq_lens_include_chain)
    cfg1, cfg2 = launch_config(shape, logit_cap > 0, bool(seq_lens_include_chain))
    if fault is not None:
        cfg1["FAULT"] = TEST_FAULTS[fault]
    att_out, att_lse = _workspace_views(q, k_buffer, v_buffer, o, req_pool_indices, shape,
                                        num_kv_splits, att_out_flat, att_lse_flat)
    grid1 = (req_pool_indices.shape[0], shape.num_kv_heads * shape.row_blocks, num_kv_splits)
    args1 = (q, k_buffer, v_buffer, req_to_token, req_pool_indices, seq_lens, att_out, att_lse,
             sm_scale, logit_cap,
             q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
             v_buffer.stride(0), v_buffer.stride(1), req_to_token.stride(0),
             att_out.stride(0), att_out.stride(1), att_out.stride(2),
             att_lse.stride(0), att_lse.stride(1), num_kv_splits)
    cfg1["num_stages"] = _stage1_num_stages(args1, grid1, cfg1)
    return launch_with_config(q, k_buffer, v_buffer, o, req_to_token, req_pool_indices, seq_lens,
                              shape, num_kv_splits, sm_scale, att_out_flat, att_lse_flat,
                              cfg1, cfg2, logit_cap)


def chain_verify_attention_ref(
    q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
    num_draft_tokens: int, sm_scale: float, logit_cap: float = 0.0,
    seq_lens_include_chain: bool = False, fault: str | None = None, num_kv_splits: int = 1,
) -> torch.Tensor:
    """Plain PyTorch float64 reference of the same function (slow; for tests). Returns [T, H, Dv]
    float64.

    ``fault``: a :data:`TEST_FAULTS` name of this launch (or None), computed as
    :mod:`sglang_verify_graph.kernel.faults` states (``visible_columns``); ``num_kv_splits``: the
    launch's split count (the split faults need it). A row left no visible key is NaN, as the
    kernel's. Raises ValueError (one line) as :func:`chain_verify_attention_fwd` does for
    ``fault``."""
    check_test_fault(fault, seq_lens_include_chain, "chain verify reference")
    t, h, _ = q.shape
    kvh = k_buffer.shape[1]
    out = torch.empty(t, h, v_buffer.shape[2], dtype=torch.float64, device=q.device)
    for i in range(req_pool_indices.shape[0]):
        row = req_to_token[int(req_pool_indices[i])]
        prefix = int(seq_lens[i])
        if seq_lens_include_chain:
            prefix = max(prefix - num_draft_tokens, 0)
        for jj in range(num_draft_tokens):
            cols = visible_columns(prefix, num_draft_tokens, jj, num_kv_splits, MIN_KEYS_PER_SPLIT, fault)
            locs = row[cols].long()
            tt = i * num_draft_tokens + jj
            for hh in range(h):
                if not cols:
                    out[tt, hh] = float("nan")
                    continue
                g = hh // (h // kvh)
                s = (k_buffer[locs, g].double() @ q[tt, hh].double()) * sm_scale
                if logit_cap > 0:
                    s = logit_cap * torch.tanh(s / logit_cap)
                out[tt, hh] = torch.softmax(s, 0) @ v_buffer[locs, g].double()
    return out
