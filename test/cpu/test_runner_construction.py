"""``VerifyCudaGraphRunner(model_runner)`` and ``get_spec_info`` around SGLang's runner (its
``__init__``, which builds the buffers and captures, replaced by a stand-in that sets what it
sets): the plan and backend the runner accepts, the capture it refuses (mode, tokens per request),
the static-buffer declaration it checks SGLang's buffers against, the counters it installs and
fills (capture time and GPU memory), the out-of-memory line, when the self-test probe replaces the
inert one, and the tree mask it drops for the chain kernel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import counters as C
from sglang_verify_graph import plan as P
from sglang_verify_graph import runner as R
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend
from sglang_verify_graph.debug import NO_PROBE

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


def _model_runner(backend, cfg=None, aux_layers=None):
    """A model runner whose plan (``plan.verify_plan``) is already decided: ours with ``cfg``
    (default: the chain config), of the kind ``cfg.verify_attention`` names."""
    cfg = cfg or chain_config()
    mr = SimpleNamespace(attn_backend=backend, model_config=SimpleNamespace(hidden_size=HIDDEN, vocab_size=VOCAB),
                         spec_aux_config=SimpleNamespace(eagle_aux_hidden_state_layer_ids=aux_layers))
    setattr(mr, P._PLAN_ATTR, P.VerifyPlan(cfg.verify_attention, cfg))
    return mr


@pytest.fixture(autouse=True)
def gpu_memory(monkeypatch):
    """Free GPU memory, GiB, as the adapter reads it: 10.0 before the capture, 9.25 after. Returns
    the model runners it was read for, in order."""
    readings, seen = iter([10.0, 9.25]), []
    monkeypatch.setattr(R.adapter, "available_gpu_memory", lambda mr: seen.append(mr) or next(readings))
    return seen


@pytest.mark.parametrize("use_mla", [False, True], ids=["MHA", "MLA"])
def test_a_chain_runner_declares_its_buffers_and_fills_the_counters(parent, gpu_memory, use_mla):
    mr = _model_runner(_chain_backend(use_mla), chain_config(log_every=7), aux_layers=[1, 5])
    r = R.VerifyCudaGraphRunner(mr)
    counters = r.counters
    assert parent.model_runner is mr  # SGLang's capture runs on this model runner
    assert gpu_memory == [mr, mr]  # free memory of this runner's device, before and after
    assert counters.log_every == 7
    assert r.chain is True and r.verify_cfg.num_draft_tokens == NDT and C.get_counters() is counters
    assert r.static_buffers == R.VerifyStaticBuffers(
        max_bs=MAX_BS, num_draft_tokens=NDT, hidden_size=HIDDEN, num_aux_hidden=2, vocab_size=VOCAB,
        chain_out_numel=640, chain_lse_numel=40)
    assert counters.capture_bs == [1, 2, 4, 8] and counters.capture_bs is not r.capture_bs
    assert counters.num_draft_tokens == NDT and 0 < counters.capture_seconds < 60
    assert counters.attention == f"chain split-KV ({'MLA' if use_mla else 'MHA'})"
    assert counters.graph_mem_gib == pytest.approx(0.75)
    assert parent.probe_during_capture == [NO_PROBE] and r.probe is NO_PROBE


def test_a_native_runner_keeps_the_backend_and_names_it(parent):
    cfg = chain_config(verify_attention="native", attention_backend="flashmla")
    r = R.VerifyCudaGraphRunner(_model_runner(FlashMLABackend(), cfg))
    counters = r.counters
    assert r.chain is False
    assert (r.static_buffers.chain_out_numel, r.static_buffers.chain_lse_numel) == (0, 0)
    assert r.static_buffers.num_aux_hidden == 3  # the draft names no layers: EAGLE-3's three
    assert counters.attention == "native flashmla (FlashMLABackend)"


def test_a_chain_config_on_another_backend_is_a_wiring_error(parent):
    with pytest.raises(RuntimeError, match=r"^VerifyCudaGraphRunner needs ChainVerifyTritonBackend, got FlashMLABackend$"):
        R.VerifyCudaGraphRunner(_model_runner(FlashMLABackend()))
    assert parent.probe_during_capture == []  # refused before SGLang's capture


def test_an_upstream_plan_is_a_wiring_error(parent):
    mr = _model_runner(_chain_backend())
    setattr(mr, P._PLAN_ATTR, P.VerifyPlan(P.UPSTREAM))
    with pytest.raises(RuntimeError, match=r"^VerifyCudaGraphRunner needs the flag, got ChainVerifyTritonBackend$"):
        R.VerifyCudaGraphRunner(mr)
    assert parent.probe_during_capture == []


def test_keyword_arguments_are_a_wiring_error(parent):
    with pytest.raises(RuntimeError, match=r"unexpected arguments \['attn_backend'\]"):
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()), attn_backend=None)
    assert parent.probe_during_capture == []


@pytest.mark.parametrize("message, oom", [("CUDA out of memory. Tried to allocate 2 GiB", True),
                                          ("illegal memory access", False)])
def test_a_capture_out_of_gpu_memory_is_one_line(monkeypatch, message, oom):
    cls = adapter.decode_cuda_graph_runner_cls()

    def init(self, model_runner):
        raise RuntimeError(message)

    monkeypatch.setattr(cls, "__init__", init)
    with pytest.raises(RuntimeError) as e:
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()))
    assert str(e.value) == (R.OOM_MESSAGE if oom else message)
    assert (e.value.__cause__ is not None) is oom


@pytest.mark.parametrize("mode, width", [("DECODE", NDT), ("TARGET_VERIFY", NDT + 1)])
def test_a_capture_of_the_wrong_mode_or_width_is_refused(parent, mode, width):
    parent.state.update(capture_forward_mode=forward_mode(mode), captured_req_width=width)
    with pytest.raises(RuntimeError, match=rf"^VerifyCudaGraphRunner captured {mode} x {width} tokens/request, "
                                           rf"expected TARGET_VERIFY x {NDT}$"):
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()))


def test_sglang_buffers_too_small_for_the_graph_stop_the_capture(parent):
    parent.state["buffers"] = _buffers(bs=4)
    with pytest.raises(RuntimeError, match=r"static buffer input_ids is \(12,\)"):
        R.VerifyCudaGraphRunner(_model_runner(_chain_backend()))
    assert C.get_counters().capture_bs == []  # nothing recorded for a refused capture


@pytest.mark.parametrize("nan", [False, True])
def test_the_selftest_probe_is_installed_after_capture_when_asked(parent, monkeypatch, nan):
    made = []
    from sglang_verify_graph.debug import selftest

    monkeypatch.setattr(selftest, "GraphSelfTest", lambda runner, inject_nan: made.append((runner, inject_nan)) or "PROBE")
    r = R.VerifyCudaGraphRunner(_model_runner(_chain_backend(), chain_config(selftest=True, selftest_nan=nan)))
    assert r.probe == "PROBE" and made == [(r, nan)]
    assert parent.probe_during_capture == [NO_PROBE]


def test_the_declaration_is_logged_at_debug(parent, caplog):
    import logging

    with caplog.at_level(logging.DEBUG, logger="sglang_verify_graph"):
        r = R.VerifyCudaGraphRunner(_model_runner(_chain_backend()))
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


@pytest.mark.parametrize("max_running", [None, 8, 32])
def test_the_capture_is_logged_and_an_eager_range_warned(parent, caplog, max_running):
    """One INFO line says what was captured; a WARNING names the batch sizes above the largest
    bucket (8 here) that will verify eagerly, exactly as ``counters.eager_cliff_warning`` words it."""
    import logging
    import re

    mr = _model_runner(_chain_backend())
    mr.max_running_requests = max_running
    with caplog.at_level(logging.INFO, logger="sglang_verify_graph"):
        R.VerifyCudaGraphRunner(mr)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) == 1 and re.fullmatch(
        r"VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=\[1, 2, 4, 8\], num_draft_tokens=3 "
        r"tokens/request, attention=chain split-KV \(MHA\), \d+\.\d\d s, 0\.750 GiB", info[0]), info
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if max_running == 32:
        assert warned == [C.eager_cliff_warning(32, [1, 2, 4, 8])] and "9..32 requests" in warned[0]
    else:
        assert warned == []
