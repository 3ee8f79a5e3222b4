"""CPU tier: ``python -m bench.models.dummy_models`` writes loadable config-only model folders for --load-format dummy.

Checks the EAGLE-3 pairs the GPU job uses: aux layer ids distinct and < target num_hidden_layers
(also after SGLang 0.5.16's Llama +1 shift), ``draft_vocab_size`` present, vocab sizes equal,
``target_hidden_size`` = target hidden, the Llama-3.1-8B shape, and a tokenizer that covers the vocab;
the Kimi-K2.5 TP-8 shard: what is divided by 8 and what is not, the checkpoint's quantization block,
and the byte count (``shard_weight_bytes``, ``kv_bytes_per_token``) against counts made by hand.
(``test_shard_quant_config.py``: SGLang's own reading of that block.)
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITE_MODELS = [sys.executable, "-m", "bench.models.dummy_models"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [ROOT, os.path.join(ROOT, "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
NAMES = ["llama-small", "llama-8b", "kimi-small", "kimi-small-mla", "kimi-k25-small", "kimi-k25-shard",
         "kimi-k25-shard-wrapped"]
from bench.models import dummy_models as dm
from bench.models import shard_bytes as sb


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    out = tmp_path_factory.mktemp("models")
    r = subprocess.run([*WRITE_MODELS, str(out)], capture_output=True, text=True, timeout=120,
                       env=ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in NAMES:
        assert f"wrote {os.path.join(str(out), n)} " in r.stdout
        assert f"wrote {os.path.join(str(out), n + '-eagle3')} " in r.stdout
    return str(out)


def _cfg(d, name):
    with open(os.path.join(d, name, "config.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("name", NAMES)
def test_eagle3_pair_is_consistent(models_dir, name):
    t, d = _cfg(models_dir, name), _cfg(models_dir, name + "-eagle3")
    t = dict(t.get("text_config", t), architectures=t["architectures"])
    assert d["architectures"] == (["Eagle3DeepseekV2ForCausalLM"] if name == "kimi-small-mla"
                                  else ["LlamaForCausalLMEagle3"])
    assert d["num_hidden_layers"] == 1
    L = t["num_hidden_layers"]
    aux = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(aux) == 3 and len(set(aux)) == 3
    assert all(0 <= i < L for i in aux)
    if t["architectures"] == ["LlamaForCausalLM"]:  # Llama captures the residual entering layer id+1
        assert all(i + 1 < L for i in aux)
    assert "draft_vocab_size" in d and d["draft_vocab_size"] == t["vocab_size"]
    assert d["vocab_size"] == t["vocab_size"]
    assert d["target_hidden_size"] == t["hidden_size"]
    for sub in (name, name + "-eagle3"):
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            assert os.path.isfile(os.path.join(models_dir, sub, f)), (sub, f)


def test_llama_8b_shape(models_dir):
    t = _cfg(models_dir, "llama-8b")
    assert t["architectures"] == ["LlamaForCausalLM"]
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"], t["num_key_value_heads"]) == (4096, 32, 32, 8)
    assert (t["head_dim"], t["intermediate_size"], t["vocab_size"]) == (128, 14336, 128256)
    assert t["rope_theta"] == 500000.0 and t["max_position_embeddings"] >= 32768
    assert _cfg(models_dir, "llama-8b-eagle3")["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 15, 28]


def test_small_llama_and_kimi_shapes(models_dir):
    s = _cfg(models_dir, "llama-small")
    assert (s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"], s["num_key_value_heads"], s["vocab_size"]) == (2048, 16, 16, 8, 32000)
    k = _cfg(models_dir, "kimi-small")
    assert k["architectures"] == ["DeepseekV3ForCausalLM"] and k["num_hidden_layers"] == 6
    assert (k["kv_lora_rank"], k["qk_rope_head_dim"], k["n_routed_experts"], k["num_experts_per_tok"]) == (512, 64, 128, 8)
    assert _cfg(models_dir, "kimi-small-eagle3")["hidden_size"] == 7168


@pytest.mark.parametrize("name", NAMES)
def test_tokenizer_covers_vocab(models_dir, name):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(models_dir, name, "tokenizer.json"))
    cfg = _cfg(models_dir, name)
    assert tok.get_vocab_size() == cfg.get("text_config", cfg)["vocab_size"]
    assert tok.token_to_id("</s>") == 2 and tok.token_to_id("<s>") == 1


def test_only_flag_and_unknown_name(tmp_path):
    pytest.importorskip("tokenizers")
    r = subprocess.run([*WRITE_MODELS, str(tmp_path), "--only", "llama-small"],
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["llama-small", "llama-small-eagle3"]
    r = subprocess.run([*WRITE_MODELS, str(tmp_path), "--only", "nope"], capture_output=True, text=True,
                       env=ENV)
    assert r.returncode != 0 and "unknown model" in r.stderr


@pytest.mark.parametrize("name,draft_arch", [("kimi-small-mla", "Eagle3DeepseekV2ForCausalLM"),
                                             ("kimi-k25-small", "LlamaForCausalLMEagle3")])
def test_sglang_reads_the_mla_models(models_dir, name, draft_arch):
    """SGLang's own ModelConfig sees MLA (kv_lora_rank 512) in the Kimi-K2.5 wrapper target and in
    the MLA drafter, and the draft architecture SGLang will load."""
    pytest.importorskip("sglang")
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    target = ModelConfig(os.path.join(models_dir, name))
    assert target.attention_arch == AttentionArch.MLA and target.kv_lora_rank == 512
    assert target.num_hidden_layers == 6 and target.hidden_size == 7168
    draft = ModelConfig(os.path.join(models_dir, name + "-eagle3"), is_draft_model=True)
    assert draft.hf_config.architectures == [draft_arch]
    assert (draft.attention_arch == AttentionArch.MLA) == (draft_arch.startswith("Eagle3Deepseek"))


def test_kimi_k25_vision_config_has_every_vt_field_sglang_reads(models_dir):
    """SGLang 0.5.16's ``models/kimi_k25.py`` reads ``config.vt_*`` fields from the vision config
    (``K2VLMultiModalProjector``: ``vt_hidden_size``) that ``KimiK25VisionConfig`` does not
    define; a config without them builds on the CPU but fails at model init on the GPU (the
    ``mla`` stage on the H200, 2026-12-01: ``'KimiK25VisionConfig' object has no attribute
    'vt_hidden_size'``)."""
    pytest.importorskip("sglang")
    import re

    import importlib.util

    from sglang.srt.configs.kimi_k25 import KimiK25Config

    with open(importlib.util.find_spec("sglang.srt.models.kimi_k25").origin) as f:
        wanted = set(re.findall(r"config\.(vt_[a-z_]+)", f.read()))
    assert "vt_hidden_size" in wanted  # the scan still finds what it is for
    with open(os.path.join(models_dir, "kimi-k25-small", "config.json")) as f:
        raw = json.load(f)
    cfg = KimiK25Config(**{k: v for k, v in raw.items() if k != "model_type"})
    missing = [a for a in sorted(wanted) if not hasattr(cfg.vision_config, a)]
    assert not missing, f"vision_config lacks {missing}"


def test_kimi_k25_shard_divides_what_tp8_divides(models_dir):
    """One TP-8 rank of Kimi-K2.5 (61 layers, 64 heads, dense 18432, experts 384 x 2048, vocab
    163840): heads, KV heads, the three intermediate widths and the vocabulary / 8; hidden, the
    MLA ranks, expert count, top-k and depth whole."""
    t = _cfg(models_dir, "kimi-k25-shard")
    assert t["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"],
            t["moe_intermediate_size"], t["vocab_size"]) == (64 // 8, 64 // 8, 18432 // 8, 2048 // 8, 163840 // 8)
    assert (t["hidden_size"], t["num_hidden_layers"], t["first_k_dense_replace"], t["q_lora_rank"],
            t["kv_lora_rank"], t["qk_rope_head_dim"], t["qk_nope_head_dim"], t["v_head_dim"]) == (
        7168, 61, 1, 1536, 512, 64, 128, 128)
    assert (t["n_routed_experts"], t["num_experts_per_tok"], t["n_shared_experts"]) == (384, 8, 1)
    assert t["rope_scaling"]["type"] == "yarn" and t["rope_scaling"]["factor"] == 64.0
    d = _cfg(models_dir, "kimi-k25-shard-eagle3")
    assert (d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"], d["intermediate_size"]) == (8, 8, 128, 1536)
    assert d["vocab_size"] == d["draft_vocab_size"] == 20480 and d["target_hidden_size"] == 7168
    assert d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]  # SGLang's [2, L // 2, L - 3]
    w = _cfg(models_dir, "kimi-k25-shard-wrapped")
    assert w["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert {k: v for k, v in w["text_config"].items() if k != "quantization_config"} == {
        k: v for k, v in t.items() if k != "quantization_config"}


def test_kimi_k25_shard_carries_the_checkpoint_quantization_block(models_dir):
    """The block's structure as in Kimi-K2.5's config.json; the DeepseekV3 shard drops only the
    ignore entries for modules it lacks (vision tower, projector)."""
    q = _cfg(models_dir, "kimi-k25-shard")["quantization_config"]
    assert set(q) == {"config_groups", "format", "ignore", "kv_cache_scheme", "quant_method", "quantization_status"}
    assert (q["quant_method"], q["format"], q["quantization_status"]) == ("compressed-tensors", "pack-quantized", "compressed")
    g = q["config_groups"]["group_0"]
    assert g["targets"] == ["Linear"] and g["input_activations"] is None and g["output_activations"] is None
    assert {k: g["weights"][k] for k in ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic")} == {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32, "dynamic": False}
    full = dm.KIMI_K25_QUANTIZATION_CONFIG["ignore"]
    assert q["ignore"] == [p for p in full if p not in ("re:vision_tower.*", "re:mm_projector.*")]
    assert len(full) == 6 and "re:.*lm_head.*" in q["ignore"]


def test_shard_bytes_against_a_hand_count():
    """Routed experts by hand: 60 MoE layers x 384 experts x (gate, up, down) x 7168 x 256
    weights, half a byte each plus one bf16 scale per 32; o_proj: 61 x (8 x 128) x 7168 bf16;
    the MLA KV cache: (512 + 64) x 2 bytes x 61 layers per token."""
    t, d = dm.kimi_k25_shard()
    b = sb.shard_weight_bytes(t, d)
    n = 60 * 384 * 3 * 7168 * 256
    assert b["moe routed experts (w13 + w2)"]["params"] == n == 126_835_752_960
    assert b["moe routed experts (w13 + w2)"]["bytes"] == n // 2 + (n // 32) * 2 == 71_345_111_040
    assert b["attn o_proj"]["bytes"] == 61 * 1024 * 7168 * 2
    assert b["lm_head"]["bytes"] == b["embed_tokens"]["bytes"] == 20480 * 7168 * 2
    assert all(v["format"] == "bf16" for k, v in b.items() if "format" in v and "experts (w13" not in k
               and "bias" not in k)
    assert 70 < b["total"]["bytes"] / 2**30 < 73  # about 72 GiB
    assert b["total"]["bytes"] == b["total_target"]["bytes"] + b["total_draft"]["bytes"]
    assert sb.kv_bytes_per_token(t) == 576 * 2 * 61 == 70272
    assert sb.kv_bytes_per_token(d) == 2 * 8 * 128 * 2
    # a full-width (TP-1) model would not fit: the same count is 8x on the divided parts
    full = sb.shard_weight_bytes(dict(dm.KIMI_K25_TEXT, quantization_config=t["quantization_config"]))
    assert full["moe routed experts (w13 + w2)"]["bytes"] == 8 * b["moe routed experts (w13 + w2)"]["bytes"]
    assert full["attn fused_qkv_a_proj_with_mqa"]["bytes"] == b["attn fused_qkv_a_proj_with_mqa"]["bytes"]
    # the whole text model: Kimi-K2.5's 1.03T parameters, 594 GB as the INT4 checkpoint stores them
    assert 1.02e12 < full["total"]["params"] < 1.03e12 and 590e9 < full["total"]["bytes"] < 600e9
    # what fits next to the weights on one H200: the e2e tier's 0.7 and the sweep's 0.85
    assert sb.kv_tokens_at(0.7, t, d) > 8 * 4096 and sb.kv_tokens_at(0.85, t, d) > 32 * (16384 + 128)
    assert sb.kv_tokens_at(0.5, t, d) == 0  # 0.5 of an H200 does not hold the weights
