"""Bytes of the field-scale shard (``dummy_models.kimi_k25_shard``): its weight tensors by component
and format (INT4 with bf16 group scales where the checkpoint's compressed-tensors block quantizes
a module, bf16 / fp32 elsewhere), the KV cache per token, and how many KV tokens SGLang 0.5.16's
pool sizing leaves on one GPU (``docs/field_scale.md`` tabulates them). Standard library only."""

from __future__ import annotations

from bench.models.dummy_models import text_config

BF16, FP32 = 2, 4


def ct_ignored(name: str, ignore) -> bool:
    """compressed-tensors' ignore test as SGLang applies it (``should_ignore_layer`` ->
    ``_is_equal_or_regex_match(check_contains=True)``): ``re:`` patterns by ``re.match``, other
    entries as case-insensitive substrings of the module name."""
    import re

    return any(re.match(p[3:], name) if p.startswith("re:") else p.lower() in name.lower()
               for p in ignore)


def shard_components(cfg: dict, draft: dict | None = None) -> list:
    """The weight tensors of a DeepseekV3 target (``text_config`` of a wrapper) and an EAGLE-3
    Llama drafter, grouped as SGLang 0.5.16 builds them. Rows ``(component, module, count,
    numel, kind, tp)``: ``module`` a representative SGLang module prefix (what the quant config
    is matched against), ``count`` how many such tensors, ``numel`` elements of one, ``kind``
    ``linear`` / ``experts`` (quantizable under ``targets: [Linear]``), ``embedding`` / ``norm`` /
    ``router`` / ``bias32`` (never: not a LinearBase, or fp32), ``tp`` what TP does to it:
    ``divided`` (column/row/vocab parallel) or ``replicated``."""
    c = text_config(cfg)
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    h, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    ql, kvl = c["q_lora_rank"], c["kv_lora_rank"]
    dense = c["first_k_dense_replace"]
    moe = L - dense
    E, Im, S = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"]
    rows = [
        ("embed_tokens", "model.embed_tokens", 1, V * H, "embedding", "divided"),
        ("attn fused_qkv_a_proj_with_mqa", "model.layers.1.self_attn.fused_qkv_a_proj_with_mqa", L,
         H * (ql + kvl + rope), "linear", "replicated"),
        ("attn q_a/kv_a layernorms", "model.layers.1.self_attn.q_a_layernorm", L, ql + kvl, "norm", "replicated"),
        ("attn q_b_proj", "model.layers.1.self_attn.q_b_proj", L, ql * h * (nope + rope), "linear", "divided"),
        ("attn kv_b_proj", "model.layers.1.self_attn.kv_b_proj", L, kvl * h * (nope + vd), "linear", "divided"),
        ("attn o_proj", "model.layers.1.self_attn.o_proj", L, h * vd * H, "linear", "divided"),
        ("dense mlp gate_up_proj", "model.layers.0.mlp.gate_up_proj", dense, H * 2 * c["intermediate_size"],
         "linear", "divided"),
        ("dense mlp down_proj", "model.layers.0.mlp.down_proj", dense, c["intermediate_size"] * H, "linear", "divided"),
        ("moe router gate", "model.layers.1.mlp.gate", moe, E * H, "router", "replicated"),
        ("moe router e_score_correction_bias", "model.layers.1.mlp.gate.e_score_correction_bias", moe, E,
         "bias32", "replicated"),
        ("moe routed experts (w13 + w2)", "model.layers.1.mlp.experts", moe, E * 3 * H * Im, "experts", "divided"),
        ("moe shared_experts gate_up_proj", "model.layers.1.mlp.shared_experts.gate_up_proj", moe,
         H * 2 * Im * S, "linear", "divided"),
        ("moe shared_experts down_proj", "model.layers.1.mlp.shared_experts.down_proj", moe, Im * S * H,
         "linear", "divided"),
        ("layernorms (input, post-attention, final)", "model.layers.1.input_layernorm", 2 * L + 1, H, "norm",
         "replicated"),
        ("lm_head", "lm_head", 1, V * H, "linear", "divided"),
    ]
    if draft is not None:
        dh, dkv, hd = draft["num_attention_heads"], draft["num_key_value_heads"], draft["head_dim"]
        DH, DI, DV = draft["hidden_size"], draft["intermediate_size"], draft.get("draft_vocab_size") or draft["vocab_size"]
        n_aux = len(draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        rows += [
            ("draft fc (aux hidden states)", "draft.model.fc", 1, n_aux * draft["target_hidden_size"] * DH,
             "draft", "replicated"),
            ("draft qkv_proj (input 2 x hidden)", "draft.model.layers.0.self_attn.qkv_proj", 1,
             2 * DH * (dh + 2 * dkv) * hd, "draft", "divided"),
            ("draft o_proj", "draft.model.layers.0.self_attn.o_proj", 1, dh * hd * DH, "draft", "divided"),
            ("draft mlp (gate_up + down)", "draft.model.layers.0.mlp", 1, 3 * DH * DI, "draft", "divided"),
            ("draft norms", "draft.model.norm", 4, DH, "draft", "replicated"),
            ("draft lm_head", "draft.lm_head", 1, DV * DH, "draft", "divided"),
        ]
    return rows


def shard_weight_bytes(cfg: dict, draft: dict | None = None) -> dict:
    """Bytes of the weights SGLang holds for a DeepseekV3 target (+ EAGLE-3 drafter), per
    component of ``shard_components``: ``{component: {"params", "bytes", "format", "tp"}}`` plus
    ``"total_target"`` / ``"total_draft"`` / ``"total"`` (params, bytes). Quantized (not ignored by
    the config's ``quantization_config``, and ``linear`` / ``experts``): ``num_bits / 8`` bytes per
    weight + one bf16 scale per ``group_size`` weights (symmetric: no zero point); else bf16
    (``bias32`` fp32). The drafter has no quantization config (bf16); its embedding is the
    target's after load (SGLang EAGLE-3 shares it), so it is not counted."""
    q = text_config(cfg).get("quantization_config") or cfg.get("quantization_config")
    w = q["config_groups"]["group_0"]["weights"] if q else None
    out: dict = {}
    tot = {"total_target": [0, 0], "total_draft": [0, 0]}
    for name, module, count, numel, kind, tp in shard_components(cfg, draft):
        n = count * numel
        if kind in ("linear", "experts") and q and not ct_ignored(module, q["ignore"]):
            b = n * w["num_bits"] // 8 + (n // w["group_size"]) * BF16
            fmt = f"int{w['num_bits']} g{w['group_size']} + bf16 scales"
        else:
            b, fmt = n * (FP32 if kind == "bias32" else BF16), "fp32" if kind == "bias32" else "bf16"
        out[name] = {"params": n, "bytes": b, "format": fmt, "tp": tp}
        key = "total_draft" if kind == "draft" else "total_target"
        tot[key][0] += n
        tot[key][1] += b
    for k, (n, b) in tot.items():
        out[k] = {"params": n, "bytes": b}
    out["total"] = {"params": tot["total_target"][0] + tot["total_draft"][0],
                    "bytes": tot["total_target"][1] + tot["total_draft"][1]}
    return out


def kv_bytes_per_token(cfg: dict, dtype_bytes: int = BF16) -> int:
    """KV-cache bytes per token: an MLA target stores the latent ``kv_lora_rank + qk_rope_head_dim``
    per layer (576 for Kimi-K2.5; every TP rank holds it whole), a Llama drafter ``2 x
    num_key_value_heads x head_dim`` per layer."""
    c = text_config(cfg)
    if c.get("kv_lora_rank"):
        per_layer = c["kv_lora_rank"] + c["qk_rope_head_dim"]
    else:
        per_layer = 2 * c["num_key_value_heads"] * (c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    return per_layer * dtype_bytes * c["num_hidden_layers"]


def kv_tokens_at(mem_fraction: float, cfg: dict, draft: dict | None = None, gpu_bytes: int = 143771 * 2**20,
                 context_bytes: int = 2**30) -> int:
    """KV-cache tokens that fit at ``--mem-fraction-static mem_fraction`` on a GPU of ``gpu_bytes``
    (default: an H200's 143,771 MiB): SGLang 0.5.16 sizes the pool as the memory free after the
    weights minus ``(1 - mem_fraction)`` x the memory free before them
    (``kv_cache_configurator._profile_available_bytes``), here with ``context_bytes`` taken by the
    CUDA context first. Pool bytes / (target + drafter KV bytes per token); 0 if nothing is left."""
    free0 = gpu_bytes - context_bytes
    pool = free0 - shard_weight_bytes(cfg, draft)["total"]["bytes"] - (1 - mem_fraction) * free0
    per_tok = kv_bytes_per_token(cfg) + (kv_bytes_per_token(draft) if draft else 0)
    return max(0, int(pool // per_tok))
