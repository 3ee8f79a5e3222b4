"""Split-KV attention for the EAGLE topk == 1 target verify (a causal chain of draft tokens),
reading the page table directly.

With ``speculative_eagle_topk == 1`` the draft tree is a chain: request ``i`` verifies
``num_draft_tokens`` query tokens at positions ``seq_lens[i] .. seq_lens[i] + num_draft_tokens -
1`` (the bonus token and the drafts), and draft position ``j`` sees the ``seq_lens[i] + j + 1``
keys ``req_to_token[req_pool_indices[i], : seq_lens[i] + j + 1]``, so no tree mask is needed.
The caller writes the draft tokens' K/V into the pool (``out_cache_loc``, which is
``req_to_token[req, seq_lens : seq_lens + num_draft_tokens]``) before the call, as the Triton
backend does for every extend.

The kernel is decode-class (flash-decoding). Stage 1, grid ``(bs, kv_heads * row_blocks,
num_kv_splits)``: one program holds ``BLOCK_R`` (16 or 32) of the ``num_draft_tokens x
(q_heads / kv_heads)`` query rows of one KV head (absorbed MLA: every head on the shared latent),
so each KV block is read once per split and row block for the whole chain; the causal limit is
applied per draft position; each key's slot is read from ``req_to_token`` (no ``kv_indices``).
It writes a normalised partial output and its log-sum-exp per split (fp32). Stage 2, grid
``(T, H)``, merges the splits by log-sum-exp.

Shapes and dtypes (``T = bs * num_draft_tokens``):
  q                 [T, H, Dk]     bf16 / fp16 / fp32, unit last-dim stride
  k_buffer          [S, KVH, Dk]   the layer's KV-pool keys, q's dtype
  v_buffer          [S, KVH, Dv]   the layer's KV-pool values (MLA: a view of the latent, Dv 512)
  o                 [T, H, Dv]     output, q's dtype
  req_to_token      [P, max_ctx]   int32 slot ids
  req_pool_indices  [bs]           int64
  seq_lens          [bs]           int32 / int64: the prefix length without the chain (target
                                   verify), or with it (``seq_lens_include_chain``, the draft's
                                   ``DRAFT_EXTEND_V2``: prefix = ``max(seq_lens - ndt, 0)``)
Padded rows of a CUDA-graph batch may hold any ``req_pool_indices`` row whose first ``seq_lens
+ num_draft_tokens`` page-table entries are valid slot ids (SGLang pads ``seq_lens`` with 1):
they read valid slots and write only their own output rows.

:func:`chain_verify_fwd` is the backend's entry point: like ``verify_splitkv_fwd`` it returns
False, writing nothing, for a call it does not serve (:func:`can_handle`), and the caller then
runs ``extend_attention_fwd``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# <kernel-body>

# Widest head dim (Dk without its rope tail, and Dv) a stage-1 tile holds.
MAX_TILE_DIM = 512


@functools.lru_cache(maxsize=None)
def chain_verify_shape(
    num_q_heads: int,
    num_kv_heads: int,
    head_dim_qk: int,
    head_dim_v: int,
    num_draft_tokens: int,
) -> ChainVerifyShape:
    """The :class:`ChainVerifyShape` of a layer with these ints (its rope tile from
    :func:`rope_tile`), built once per distinct shape. Raises ValueError as the class does."""
    return ChainVerifyShape(
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim_qk=head_dim_qk,
        head_dim_v=head_dim_v,
        num_draft_tokens=num_draft_tokens,
        rope_dim=rope_tile(head_dim_qk),
    )


def workspace_numel_bound(
    num_q_heads: int,
    head_dim_v: int,
    num_draft_tokens: int,
    bs: int,
    max_kv_splits: int,
    num_sms: int,
) -> tuple[int, int]:
    """Elements ``(att_out, att_lse)`` of fp32 scratch that hold :func:`chain_verify_fwd`'s
    partial outputs for ``bs`` requests of any layer with ``num_q_heads`` query heads and value
    head dim ``head_dim_v`` (every KV-head count and row tiling), at most ``max_kv_splits`` splits
    on ``num_sms`` SMs. Ints in, ints out."""
    want = math.ceil(PROGRAMS_PER_SM * max(num_sms, 0) / max(bs, 1))
    splits = min(
        MAX_KV_SPLITS, max(1, max_kv_splits), triton.next_power_of_2(max(1, want))
    )
    num_tokens = bs * num_draft_tokens
    return (
        num_tokens * num_q_heads * splits * head_dim_v,
        num_tokens * num_q_heads * splits,
    )


def can_handle(
    q: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    num_draft_tokens: int,
    *,
    is_causal: bool = True,
    sliding_window_size: int = -1,
    sinks=None,
    xai_temperature_len: int = -1,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> bool:
    """Whether :func:`chain_verify_fwd` serves this call: a causal chain of
    ``num_draft_tokens`` tokens per request (``q.shape[0] == bs * num_draft_tokens``); no sinks,
    sliding window, xai temperature or non-unit KV scales; q, o and both KV buffers of one dtype
    (bf16 / fp16 / fp32: an FP8 KV cache is refused), 3-D with unit last-dim strides; whole KV
    groups; head dims a tile holds (:data:`MAX_TILE_DIM`). Reads shapes, dtypes, strides and
    Python scalars only, never tensor values, so it is safe inside CUDA-graph capture."""
    if not is_causal or sinks is not None:
        return False
    if sliding_window_size is not None and sliding_window_size > -1:
        return False
    if xai_temperature_len is not None and xai_temperature_len > 0:
        return False
    if not isinstance(k_scale, (int, float)) or not isinstance(v_scale, (int, float)):
        return False
    if k_scale != 1.0 or v_scale != 1.0:
        return False
    if any(x.dim() != 3 for x in (q, o, k_buffer, v_buffer)) or req_to_token.dim() != 2:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if any(x.dtype != q.dtype for x in (o, k_buffer, v_buffer)):
        return False
    bs = req_pool_indices.shape[0]
    if bs < 1 or num_draft_tokens < 1 or q.shape[0] != bs * num_draft_tokens:
        return False
    num_q_heads, num_kv_heads = q.shape[1], k_buffer.shape[1]
    if num_kv_heads < 1 or num_q_heads % num_kv_heads or v_buffer.shape[1] != num_kv_heads:
        return False
    head_dim_qk, head_dim_v = q.shape[2], v_buffer.shape[2]
    if k_buffer.shape[2] != head_dim_qk or tuple(o.shape) != (q.shape[0], num_q_heads, head_dim_v):
        return False
    if head_dim_v > MAX_TILE_DIM or head_dim_qk - rope_tile(head_dim_qk) > MAX_TILE_DIM:
        return False
    return all(x.stride(-1) == 1 for x in (q, o, k_buffer, v_buffer))


def chain_verify_fwd(
    q: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    num_draft_tokens: int,
    sm_scale: float,
    att_out: torch.Tensor,
    att_lse: torch.Tensor,
    *,
    max_kv_splits: int,
    num_sms: int,
    logit_cap: float = 0.0,
    seq_lens_include_chain: bool = False,
    is_causal: bool = True,
    sliding_window_size: int = -1,
    sinks=None,
    xai_temperature_len: int = -1,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> bool:
    """The chain attention of one layer for a topk == 1 target verify (or, with
    ``seq_lens_include_chain``, a ``DRAFT_EXTEND_V2``): writes ``o`` and returns True, or returns
    False, writing nothing, when :func:`can_handle` refuses the call or the scratch is too small
    (the caller then runs ``extend_attention_fwd``). Shapes as the module docstring states.

    ``att_out`` / ``att_lse``: contiguous fp32 scratch; :func:`workspace_numel_bound` elements
    always suffice (under a CUDA graph: static buffers). The split count is the kernel's
    (about ``PROGRAMS_PER_SM`` programs per SM; shorter requests use fewer), at most
    ``max_kv_splits`` (the Triton backend's ``--triton-attention-num-kv-splits``). Depends only on
    shapes and ``bs``, so one capture serves every context length.

    Raises:
        ValueError: shapes that pass :func:`can_handle` but not the launcher's checks (one line).
    """
    if not can_handle(
        q,
        o,
        k_buffer,
        v_buffer,
        req_to_token,
        req_pool_indices,
        num_draft_tokens,
        is_causal=is_causal,
        sliding_window_size=sliding_window_size,
        sinks=sinks,
        xai_temperature_len=xai_temperature_len,
        k_scale=k_scale,
        v_scale=v_scale,
    ):
        return False
    if not (att_out.is_contiguous() and att_lse.is_contiguous()):
        return False
    bs = req_pool_indices.shape[0]
    shape = chain_verify_shape(
        q.shape[1], k_buffer.shape[1], q.shape[2], v_buffer.shape[2], num_draft_tokens
    )
    num_kv_splits = max(
        1, min(choose_num_kv_splits(shape, bs, num_sms), max_kv_splits)
    )
    n_out, n_lse = workspace_numel(shape, bs, num_kv_splits)
    if att_out.numel() < n_out or att_lse.numel() < n_lse:
        return False
    chain_verify_attention_fwd(
        q,
        k_buffer,
        v_buffer,
        o,
        req_to_token,
        req_pool_indices,
        seq_lens,
        shape,
        num_kv_splits,
        sm_scale,
        att_out.view(-1),
        att_lse.view(-1),
        logit_cap or 0.0,
        seq_lens_include_chain=seq_lens_include_chain,
    )
    return True
