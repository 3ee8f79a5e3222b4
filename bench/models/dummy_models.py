"""Write config-only model folders for SGLang's ``--load-format dummy`` (random weights, no hub).

    python -m bench models dummy OUT_DIR [--only llama-small,llama-8b,kimi-small]

Writes, under OUT_DIR, a target and its EAGLE-3 draft per model family:

=====================  ===========================================================================
``llama-small/``       LlamaForCausalLM, hidden 2048, 16 layers, 16 heads / 8 KV heads, vocab 32000
``llama-small-eagle3/`` LlamaForCausalLMEagle3, 1 layer, aux layer ids [1, 7, 12]
``llama-8b/``          Llama-3.1-8B shape: hidden 4096, 32 layers, 32 heads / 8 KV heads, head_dim 128,
                       intermediate 14336, vocab 128256, rope_theta 500000 (llama3 rope scaling),
                       max_position_embeddings 131072
``llama-8b-eagle3/``   LlamaForCausalLMEagle3, 1 layer, aux layer ids [1, 15, 28], draft_vocab_size 128256
``kimi-small/``        reduced Kimi-K2-shaped DeepseekV3ForCausalLM (one TP-8 shard's widths: 8 heads,
                       MLA kv_lora 512 / rope 64, 128 experts top-8 of width 256, shared expert), 6 layers
``kimi-small-eagle3/`` Llama-style EAGLE-3 draft with hidden 7168, aux layer ids [2, 3, 4]
``kimi-small-mla/``    the same DeepseekV3 target
``kimi-small-mla-eagle3/`` MLA EAGLE-3 draft ``Eagle3DeepseekV2ForCausalLM`` (SGLang's
                       ``kimi_k25_eagle3.py``): one MLA layer with the target's MLA dims, aux [2, 3, 4]
``kimi-k25-small/``    ``KimiK25ForConditionalGeneration`` wrapping the kimi-small text model
                       (``text_config``) with a 1-layer vision tower
``kimi-k25-small-eagle3/`` Llama-style EAGLE-3 draft as for kimi-small
``kimi-k25-shard/``    one TP-8 shard of Kimi-K2.5's text model at full depth: DeepseekV3ForCausalLM,
                       61 layers (layer 0 dense), hidden 7168, 8 heads, MLA q_lora 1536 / kv_lora 512
                       / rope 64, 384 routed experts top-8 of width 256 + 1 shared expert of width
                       256, dense width 2304, vocab 20480, YaRN rope (factor 64, 4096 original),
                       the checkpoint's compressed-tensors ``quantization_config`` (routed experts
                       INT4 W4A16, group 32, symmetric; everything else bf16)
``kimi-k25-shard-eagle3/`` the Llama-style EAGLE-3 drafter's shard (``LlamaForCausalLMEagle3``, 1 layer,
                       hidden 7168, 8 heads / 8 KV heads of 128, intermediate 1536, vocab 20480),
                       aux layer ids [2, 30, 58]
``kimi-k25-shard-wrapped/`` ``KimiK25ForConditionalGeneration`` around the kimi-k25-shard text model
                       (``text_config`` with the checkpoint's quantization block, vision tower at
                       Kimi-K2.5's depth: 27 layers of 1152)
``kimi-k25-shard-wrapped-eagle3/`` the drafter as for kimi-k25-shard
=====================  ===========================================================================

A TP-8 shard (``tp_shard``): what tensor parallelism divides by 8 is divided here (attention
heads, KV heads, the dense, shared-expert and routed-expert intermediate widths, the vocabulary
rows of the embedding and the LM head, the drafter's heads and MLP width); what every rank holds
whole stays whole (hidden 7168, the MLA down-projections and latent KV, all 384 experts, router,
norms, the drafter's fc). ``shard_weight_bytes`` counts its weights per component (71.7 GiB
with the drafter) and ``kv_bytes_per_token`` its KV cache (70,272 bytes per token).

Each folder gets ``config.json``, ``generation_config.json`` and a WordLevel tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``; ids 0/1/2 = unk(pad)/bos/eos, then printable ASCII,
then filler words up to the vocab size), so ``--skip-tokenizer-init`` is optional.
Needs only the ``tokenizers`` package and the standard library.

Aux-layer conventions (SGLang 0.5.16): a Llama target captures the residual entering layer
``id + 1`` for each id; a DeepseekV3 target uses the ids as they are (unless the first is 1). Every
captured layer must be distinct and < ``num_hidden_layers`` (checked here before writing).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

BOS, EOS, PAD = 1, 2, 0


def _llama(hidden, layers, heads, kv_heads, intermediate, vocab, max_pos, rope_theta,
           head_dim=None, rope_scaling=None):
    return dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or hidden // heads,
        vocab_size=vocab, max_position_embeddings=max_pos, rms_norm_eps=1e-5,
        rope_theta=rope_theta, rope_scaling=rope_scaling, hidden_act="silu", initializer_range=0.02,
        attention_bias=False, mlp_bias=False, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        tie_word_embeddings=False, torch_dtype="bfloat16", use_cache=True,
        transformers_version="4.57.0",
    )


def _eagle3_draft(base: dict, aux_ids, target_hidden, draft_vocab=None):
    """A 1-layer LlamaForCausalLMEagle3 draft sharing the target's vocab (draft_vocab_size key always present)."""
    d = dict(base, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1,
             target_hidden_size=target_hidden,
             draft_vocab_size=draft_vocab if draft_vocab is not None else base["vocab_size"],
             eagle_config={"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True})
    return d


def llama_small():
    t = _llama(2048, 16, 16, 8, 5632, 32000, 32768, 10000.0)
    return t, _eagle3_draft(t, [1, 7, 12], 2048)


def llama_8b():
    rs = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    t = _llama(4096, 32, 32, 8, 14336, 128256, 131072, 500000.0, head_dim=128, rope_scaling=rs)
    return t, _eagle3_draft(t, [1, 15, 28], 4096)


def kimi_small(layers: int = 6):
    """Reduced Kimi-K2 (DeepseekV3) target at one TP-8 shard's widths (``tp_shard`` of
    ``KIMI_K25_TEXT``) with ``layers`` layers, 128 bf16 experts, vocab 32000, no rope scaling,
    32k positions, + Llama-style draft."""
    V = 32000
    t = dict(tp_shard(KIMI_K25_TEXT, 8), num_hidden_layers=layers, n_routed_experts=128,
             vocab_size=V, max_position_embeddings=32768, rope_scaling=None)
    aux = [2, layers // 2, layers - 2]
    base = _llama(7168, 1, 56, 8, 18432, V, 32768, 50000.0, head_dim=128)
    return t, _eagle3_draft(base, aux, 7168)


def kimi_small_mla(layers: int = 6):
    """kimi-small with the MLA EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``): one decoder layer
    with the target's MLA attention widths and a dense MLP, hidden 7168."""
    t, llama_draft = kimi_small(layers)
    d = dict(t, architectures=["Eagle3DeepseekV2ForCausalLM"], num_hidden_layers=1,
             intermediate_size=18432, target_hidden_size=7168, draft_vocab_size=t["vocab_size"],
             eagle_config=dict(llama_draft["eagle_config"]), first_k_dense_replace=1)
    return t, d


def kimi_k25_small(layers: int = 6):
    """``KimiK25ForConditionalGeneration`` (Kimi-K2.5's architecture name) around the kimi-small
    text model, with a 1-layer vision tower (SGLang ``configs/kimi_k25.py`` field names, plus
    ``vt_hidden_size``, which SGLang 0.5.16's ``K2VLMultiModalProjector`` reads from the vision
    config and the real Kimi-K2.5 config.json carries; without it the model fails to build)."""
    text, draft = kimi_small(layers)
    return _kimi_k25_wrapper(text, vision_layers=1), draft


def _kimi_k25_wrapper(text: dict, vision_layers: int) -> dict:
    """``KimiK25ForConditionalGeneration`` config around a DeepseekV3 ``text_config``: MoonViT
    vision tower of ``vision_layers`` layers of width 1152 (16 heads, FFN 4304), patch merger."""
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": dict(text), "vision_config": {
                "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64,
                "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed", "num_attention_heads": 16,
                "num_hidden_layers": vision_layers, "hidden_size": 1152, "vt_hidden_size": 1152,
                "intermediate_size": 4304,
                "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
                "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger",
                "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5, "text_hidden_size": 7168},
            "media_placeholder_token_id": text["vocab_size"] - 1, "pad_token_id": PAD,
            "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "bfloat16"}


# --------------------------------------------------------------------- the Kimi-K2.5 TP-8 shard
KIMI_K25_QUANTIZATION_CONFIG = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                    "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                    "symmetric": True, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
}
"""``text_config.quantization_config`` of moonshotai/Kimi-K2.5's ``config.json`` (compressed-tensors
``pack-quantized``: every ``Linear`` INT4 W4A16, group 32, symmetric, except what ``ignore``
names: attention, shared experts, the dense MLP, LM head, vision tower, projector; so the routed
experts are INT4 and the rest bf16). moonshotai/Kimi-K2-Thinking has the same block at the top
level with ``lm_head`` and the first four patterns, no vision entries."""

KIMI_K25_TEXT = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 262144, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128, "vocab_size": 163840,
    "initializer_range": 0.02,
}
"""Kimi-K2.5's text model (``text_config`` of its ``config.json``; DeepSeek-V3 architecture) as
``DeepseekV3ForCausalLM``, with this module's tokenizer ids instead of the checkpoint's."""

KIMI_K25_EAGLE3 = {"hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64,
                   "head_dim": 128, "intermediate_size": 12288, "vocab_size": 163840,
                   "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144}
"""The Llama-style EAGLE-3 drafter trained for Kimi-K2.5 (TorchSpec ``kimi_k25_eagle3.json``, the
architecture of lightseekorg/kimi-k2.5-eagle3): 1 ``LlamaForCausalLMEagle3`` layer, MHA with 64
heads / 64 KV heads of 128, MLP 12288, the target's vocabulary. Its config names no aux layer
ids: SGLang's DeepseekV3 default, ``[2, L // 2, L - 3]``, is [2, 30, 58] for 61 layers."""

TP_DIVIDED = ("num_attention_heads", "num_key_value_heads", "intermediate_size",
              "moe_intermediate_size", "vocab_size")
"""Config fields tensor parallelism divides by the TP size, target and drafter alike."""


def tp_shard(cfg: dict, tp: int) -> dict:
    """The widths one of ``tp`` tensor-parallel ranks holds: ``TP_DIVIDED`` fields divided by
    ``tp`` (each must divide), every other field as it is (a TP-1 model of these widths does the
    per-rank work of the TP-``tp`` model, without its all-reduces and logits all-gather)."""
    out = dict(cfg)
    for k in TP_DIVIDED:
        if k in cfg:
            assert cfg[k] % tp == 0, f"{k}={cfg[k]} is not divisible by tp={tp}"
            out[k] = cfg[k] // tp
    return out


def kimi_k25_shard(tp: int = 8):
    """One TP-``tp`` rank of Kimi-K2.5 at full depth, INT4 routed experts, + its Llama-style
    EAGLE-3 drafter's rank. The ``ignore`` list drops the vision entries (no such modules here)."""
    q = dict(KIMI_K25_QUANTIZATION_CONFIG,
             ignore=[p for p in KIMI_K25_QUANTIZATION_CONFIG["ignore"] if "vision" not in p
                     and "mm_projector" not in p])
    t = dict(tp_shard(KIMI_K25_TEXT, tp), quantization_config=q)
    L = t["num_hidden_layers"]
    d = tp_shard(KIMI_K25_EAGLE3, tp)
    base = _llama(d["hidden_size"], 1, d["num_attention_heads"], d["num_key_value_heads"],
                  d["intermediate_size"], d["vocab_size"], d["max_position_embeddings"], d["rope_theta"],
                  head_dim=d["head_dim"])
    base["rms_norm_eps"] = d["rms_norm_eps"]
    return t, _eagle3_draft(base, [2, L // 2, L - 3], t["hidden_size"])


def kimi_k25_shard_wrapped(tp: int = 8):
    """kimi-k25-shard behind ``KimiK25ForConditionalGeneration`` as the checkpoint ships it: the
    quantization block (the full ``ignore`` list) inside ``text_config``, which SGLang 0.5.16's
    ``KimiK25Config`` lifts to the top level; the text model is built with that quant config and
    prefix "" (``models/kimi_k25.py``), the vision tower without it."""
    t, draft = kimi_k25_shard(tp)
    t = dict(t, quantization_config=dict(KIMI_K25_QUANTIZATION_CONFIG))
    return _kimi_k25_wrapper(t, vision_layers=27), draft


MODELS = {"llama-small": llama_small, "llama-8b": llama_8b, "kimi-small": kimi_small,
          "kimi-small-mla": kimi_small_mla, "kimi-k25-small": kimi_k25_small,
          "kimi-k25-shard": kimi_k25_shard, "kimi-k25-shard-wrapped": kimi_k25_shard_wrapped}


def captured_layers(target: dict, aux_ids) -> list:
    """Target layers whose input residual SGLang 0.5.16 captures for these EAGLE-3 aux ids."""
    if target["architectures"][0].startswith(("Deepseek", "KimiK25")):
        return [i + 1 for i in aux_ids] if aux_ids and aux_ids[0] == 1 else list(aux_ids)
    return [i + 1 for i in aux_ids]


def text_config(cfg: dict) -> dict:
    """The text model's config: ``text_config`` of a multimodal wrapper, else ``cfg`` itself."""
    return cfg.get("text_config", cfg)


def check_pair(name: str, target: dict, draft: dict) -> None:
    arch = target["architectures"]
    target = dict(text_config(target), architectures=arch)
    aux = draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    L = target["num_hidden_layers"]
    cap = captured_layers(target, aux)
    assert len(set(aux)) == len(aux) and all(0 <= i < L for i in aux), f"{name}: aux ids {aux} vs {L} layers"
    assert len(set(cap)) == len(cap) and all(0 <= i < L for i in cap), f"{name}: captured {cap} vs {L} layers"
    assert draft["vocab_size"] == target["vocab_size"], f"{name}: vocab mismatch"
    assert draft["target_hidden_size"] == target["hidden_size"], f"{name}: target_hidden_size mismatch"
    assert "draft_vocab_size" in draft


def write_tokenizer(d: str, vocab_size: int, max_pos: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": PAD, "<s>": BOS, "</s>": EOS}
    for c in range(33, 127):
        vocab.setdefault(chr(c), len(vocab))
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(os.path.join(d, "tokenizer.json"))
    _dump(os.path.join(d, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<unk>", "model_max_length": max_pos,
        "add_bos_token": False, "clean_up_tokenization_spaces": False})
    _dump(os.path.join(d, "special_tokens_map.json"),
          {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"})


def _dump(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def write_model(out: str, name: str, cfg: dict) -> str:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    _dump(os.path.join(d, "config.json"), cfg)
    _dump(os.path.join(d, "generation_config.json"), {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD})
    text = text_config(cfg)
    write_tokenizer(d, text["vocab_size"], text["max_position_embeddings"])
    return d


def describe(name: str, cfg: dict) -> str:
    ks = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "vocab_size", "draft_vocab_size", "max_position_embeddings")
    cfg = dict(text_config(cfg), architectures=cfg["architectures"], **{
        k: cfg[k] for k in ("draft_vocab_size", "eagle_config") if k in cfg})
    parts = [f"{k}={cfg[k][0] if k == 'architectures' else cfg[k]}" for k in ks if k in cfg]
    if "eagle_config" in cfg:
        parts.append(f"aux={cfg['eagle_config']['eagle_aux_hidden_state_layer_ids']}")
    return f"{name}: " + " ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench models dummy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="output folder (created)")
    ap.add_argument("--only", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    a = ap.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    bad = [n for n in names if n not in MODELS]
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {list(MODELS)}")
    for n in names:
        target, draft = MODELS[n]()
        check_pair(n, target, draft)
        for sub, cfg in ((n, target), (f"{n}-eagle3", draft)):
            d = write_model(a.out, sub, cfg)
            print(f"wrote {d}  ({describe(sub, cfg)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
