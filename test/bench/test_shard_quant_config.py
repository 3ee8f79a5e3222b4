"""CPU tier: SGLang's own compressed-tensors handling of the ``kimi-k25-shard`` checkpoint config.

``python -m bench.models.dummy_models`` writes ``kimi-k25-shard`` (a full-depth Kimi-K2.5
TP-8 shard as DeepseekV3ForCausalLM) and ``kimi-k25-shard-wrapped`` (the same text model behind
KimiK25ForConditionalGeneration) with Kimi-K2.5's ``quantization_config``. Checked here, with the
installed SGLang's classes and no GPU:

* ``ModelConfig`` resolves ``compressed-tensors`` for both targets (the wrapper's block sits in
  ``text_config``, as in the checkpoint) and none for the drafter, sees MLA, 61 layers, vocab
  20480, and reads the YaRN block (MLA softmax scale ``192 ** -0.5 * (0.1 ln 64 + 1) ** 2``);
* the model loader's ``_get_quantization_config`` (what ``--load-format dummy`` calls before it
  builds the model) returns a ``CompressedTensorsConfig`` with the checkpoint's ignore list;
* ``CompressedTensorsConfig.get_quant_method`` for the real module prefixes and classes of
  SGLang's DeepseekV2 model: the routed experts (``FusedMoE``) get W4A16 (4-bit int, group 32,
  symmetric, no activation quantization), ``CompressedTensorsWNA16TritonMoE`` under
  ``--moe-runner-backend triton`` and ``CompressedTensorsWNA16MoE`` (Marlin) under the default
  ``auto``; attention (fused q_a/kv_a, q_b, kv_b, o), the shared experts, the dense layer-0 MLP
  fall back to ``UnquantizedLinearMethod``; the router (``MoEGate``) and ``lm_head``
  (``ParallelLMHead``) are not Linear layers and get no compressed-tensors method;
* ``shard_bytes.ct_ignored`` (the module's own byte count) decides the same for every component.

What cannot run on a CPU: SGLang checks a scheme's minimum compute capability
(``_check_scheme_supported``, ``torch.cuda.get_device_capability``) when it picks a linear scheme;
it is replaced by "supported" here (the H200 is sm_90, above every minimum involved). Layers are
made without their ``__init__`` (that needs the tensor-parallel groups), so the test checks the
choice of method, not weight creation. Skipped where SGLang's quantization modules do not import.
"""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.models import dummy_models as dm
from bench.models import shard_bytes as sb

ct = pytest.importorskip("sglang.srt.layers.quantization.compressed_tensors.compressed_tensors",
                         reason="SGLang's compressed-tensors module does not import here")
pytest.importorskip("compressed_tensors")

TARGETS = ["kimi-k25-shard", "kimi-k25-shard-wrapped"]
FUSED_QKV_A = {"fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}
"""What ``DeepseekV2ForCausalLM.__init__`` adds to the quant config's packed-modules mapping when
``q_lora_rank`` is set (``models/deepseek_v2.py``)."""


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    out = tmp_path_factory.mktemp("models")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "python")] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    r = subprocess.run([sys.executable, "-m", "bench.models.dummy_models", str(out), "--only",
                        ",".join(TARGETS)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return str(out)


def _cfg(d, name):
    with open(os.path.join(d, name, "config.json")) as f:
        return json.load(f)


def _layer(cls):
    """An instance of SGLang's layer class without its ``__init__`` (no TP groups on a CPU)."""
    import torch

    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    return obj


@pytest.fixture
def quant_config(monkeypatch, models_dir):
    """``{target: CompressedTensorsConfig}`` as SGLang's loader builds it for each target, with
    the model's packed mapping and the GPU capability check replaced."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    monkeypatch.setattr(ct.CompressedTensorsConfig, "_check_scheme_supported",
                        lambda self, min_capability, error=True: True)
    out = {}
    for name in TARGETS:
        qc = _get_quantization_config(ModelConfig(os.path.join(models_dir, name)), LoadConfig(load_format="dummy"))
        assert isinstance(qc, ct.CompressedTensorsConfig), type(qc)
        qc.update_packed_modules_mapping(dict(FUSED_QKV_A))
        out[name] = qc
    return out


@pytest.fixture
def moe_backend(monkeypatch):
    """Set SGLang's MoE runner backend as ``--moe-runner-backend`` would (``initialize_moe_config``)."""
    from sglang.srt.layers.moe import utils as moe_utils

    def set_backend(name):
        monkeypatch.setattr(moe_utils.get_flags().moe, "runner_backend", moe_utils.MoeRunnerBackend(name))

    return set_backend


@pytest.mark.parametrize("name", TARGETS + ["kimi-k25-shard-eagle3"])
def test_model_config_resolves_the_quantization(models_dir, name):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    mc = ModelConfig(os.path.join(models_dir, name), is_draft_model=name.endswith("eagle3"))
    if name.endswith("eagle3"):
        assert mc.quantization is None and mc.hf_config.architectures == ["LlamaForCausalLMEagle3"]
        assert (mc.hf_config.num_attention_heads, mc.hf_config.num_key_value_heads) == (8, 8)
        return
    assert mc.quantization in ("compressed-tensors", "compressed_tensors"), mc.quantization
    assert mc.attention_arch == AttentionArch.MLA and mc.kv_lora_rank == 512
    assert (mc.num_hidden_layers, mc.hidden_size, mc.vocab_size) == (61, 7168, 20480)
    mscale = 0.1 * math.log(64) + 1
    assert mc.scaling == pytest.approx((128 + 64) ** -0.5 * mscale ** 2, rel=1e-6)
    q = mc.hf_config.quantization_config
    q = q if isinstance(q, dict) else q.to_dict()
    assert q["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert ("re:vision_tower.*" in q["ignore"]) == (name == "kimi-k25-shard-wrapped")


def test_the_wrapper_keeps_the_block_in_text_config(models_dir):
    raw = _cfg(models_dir, "kimi-k25-shard-wrapped")
    assert "quantization_config" not in raw
    assert raw["text_config"]["quantization_config"] == dm.KIMI_K25_QUANTIZATION_CONFIG
    assert raw["vision_config"]["num_hidden_layers"] == 27


# (module prefix in SGLang's DeepseekV2 model, layer class module, class name, quantized)
PREFIXES = [
    ("model.layers.1.mlp.experts", "sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE", True),
    ("model.layers.60.mlp.experts", "sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE", True),
    ("model.layers.1.self_attn.fused_qkv_a_proj_with_mqa", "sglang.srt.layers.linear", "ReplicatedLinear", False),
    ("model.layers.1.self_attn.q_b_proj", "sglang.srt.layers.linear", "ColumnParallelLinear", False),
    ("model.layers.1.self_attn.kv_b_proj", "sglang.srt.layers.linear", "ColumnParallelLinear", False),
    ("model.layers.1.self_attn.o_proj", "sglang.srt.layers.linear", "RowParallelLinear", False),
    ("model.layers.1.mlp.shared_experts.gate_up_proj", "sglang.srt.layers.linear", "MergedColumnParallelLinear", False),
    ("model.layers.1.mlp.shared_experts.down_proj", "sglang.srt.layers.linear", "RowParallelLinear", False),
    ("model.layers.0.mlp.gate_up_proj", "sglang.srt.layers.linear", "MergedColumnParallelLinear", False),
    ("model.layers.0.mlp.down_proj", "sglang.srt.layers.linear", "RowParallelLinear", False),
    ("model.layers.1.mlp.gate", "sglang.srt.models.deepseek_v2", "MoEGate", False),
    ("lm_head", "sglang.srt.layers.vocab_parallel_embedding", "ParallelLMHead", False),
]


def _cls(module, name):
    import importlib

    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", TARGETS)
@pytest.mark.parametrize("backend, moe_scheme", [("triton", "CompressedTensorsWNA16TritonMoE"),
                                                  ("auto", "CompressedTensorsWNA16MoE")])
def test_routed_experts_are_w4a16_and_the_rest_bf16(quant_config, moe_backend, name, backend, moe_scheme):
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    moe_backend(backend)
    qc = quant_config[name]
    for prefix, module, cls_name, quantized in PREFIXES:
        layer = _layer(_cls(module, cls_name))
        method = qc.get_quant_method(layer, prefix)
        if cls_name == "FusedMoE":
            assert type(method).__name__ == "CompressedTensorsFusedMoEMethod", (prefix, method)
            assert type(layer.scheme).__name__ == moe_scheme, (prefix, backend, layer.scheme)
            w = layer.scheme
            assert (w.num_bits, w.group_size, w.sym, w.strategy, w.actorder) == (4, 32, True, "group", None)
            d = qc.get_scheme_dict(layer, prefix)
            assert d["input_activations"] is None and qc._is_wint4abf16(d["weights"], None)
        elif cls_name in ("MoEGate", "ParallelLMHead"):
            assert method is None, (prefix, method)  # not a LinearBase / FusedMoE: plain bf16 parameters
        else:
            assert isinstance(method, UnquantizedLinearMethod), (prefix, method)
            assert qc.get_scheme_dict(layer, prefix) is None, prefix  # on the ignore list
        assert quantized == (cls_name == "FusedMoE")


@pytest.mark.parametrize("name", TARGETS)
def test_the_byte_count_quantizes_what_sglang_quantizes(quant_config, models_dir, name):
    """``shard_weight_bytes`` decides INT4 vs bf16 with ``ct_ignored``; SGLang's
    ``should_ignore_layer`` gives the same answer for every component's module prefix."""
    from sglang.srt.layers.quantization.compressed_tensors.utils import should_ignore_layer

    qc = quant_config[name]
    cfg = _cfg(models_dir, name)
    for comp, module, _, _, kind, _ in sb.shard_components(cfg):
        if kind not in ("linear", "experts"):
            continue
        names = [module + p for p in (".0.gate_proj", ".0.up_proj", ".0.down_proj")] if kind == "experts" else [module]
        theirs = {should_ignore_layer(n, ignore=qc.ignore, fused_mapping=qc.packed_modules_mapping) for n in names}
        assert theirs == {sb.ct_ignored(module, qc.ignore)}, (comp, module, theirs)
        assert sb.ct_ignored(module, qc.ignore) == (kind != "experts"), comp
