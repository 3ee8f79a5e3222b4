"""CPU tier: which test fault (``SGLANG_VERIFY_GRAPH_TEST_FAULT``) each chain backend applies. A
fault reaches the launches of its role only (``env.TEST_FAULT_LAUNCHES``: the verify backend's
``TARGET_VERIFY``, the draft-extend backend's ``DRAFT_EXTEND_V2``); kernel faults travel as the
kernel's ``fault=`` argument, and ``wrong_layer_kv`` makes the verify backend hand the kernel,
unfaulted, the K/V buffers of layer ``layer_id - 1`` (the pool's first layer: the second's), a
one-layer pool refused in one line at construction and at the forward. The kernel is replaced by a
recorder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import chain_backend as cb
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.env import ENV_TEST_FAULT, TEST_FAULT_CHOICES, TEST_FAULT_LAUNCHES
from sglang_verify_graph.errors import VerifyGraphConfigError
from sglang_verify_graph.kernel import TEST_FAULTS

from cpu_stubs import chain_backend_stub, chain_config, forward_mode

ROLES = {cb.ChainVerifyTritonBackend: ("verify", "TARGET_VERIFY"),
         cb.ChainDraftExtendTritonBackend: ("draft-extend", "DRAFT_EXTEND_V2")}


@pytest.fixture
def kernel_calls(monkeypatch):
    """Each kernel launch as ``(k_buffer, v_buffer, keyword arguments)``."""
    calls = []
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda *a, **k: None)
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls.append((a[1], a[2], k)))
    return calls


def _layered_pool(backend, layer_num, start_layer=0):
    """Give ``backend`` a KV pool of ``layer_num`` layers from ``start_layer``, each its own K and V
    buffer; returns ``{layer_id: (k, v)}``."""
    bufs = {start_layer + i: (torch.zeros(64, 2, 16), torch.zeros(64, 2, 16)) for i in range(layer_num)}
    backend.token_to_kv_pool = SimpleNamespace(
        start_layer=start_layer, layer_num=layer_num,
        get_key_buffer=lambda i: bufs[i][0], get_value_buffer=lambda i: bufs[i][1])
    return bufs


def _forward(backend, layer, q, k, mode, layer_id):
    layer.layer_id = layer_id
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=forward_mode(mode)))


@pytest.mark.parametrize("cls", list(ROLES), ids=[r[0] for r in ROLES.values()])
@pytest.mark.parametrize("fault", TEST_FAULT_CHOICES)
def test_a_fault_reaches_the_launches_of_its_role_only(kernel_calls, cls, fault):
    role, mode = ROLES[cls]
    backend, layer, q, k = chain_backend_stub(cls)
    bufs = _layered_pool(backend, 3)
    backend.verify_cfg = chain_config(test_fault=fault)
    mine = TEST_FAULT_LAUNCHES[fault] == role
    assert backend.role == role and backend.test_fault == (fault if mine else None)
    _forward(backend, layer, q, k, mode, 2)
    (kb, vb, kw), = kernel_calls
    assert kw["fault"] == (fault if mine and fault in TEST_FAULTS else None)
    read = 1 if mine and fault == cb.WRONG_LAYER_KV else 2
    assert kb is bufs[read][0] and vb is bufs[read][1]


@pytest.mark.parametrize("start_layer", [0, 4], ids=["first-rank", "pipeline-stage-from-4"])
def test_wrong_layer_kv_reads_the_previous_layer_and_the_first_the_second(kernel_calls, start_layer):
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend)
    bufs = _layered_pool(backend, 3, start_layer)
    backend.verify_cfg = chain_config(test_fault=cb.WRONG_LAYER_KV)
    s = start_layer
    for layer_id in (s, s + 1, s + 2):
        _forward(backend, layer, q, k, "TARGET_VERIFY", layer_id)
    got = [next(i for i, (kb, _) in bufs.items() if kb is call[0]) for call in kernel_calls]
    assert got == [s + 1, s, s + 1]
    assert [bufs[i][1] for i in got] == [call[1] for call in kernel_calls]  # V of the same layer
    assert [c[2]["fault"] for c in kernel_calls] == [None] * 3


def test_without_a_fault_each_layer_reads_its_own_kv(kernel_calls):
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend)
    bufs = _layered_pool(backend, 3)
    for layer_id in range(3):
        _forward(backend, layer, q, k, "TARGET_VERIFY", layer_id)
    assert [(c[0], c[1]) for c in kernel_calls] == [bufs[i] for i in range(3)]


def _assert_one_layer_refusal(err):
    msg = str(err)
    assert "\n" not in msg and ENV_TEST_FAULT in msg and cb.WRONG_LAYER_KV in msg
    assert "two or more layers" in msg and f"unset {ENV_TEST_FAULT}" in msg, msg


def test_wrong_layer_kv_on_a_one_layer_pool_is_refused_at_the_forward(kernel_calls):
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend)
    _layered_pool(backend, 1)
    backend.verify_cfg = chain_config(test_fault=cb.WRONG_LAYER_KV)
    with pytest.raises(VerifyGraphConfigError) as info:
        _forward(backend, layer, q, k, "TARGET_VERIFY", 0)
    _assert_one_layer_refusal(info.value)
    assert kernel_calls == []


@pytest.fixture
def triton_init(monkeypatch):
    """SGLang's ``TritonAttnBackend.__init__`` replaced by a stand-in that sets what the chain
    backend's constructor reads (a bf16 [slots, 2, 16] pool of ``settings["layer_num"]`` layers)."""
    settings = {"layer_num": 1}

    def init(self, model_runner, *args, **kwargs):
        kbuf = torch.zeros(64, 2, 16, dtype=torch.bfloat16)
        self.token_to_kv_pool = SimpleNamespace(start_layer=0, layer_num=settings["layer_num"],
                                                get_key_buffer=lambda i: kbuf,
                                                get_value_buffer=lambda i: kbuf)
        self.__dict__.update(sliding_window_size=None, use_sliding_window_kv_pool=False, dcp_size=1,
                             enable_deterministic=False, num_head=4, use_mla=False)

    monkeypatch.setattr(adapter.triton_attn_backend_cls(), "__init__", init)
    monkeypatch.setattr(adapter, "kv_translation_active", lambda backend: False)
    return settings


RUNNER = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))


def test_wrong_layer_kv_on_a_one_layer_model_is_refused_at_construction(triton_init):
    cfg = chain_config(test_fault=cb.WRONG_LAYER_KV)
    with pytest.raises(VerifyGraphConfigError) as info:
        cb.ChainVerifyTritonBackend(RUNNER, cfg)
    _assert_one_layer_refusal(info.value)
    cb.ChainDraftExtendTritonBackend(RUNNER, cfg)  # not the draft extend's fault: built
    cb.ChainVerifyTritonBackend(RUNNER, chain_config())  # no fault: built
    triton_init["layer_num"] = 2
    assert cb.ChainVerifyTritonBackend(RUNNER, cfg).test_fault == cb.WRONG_LAYER_KV
