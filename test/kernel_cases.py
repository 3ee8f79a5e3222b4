"""Shared random cases for the chain verify attention kernel tests (CPU interpreter and GPU).

Each case draws fresh random q / KV pool / page table (``req_to_token``) values, poisons the
outputs and scratch with NaN, runs ``chain_verify_attention_fwd`` and compares with the float64
PyTorch reference ``chain_verify_attention_ref`` by ``||out - ref|| / ||ref||``.

``tp_rank_shapes`` gives the head shapes one tensor-parallel rank of the served models launches.
"""

from __future__ import annotations

import torch

from sglang_verify_graph.kernel import (
    ChainVerifyShape,
    chain_verify_attention_fwd,
    chain_verify_attention_ref,
    choose_num_kv_splits,
    launch_config,
    launch_with_config,
    workspace_numel,
)


def run_case(*, heads: int, kv_heads: int, dk: int, dv: int, ndt: int, seq_lens: list[int],
             rope: int = 0, dtype=torch.float32, device="cpu", cap: float = 0.0,
             splits: int | None = None, pool_slots: int = 4096, ctx: int = 1024,
             seed: int = 0, block_rows: int = 0, seq_lens_include_chain: bool = False,
             per_row: bool = False, stage1_overrides: dict | None = None,
             fault: str | None = None, ref_fault: str | None = None) -> float:
    """Run one case; returns the relative error (raises AssertionError on NaN / unwritten rows).

    ``block_rows``: ``ChainVerifyShape.block_rows`` (0: the kernel's own policy).
    ``seq_lens_include_chain``: ``seq_lens`` are ``DRAFT_EXTEND_V2`` lengths (prefix + ndt; a
    value below ndt is a padded row, prefix 0). ``per_row``: return the largest relative error of
    one (token, head) row instead of the whole tensor's (one bad row in thousands cannot hide);
    ``"both"``: the pair ``(whole, per_row)``.
    ``stage1_overrides``: stage-1 launch settings replacing :func:`launch_config`'s, launched with
    :func:`launch_with_config` (how the kernel benchmark's tuning harness launches).
    ``fault``: the kernel's test fault (``chain_verify_attention_fwd``'s ``fault``); ``ref_fault``:
    the one the reference computes (``chain_verify_attention_ref``'s ``fault``)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bs = len(seq_lens)
    n_pool_rows = max(8, bs)
    k_buf = torch.randn(pool_slots, kv_heads, dk, generator=g).to(dtype)
    # MLA: V is the first dv elements of the latent K (a strided view, as in SGLang's MLA pool).
    v_buf = k_buf[..., :dv] if rope else torch.randn(pool_slots, kv_heads, dv, generator=g).to(dtype)
    r2t = torch.stack([torch.randperm(pool_slots - 1, generator=g)[:ctx] + 1
                       for _ in range(n_pool_rows)]).to(torch.int32)
    rpi = torch.randperm(n_pool_rows, generator=g)[:bs].long()
    sl = torch.tensor(seq_lens, dtype=torch.int64)
    q = torch.randn(bs * ndt, heads, dk, generator=g).to(dtype)
    k_buf, v_buf, r2t, rpi, sl, q = (x.to(device) for x in (k_buf, v_buf, r2t, rpi, sl, q))
    if rope:
        v_buf = k_buf[..., :dv]
    shape = ChainVerifyShape(heads, kv_heads, dk, dv, ndt, rope, block_rows)
    ns = splits or choose_num_kv_splits(shape, bs, 132)
    n_out, n_lse = workspace_numel(shape, bs, ns)
    att_out = torch.full((n_out,), float("nan"), device=device)
    att_lse = torch.full((n_lse,), float("nan"), device=device)
    o = torch.full((bs * ndt, heads, dv), float("nan"), dtype=dtype, device=device)
    scale = dk ** -0.5
    if stage1_overrides:
        cfg1, cfg2 = launch_config(shape, cap > 0, seq_lens_include_chain)
        launch_with_config(q, k_buf, v_buf, o, r2t, rpi, sl, shape, ns, scale, att_out, att_lse,
                           {**cfg1, **stage1_overrides}, cfg2, cap)
    else:
        chain_verify_attention_fwd(q, k_buf, v_buf, o, r2t, rpi, sl, shape, ns, scale, att_out, att_lse, cap,
                                   seq_lens_include_chain=seq_lens_include_chain, fault=fault)
    ref = chain_verify_attention_ref(q.cpu(), k_buf.cpu(), v_buf.cpu(), r2t.cpu(), rpi.cpu(), sl.cpu(),
                                     ndt, scale, cap, seq_lens_include_chain=seq_lens_include_chain,
                                     fault=ref_fault, num_kv_splits=ns)
    out = o.cpu().double()
    assert not torch.isnan(out).any(), "unwritten or NaN output rows"
    whole = ((out - ref).norm() / ref.norm()).item()
    row = ((out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)).max().item()
    if per_row == "both":
        return whole, row
    return row if per_row else whole


TP_SIZES = (2, 4, 8)


def rank_heads(cfg: dict, tp: int) -> dict:
    """``run_case``'s head arguments (``heads``, ``kv_heads``, ``dk``, ``dv``, ``rope``: counts and
    elements) on one of ``tp`` tensor-parallel ranks of the HF config ``cfg`` (a ``config.json``
    dict), as SGLang's attention backends see them: ``num_attention_heads / tp`` query heads; with
    ``kv_lora_rank`` (MLA, absorbed) one latent KV head of ``kv_lora_rank + qk_rope_head_dim``
    (V: its first ``kv_lora_rank``), rope tile ``qk_rope_head_dim``; else ``num_key_value_heads /
    tp`` KV heads of ``head_dim``, at least one (SGLang replicates a KV head over the ranks that
    share it). Raises ValueError when ``tp`` does not divide the query heads or the KV heads."""
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    if heads % tp or (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ValueError(f"TP {tp} does not split {heads} query / {kv} KV heads evenly")
    if cfg.get("kv_lora_rank"):
        rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        return dict(heads=heads // tp, kv_heads=1, dk=rank + rope, dv=rank, rope=rope)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return dict(heads=heads // tp, kv_heads=max(1, kv // tp), dk=hd, dv=hd, rope=0)


def tp_rank_shapes() -> dict[str, dict]:
    """``{"<model>_tp<N>": rank_heads(config, N)}`` for N in ``TP_SIZES``, from the model configs of
    ``bench.models.dummy_models``: the verify targets ``kimi_k25`` (Kimi-K2.5's text model: 64
    heads, MLA kv_lora 512 + rope 64: 32 / 16 / 8 heads on one latent), ``llama_8b`` (Llama-3.1-8B:
    32 heads / 8 KV heads of 128: 16/4, 8/2, 4/1) and ``kimi_small`` (the multi-GPU tier's target,
    8 heads, MLA: 4 / 2 / 1 heads on one latent); and the EAGLE-3 drafters whose draft extend runs
    the chain kernel: ``kimi_k25_draft`` (64 / 64 heads of 128: groups of 1) and
    ``kimi_small_draft`` (56 / 8 of 128: groups of 7). Llama-3.1-8B's drafter has the target's
    heads."""
    from bench.models import dummy_models as dm

    configs = {"kimi_k25": dm.KIMI_K25_TEXT, "llama_8b": dm.llama_8b()[0], "kimi_small": dm.kimi_small()[0],
               "kimi_k25_draft": dm.KIMI_K25_EAGLE3, "kimi_small_draft": dm.kimi_small()[1]}
    return {f"{name}_tp{tp}": rank_heads(cfg, tp) for name, cfg in configs.items() for tp in TP_SIZES}
