"""The draft's DRAFT_EXTEND_V2 attention: which backend the draft gets, which forward mode each
chain backend serves (and with which ``seq_lens`` convention), and how draft-extend replays and
eager forwards are counted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import draft_extend as DE
from sglang_verify_graph import plugin
from sglang_verify_graph import chain_backend as cb
from sglang_verify_graph import counters as C
from sglang_verify_graph.env import ENV_DRAFT_EXTEND, read_env
from sglang_verify_graph.errors import VerifyGraphConfigError

from cpu_stubs import chain_backend_stub, chain_config, forward_mode as _mode

CFG = chain_config()


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda *a, **k: None)
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls.append(k))
    return calls


@pytest.fixture
def upstream_calls(monkeypatch):
    calls = []
    parent = cb.adapter.triton_attn_backend_cls()
    monkeypatch.setattr(parent, "forward_extend", lambda self, *a, **k: calls.append("upstream"))
    return calls


@pytest.mark.parametrize("cls, mode, include_chain", [
    (cb.ChainVerifyTritonBackend, "TARGET_VERIFY", False),
    (cb.ChainDraftExtendTritonBackend, "DRAFT_EXTEND_V2", True),
], ids=["verify", "draft-extend"])
def test_each_backend_serves_its_mode_with_its_seq_lens(kernel_calls, upstream_calls, cls, mode,
                                                        include_chain):
    """TARGET_VERIFY's ``seq_lens`` are the prefix; DRAFT_EXTEND_V2's already include the chain
    (prefix + num_draft_tokens), so the draft-extend backend must tell the kernel so: without it
    every draft-extend row would see ``num_draft_tokens`` keys past its own position."""
    backend, layer, q, k = chain_backend_stub(cls)
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=_mode(mode)))
    assert upstream_calls == []
    assert [c["seq_lens_include_chain"] for c in kernel_calls] == [include_chain]


@pytest.mark.parametrize("cls, other", [
    (cb.ChainVerifyTritonBackend, "DRAFT_EXTEND_V2"),
    (cb.ChainVerifyTritonBackend, "EXTEND"),
    (cb.ChainDraftExtendTritonBackend, "TARGET_VERIFY"),
    (cb.ChainDraftExtendTritonBackend, "EXTEND"),
], ids=["verify-backend/draft-extend", "verify-backend/extend", "draft-extend-backend/verify",
        "draft-extend-backend/extend"])
def test_every_other_mode_is_upstream(kernel_calls, upstream_calls, cls, other):
    backend, layer, q, k = chain_backend_stub(cls)
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=_mode(other)))
    assert kernel_calls == [] and upstream_calls == ["upstream"]


@pytest.mark.parametrize("fault", ["causal_plus_one", "causal_minus_one", "drop_first_split"])
def test_the_config_test_fault_reaches_verify_launches_only(kernel_calls, upstream_calls, fault):
    """``SGLANG_VERIFY_GRAPH_TEST_FAULT`` travels env -> config -> the verify backend -> the
    kernel launch; the draft-extend launches never get it."""
    for cls, mode, want in ((cb.ChainVerifyTritonBackend, "TARGET_VERIFY", fault),
                            (cb.ChainDraftExtendTritonBackend, "DRAFT_EXTEND_V2", None)):
        backend, layer, q, k = chain_backend_stub(cls)
        backend.verify_cfg = chain_config(test_fault=fault)
        backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=_mode(mode)))
        assert kernel_calls.pop()["fault"] == want


def test_without_the_variable_no_launch_is_faulted(kernel_calls, upstream_calls):
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend)
    backend.verify_cfg = chain_config(test_fault=read_env({}).test_fault)
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=_mode("TARGET_VERIFY")))
    assert kernel_calls == [{"seq_lens_include_chain": False, "fault": None}]


def test_reference_switch_serves_draft_extend_with_upstream(kernel_calls, upstream_calls):
    """The self-test's independent reference: SGLang's own DRAFT_EXTEND_V2 attention."""
    backend, layer, q, k = chain_backend_stub(cb.ChainDraftExtendTritonBackend)
    backend.reference = True
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=_mode("DRAFT_EXTEND_V2")))
    assert kernel_calls == [] and upstream_calls == ["upstream"]


# ---- which backend the draft gets -----------------------------------------------------------
@pytest.fixture
def built(monkeypatch):
    made = []

    class Ours:
        use_mla = False

        def __init__(self, runner, cfg):
            made.append((runner, cfg))

    monkeypatch.setattr(DE, "ChainDraftExtendTritonBackend", Ours)
    monkeypatch.setattr(C, "_COUNTERS", None)
    monkeypatch.setattr(C, "_DRAFT_EXTEND_ATTENTION", "")
    return made, Ours


def _upstream_triton():
    parent = cb.adapter.triton_attn_backend_cls()
    b = parent.__new__(parent)
    b.prefill_attention_backend_str = b.decode_attention_backend_str = "triton"
    return b


def test_draft_gets_the_chain_backend_with_the_flag_on(monkeypatch, built):
    made, ours = built
    monkeypatch.setattr(DE, "flag_config", lambda mr: CFG)
    runner = object()
    got = DE.draft_extend_backend_for(runner, _upstream_triton())
    assert isinstance(got, ours) and made == [(runner, CFG)]
    assert got.prefill_attention_backend_str == "triton"  # 0.5.23's stamps carried over
    # SGLang builds the draft's backends before it captures the target's graphs (and installs
    # the counters): the counters installed after still report the draft-extend attention
    assert C.get_counters() is None
    C.install_counters(C.VerifyCounters())
    assert C.get_counters().snapshot()["draft_extend"]["attention"] == "chain split-KV (MHA)"


@pytest.mark.parametrize("case", ["flag-off", "upstream-chosen", "not-exactly-triton"])
def test_draft_keeps_its_backend_otherwise(monkeypatch, built, case):
    made, _ = built
    C.install_counters(C.VerifyCounters())
    cfg = {"flag-off": None, "upstream-chosen": chain_config(draft_extend_attention="upstream")}.get(case, CFG)
    monkeypatch.setattr(DE, "flag_config", lambda mr: cfg)
    backend = _upstream_triton() if case != "not-exactly-triton" else SimpleNamespace()
    assert DE.draft_extend_backend_for(object(), backend) is backend
    assert made == [] and "draft_extend" not in C.get_counters().snapshot()


def test_factory_hook_hands_the_draft_runner_over(monkeypatch):
    seen = []
    monkeypatch.setattr(DE, "draft_extend_backend_for", lambda mr, b: seen.append((mr, b)) or "ours")
    factory = SimpleNamespace(draft_model_runner="draft-runner")
    assert plugin.draft_extend_backend_hook(lambda self: "upstream", factory) == "ours"
    assert seen == [("draft-runner", "upstream")]


def test_draft_extend_choice_is_read_from_the_environment():
    assert read_env({}).draft_extend == "chain"
    assert read_env({ENV_DRAFT_EXTEND: "Upstream"}).draft_extend == "upstream"
    with pytest.raises(VerifyGraphConfigError) as info:
        read_env({ENV_DRAFT_EXTEND: "fast"})
    assert ENV_DRAFT_EXTEND in str(info.value) and "\n" not in str(info.value)


# ---- counting -------------------------------------------------------------------------------
@pytest.fixture
def counters(monkeypatch):
    c = C.VerifyCounters(draft_extend_attention="chain split-KV (MHA)")
    monkeypatch.setattr(C, "_COUNTERS", c)
    monkeypatch.setattr(plugin, "get_counters", lambda: c)
    return c


def _draft_extend_runner(bs, raw_bs):
    backend = cb.ChainDraftExtendTritonBackend.__new__(cb.ChainDraftExtendTritonBackend)
    backend.verify_cfg = CFG
    runner = SimpleNamespace(draft_extend_attn_backend=backend)

    def execute(self, forward_batch, *rest):  # what SGLang's execute sets before the replay
        self.bs, self.raw_bs = bs, raw_bs
        return "out"

    return runner, execute


def test_each_draft_extend_replay_is_counted_with_its_padding(counters):
    runner, execute = _draft_extend_runner(bs=4, raw_bs=3)
    for _ in range(2):
        assert plugin.draft_extend_execute_hook(execute, runner, SimpleNamespace()) == "out"
    snap = counters.snapshot()["draft_extend"]
    assert snap["replays"] == 2 and snap["padded_rows"] == 2 and snap["eager"] == 0


def test_replays_of_an_upstream_draft_extend_graph_are_not_counted(counters):
    runner, execute = _draft_extend_runner(bs=1, raw_bs=1)
    runner.draft_extend_attn_backend = _upstream_triton()
    plugin.draft_extend_execute_hook(execute, runner, SimpleNamespace())
    assert counters.draft_extend_replays == 0


@pytest.mark.parametrize("backend, mode, eager", [
    (cb.ChainDraftExtendTritonBackend, "DRAFT_EXTEND_V2", 1),
    (cb.ChainDraftExtendTritonBackend, "EXTEND", 0),       # the draft's prefill
    (None, "DRAFT_EXTEND_V2", 0),                          # an upstream draft-extend backend
], ids=["chain-draft-extend", "draft-prefill", "upstream-backend"])
def test_eager_draft_extend_is_counted_where_sglang_dispatches_it(counters, backend, mode, eager):
    b = backend.__new__(backend) if backend else _upstream_triton()
    model_runner = SimpleNamespace(attn_backend=b, decode_cuda_graph_runner=None)
    out = plugin.forward_raw_hook(lambda mr, fb: "ran", model_runner,
                                  SimpleNamespace(forward_mode=_mode(mode)))
    assert out == "ran" and counters.draft_extend_eager == eager
    assert counters.verify_steps == 0  # never counted as a verify step


@pytest.mark.parametrize("takes_select_index", [False, True], ids=["before-0.5.20", "0.5.20-on"])
def test_the_probe_sees_each_replay_with_its_select_index(counters, monkeypatch, takes_select_index):
    """From SGLang 0.5.20 ``execute(forward_batch, select_index)`` returns one row per request:
    the probe gets ``select_index`` to pick the same rows of its reference; before, it gets
    ``None``."""
    from sglang_verify_graph.compat import sglang_adapter

    monkeypatch.setattr(sglang_adapter, "DRAFT_EXTEND_SELECT_INDEX", takes_select_index)
    seen = []

    class Probe:
        def before_execute(self, runner, fb):
            seen.append("before")

        def after_execute(self, runner, fb, out, select_index=None):
            seen.append(("after", out, select_index))

    monkeypatch.setattr(DE, "draft_extend_probe", lambda runner: Probe())
    runner, execute = _draft_extend_runner(bs=2, raw_bs=2)
    plugin.draft_extend_execute_hook(execute, runner, SimpleNamespace(), "rows")
    plugin.draft_extend_execute_hook(execute, runner, SimpleNamespace())
    rows = "rows" if takes_select_index else None
    assert seen == ["before", ("after", "out", rows), "before", ("after", "out", None)]
