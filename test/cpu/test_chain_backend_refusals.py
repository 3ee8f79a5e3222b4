"""The refusals the chain backends raise inside the scheduler, each on its own: at construction
(a KV setup the kernel cannot read: VerifyGraphConfigError, one line naming every problem and the
fix of the backend's role) and at a served forward (a layer feature the kernel does not compute:
RuntimeError naming the layer, the feature and the fix). SGLang's ``TritonAttnBackend.__init__``
is replaced by a stand-in that sets the attributes it would."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import chain_backend as cb
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.errors import VerifyGraphConfigError

from cpu_stubs import chain_backend_stub, chain_config, forward_mode

CFG = chain_config()
FIXES = {cb.ChainVerifyTritonBackend: "remove --enable-verify-cuda-graph for this model",
         cb.ChainDraftExtendTritonBackend: "set SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream"}
BACKENDS = list(FIXES)
IDS = ["verify", "draft-extend"]


# ---- at construction ----------------------------------------------------------------------------
@pytest.fixture
def triton_init(monkeypatch):
    """``settings``: the attributes the stand-in for SGLang's ``__init__`` sets (a bf16 model with a
    [slots, heads, dim] bf16 KV pool, nothing unsupported), to be changed one at a time."""
    settings = dict(sliding_window_size=None, use_sliding_window_kv_pool=False, dcp_size=1,
                    enable_deterministic=False, num_head=4, use_mla=False, translated=False,
                    k_shape=(64, 2, 16), k_dtype=torch.bfloat16)

    def init(self, model_runner, *args, **kwargs):
        s = dict(settings)
        kbuf = torch.zeros(s.pop("k_shape"), dtype=s.pop("k_dtype"))
        self.token_to_kv_pool = SimpleNamespace(start_layer=0, get_key_buffer=lambda i: kbuf,
                                                get_value_buffer=lambda i: kbuf)
        self._translated = s.pop("translated")
        self.__dict__.update(s)

    monkeypatch.setattr(adapter.triton_attn_backend_cls(), "__init__", init)
    monkeypatch.setattr(adapter, "kv_translation_active", lambda backend: backend._translated)
    return settings


RUNNER = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))


@pytest.mark.parametrize("cls", BACKENDS, ids=IDS)
def test_a_supported_kv_setup_is_built(triton_init, cls):
    backend = cls(RUNNER, CFG)
    assert (backend.chain_shape.num_q_heads, backend.chain_shape.num_kv_heads) == (4, 2)
    assert backend.chain_shape.num_draft_tokens == 3


@pytest.mark.parametrize("cls", BACKENDS, ids=IDS)
@pytest.mark.parametrize("change, problem", [
    (dict(sliding_window_size=4096), "sliding-window attention"),
    (dict(use_sliding_window_kv_pool=True), "hybrid / unified KV pool"),
    (dict(translated=True), "hybrid / unified KV pool"),
    (dict(dcp_size=2), "decode context parallelism"),
    (dict(enable_deterministic=True), "--enable-deterministic-inference"),
    (dict(k_shape=(4, 16, 2, 16)), "a page-major KV layout (drop --enable-page-major-kv-layout)"),
    (dict(k_dtype=torch.float8_e4m3fn), "KV cache dtype torch.float8_e4m3fn (needs the model dtype; "
                                        "drop --kv-cache-dtype)"),
], ids=["sliding-window", "swa-pool", "translated-pool", "dcp", "deterministic", "page-major", "kv-dtype"])
def test_each_unsupported_kv_setup_is_refused_alone(triton_init, cls, change, problem):
    triton_init.update(change)
    with pytest.raises(VerifyGraphConfigError) as info:
        cls(RUNNER, CFG)
    msg = str(info.value)
    assert info.value.value == problem and "\n" not in msg
    assert msg.endswith(f"Fix: {FIXES[cls]}.")


def test_every_problem_is_named_at_once(triton_init):
    triton_init.update(dcp_size=2, enable_deterministic=True)
    with pytest.raises(VerifyGraphConfigError) as info:
        cb.ChainVerifyTritonBackend(RUNNER, CFG)
    assert info.value.value == "decode context parallelism, --enable-deterministic-inference"


# ---- at a served forward ------------------------------------------------------------------------
SERVED = {cb.ChainVerifyTritonBackend: "TARGET_VERIFY", cb.ChainDraftExtendTritonBackend: "DRAFT_EXTEND_V2"}


def _forward(cls, monkeypatch, sinks=None, score_mod=None, fresh_kv=True, **layer_fields):
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda *a, **k: None)
    calls = []
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls.append(a))
    backend, layer, q, k = chain_backend_stub(cls, **layer_fields)
    fb = SimpleNamespace(forward_mode=forward_mode(SERVED[cls]))
    v = k.clone() if fresh_kv else None
    backend.forward_extend(q, k, v, layer, fb, sinks=sinks, score_mod=score_mod)
    return calls


@pytest.mark.parametrize("cls", BACKENDS, ids=IDS)
@pytest.mark.parametrize("kw, named", [
    (dict(sinks=torch.zeros(4)), "attention sinks"),
    (dict(score_mod=lambda *a: a[0]), "score_mod"),
    (dict(sliding_window_size=128), "sliding window"),
    (dict(is_cross_attention=True), "cross attention"),
    (dict(k_scale=torch.tensor(0.5), k_scale_float=0.5), "non-unit KV scales"),
    (dict(k_scale=torch.tensor(1.0), v_scale_float=2.0), "non-unit KV scales"),
    (dict(xai_temperature_len=8), "xai temperature"),
    (dict(fresh_kv=False), "no fresh K/V"),
], ids=["sinks", "score-mod", "sliding-window", "cross", "k-scale", "v-scale", "xai", "no-kv"])
def test_each_unsupported_layer_feature_is_refused_at_the_forward(monkeypatch, cls, kw, named):
    with pytest.raises(RuntimeError) as info:
        _forward(cls, monkeypatch, **kw)
    msg = str(info.value)
    assert msg.startswith(f"chain {cls.role} attention: layer 0 uses ") and named in msg
    assert msg.endswith(f"; {FIXES[cls]}") and "\n" not in msg


@pytest.mark.parametrize("cls", BACKENDS, ids=IDS)
def test_a_plain_layer_is_served(monkeypatch, cls):
    assert len(_forward(cls, monkeypatch)) == 1
