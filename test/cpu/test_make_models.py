"""CPU tier: ``python -m sglang_verify_graph.dummy_models`` writes loadable config-only model folders for --load-format dummy.

Checks the EAGLE-3 pairs the GPU job uses: aux layer ids distinct and < target num_hidden_layers
(also after SGLang 0.5.16's Llama +1 shift), ``draft_vocab_size`` present, vocab sizes equal,
``target_hidden_size`` = target hidden, the Llama-3.1-8B shape, and a tokenizer that covers the vocab.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRITE_MODELS = [sys.executable, "-m", "sglang_verify_graph.dummy_models"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.join(ROOT, "python")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
NAMES = ["llama-small", "llama-8b", "kimi-small", "kimi-small-mla", "kimi-k25-small"]


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
