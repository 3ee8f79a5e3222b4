"""``VerifyCudaGraphRunner.__init__`` and ``get_spec_info`` around SGLang's runner (its
``__init__``, which builds the buffers and captures, replaced by a stand-in that sets what it
sets): the backend the runner accepts, the capture it refuses (mode, tokens per request), the
static-buffer declaration it checks SGLang's buffers against, what it writes into the counters,
when the self-test probe replaces the inert one, and the tree mask it drops for the chain kernel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import counters as C
from sglang_verify_graph import runner as R
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend
from sglang_verify_graph.debug.selftest import NO_PROBE

from cpu_stubs import chain_config, forward_mode

MAX_BS, NDT, HIDDEN, VOCAB = 8, 3, 16, 32


def _buffers(bs=MAX_BS, ndt=NDT):
    t = bs * ndt
    z = lambda n: torch.zeros(n, dtype=torch.int64)  # noqa: E731
    return SimpleNamespace(input_ids=z(t), positions=z(t), out_cache_loc=z(t), req_pool_indices=z(bs),
                           seq_lens=z(bs))


@pytest.fixture
def parent(monkeypatch):
    """SGLang's runner ``__init__`` replaced: it records the probe seen during capture and sets
    the captured mode / width / buckets / buffers given in ``parent.state``."""
    cls = adapter.decode_cuda_graph_runner_cls()
    rec = SimpleNamespace(state=dict(capture_forward_mode=forward_mode("TARGET_VERIFY"), captured_req_width=NDT,
                                     max_bs=MAX_BS, capture_bs=[1, 2, 4, 8], buffers=_buffers()),
                          probe_during_capture=[])

    def init(self, model_runner):
        rec.probe_during_capture.append(self.probe)
        rec.model_runner = model_runner
        self.__dict__.update(rec.state)

    monkeypatch.setattr(cls, "__init__", init)
    return rec


def _chain_backend(use_mla=False, numel=(640, 40)):
    backend = ChainVerifyTritonBackend.__new__(ChainVerifyTritonBackend)
    backend.use_mla, backend.chain_workspace_numel = use_mla, numel
    return backend


class FlashMLABackend:  # a native backend, by class name as SGLang's
    pass


def _model_runner(backend, aux_layers=None):
    return SimpleNamespace(attn_backend=backend, model_config=SimpleNamespace(hidden_size=HIDDEN, vocab_size=VOCAB),
                           spec_aux_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=aux_layers))


@pytest.mark.parametrize("use_mla", [False, True], ids=["MHA", "MLA"])
def test_a_chain_runner_declares_its_buffers_and_fills_the_counters(parent, use_mla):
    counters = C.VerifyCounters()
    mr = _model_runner(_chain_backend(use_mla), aux_layers=[1, 5])
    r = R.VerifyCudaGraphRunner(mr, chain_config(), counters)
    assert parent.model_runner is mr  # SGLang's capture runs on this model runner
    assert r.chain is True and r.verify_cfg.num_draft_tokens == NDT and r.counters is counters
    assert r.static_buffers == R.VerifyStaticBuffers(
        max_bs=MAX_BS, num_draft_tokens=NDT, hidden_size=HIDDEN, num_aux_hidden=2, vocab_size=VOCAB,
        chain_out_numel=640, chain_lse_numel=40)
    assert counters.capture_bs == [1, 2, 4, 8] and counters.capture_bs is not r.capture_bs
    assert counters.num_draft_tokens == NDT and 0 < counters.capture_seconds < 60
    assert counters.attention == f"chain split-KV ({'MLA' if use_mla else 'MHA'})"
    assert parent.probe_during_capture == [NO_PROBE] and r.probe is NO_PROBE


def test_a_native_runner_keeps_the_backend_and_names_it(parent):
    counters = C.VerifyCounters()
    cfg = chain_config(verify_attention="native", attention_backend="flashmla")
    r = R.VerifyCudaGraphRunner(_model_runner(FlashMLABackend()), cfg, counters)
    assert r.chain is False
    assert (r.static_buffers.chain_out_numel, r.static_buffers.chain_lse_numel) == (0, 0)
    assert r.static_buffers.num_aux_hidden == 3  # the draft names no layers: EAGLE-3's three
    assert counters.attention == "native flashmla (FlashMLABackend)"


def test_a_chain_config_on_another_backend_is_a_wiring_error(parent):
    with pytest.raises(RuntimeError, match=r"^VerifyCudaGraphRunner needs ChainVerifyTritonBackend, got FlashMLABackend$"):
        R.VerifyCudaGraphRunner(_model_runner(FlashMLABackend()), chain_config(), C.VerifyCounters())
    assert parent.probe_during_capture == []  # refused before SGLang's capture


@pytest.mark.parametrize("mode, width", [("DECODE", NDT), ("TARGET_VERIFY", NDT + 1)])
def test_a_capture_of_the_wrong_mode_or_width_is_refused(parent, mode, width):
    parent.state.update(capture_forward_mode=forward_mode(mode), captured_req_width=width)
    with pytest.raises(RuntimeError, match=rf"^VerifyCudaGraphRunner captured {mode} x {width} tokens/request, "
                                           rf"expected TARGET_VERIFY x {NDT}$"):
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()), chain_config(), C.VerifyCounters())


def test_sglang_buffers_too_small_for_the_graph_stop_the_capture(parent):
    parent.state["buffers"] = _buffers(bs=4)
    counters = C.VerifyCounters()
    with pytest.raises(RuntimeError, match=r"static buffer input_ids is \(12,\)"):
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()), chain_config(), counters)
    assert counters.capture_bs == []  # nothing recorded for a refused capture


@pytest.mark.parametrize("nan", [False, True])
def test_the_selftest_probe_is_installed_after_capture_when_asked(parent, monkeypatch, nan):
    made = []
    monkeypatch.setattr(R, "GraphSelfTest", lambda runner, inject_nan: made.append((runner, inject_nan)) or "PROBE")
    r = R.VerifyCudaGraphRunner(_model_runner(_chain_backend()), chain_config(selftest=True, selftest_nan=nan),
                                C.VerifyCounters())
    assert r.probe == "PROBE" and made == [(r, nan)]
    assert parent.probe_during_capture == [NO_PROBE]


def test_the_declaration_is_logged_at_debug(parent, caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="sglang_verify_graph"):
        r = R.VerifyCudaGraphRunner(_model_runner(_chain_backend()), chain_config(), C.VerifyCounters())
    assert f"verify graph static buffers: {r.static_buffers.describe()}" in caplog.messages


@pytest.mark.parametrize("chain", [True, False])
def test_the_chain_kernel_drops_the_tree_mask_a_native_backend_keeps_it(monkeypatch, chain):
    cls = adapter.decode_cuda_graph_runner_cls()
    monkeypatch.setattr(cls, "get_spec_info", lambda self, n: None if n == 0 else SimpleNamespace(custom_mask="MASK", n=n))
    r = R.VerifyCudaGraphRunner.__new__(R.VerifyCudaGraphRunner)
    r.chain = chain
    spec = r.get_spec_info(12)
    assert spec.n == 12 and spec.custom_mask == (None if chain else "MASK")
    assert r.get_spec_info(0) is None
