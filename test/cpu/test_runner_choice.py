"""Which decode-graph runner a model runner gets: ours for the EAGLE topk=1 target whose attention
backend the verify graph serves; upstream's for every other runner; and never upstream's silently
when the flag is on but SGLang wrapped the backend (hybrid linear-attention / sparse models); and
the plan behind every such decision is made once per model runner."""

from types import SimpleNamespace

import pytest

from sglang_verify_graph import plan as P
from sglang_verify_graph.config import VerifyGraphConfig, VerifyGraphConfigError

CFG = VerifyGraphConfig(num_steps=3, num_draft_tokens=4, topk=1, speculative_algorithm="EAGLE3",
                        attention_backend="triton", page_size=1, max_running_requests=None,
                        num_kv_splits=None, log_every=0)


def _runner(draft=False, eagle=True, topk=1, backend=None):
    return SimpleNamespace(
        is_draft_worker=draft, attn_backend=backend or SimpleNamespace(),
        spec_algorithm=SimpleNamespace(is_eagle=lambda: eagle),
        server_args=SimpleNamespace(speculative_eagle_topk=topk),
    )


@pytest.fixture
def flag_on(monkeypatch):
    monkeypatch.setattr(P, "flag_config", lambda mr: CFG)


def test_wrapped_backend_with_flag_on_is_refused(flag_on):
    with pytest.raises(VerifyGraphConfigError, match="remove --enable-verify-cuda-graph"):
        P.refuse_if_flag_lost(_runner(backend=SimpleNamespace(full_attn_backend=object())))


@pytest.mark.parametrize("kw", [dict(draft=True), dict(eagle=False), dict(topk=4)],
                         ids=["draft", "not-eagle", "topk4"])
def test_other_runners_fall_back_to_upstream(flag_on, kw):
    P.refuse_if_flag_lost(_runner(**kw))  # no error: upstream's runner is the right one


def test_flag_off_falls_back_to_upstream(monkeypatch):
    monkeypatch.setattr(P, "flag_config", lambda mr: None)
    P.refuse_if_flag_lost(_runner())


def test_capture_hook_refuses_a_wrapped_chain_backend(flag_on):
    """SGLang's ``attn_backend_wrapper`` wraps the backend our triton factory built for hybrid
    linear-attention / sparse models (``HybridLinearAttnBackend(full_attn_backend=
    ChainVerifyTritonBackend)``). With the flag on, the version's capture hook must stop the start
    with the one-line error rather than capture upstream's runner (no counters, no chain kernel)."""
    from sglang_verify_graph import chain_backend as cb
    from sglang_verify_graph import plugin
    from sglang_verify_graph.compat.sglang_adapter import RUNNER_CLS_HOOK

    chain = cb.ChainVerifyTritonBackend.__new__(cb.ChainVerifyTritonBackend)
    model_runner = _runner(backend=SimpleNamespace(full_attn_backend=chain))
    upstream = type("UpstreamDecodeCudaGraphRunner", (), {})
    with pytest.raises(VerifyGraphConfigError, match="remove --enable-verify-cuda-graph") as info:
        if RUNNER_CLS_HOOK:  # 0.5.17 on: ModelRunner._decode_cuda_graph_runner_cls picks the class
            plugin.decode_runner_cls_hook(lambda mr: upstream, model_runner)
        else:  # 0.5.16 captures in cuda_graph_setup.capture_decode_graph
            plugin.capture_decode_graph_hook(lambda **kw: upstream, model_runner=model_runner)
    assert info.value.value == "SimpleNamespace"


def test_the_plan_is_decided_once_per_model_runner(monkeypatch):
    """The attention factory, the runner choice, the refusal check and the QLEN_ONLY mask hook all
    ask the plan; the server args are validated once per model runner (``config.build_config``),
    not once per hook."""
    from sglang_verify_graph import plugin

    built = []
    monkeypatch.setattr(P, "build_config", lambda args: built.append(args) or CFG)
    monkeypatch.setattr(P.adapter, "resolved", lambda args: args)
    runner = _runner()
    plugin.triton_factory(lambda r: "upstream backend")  # the factory itself asks nothing yet
    for _ in range(3):
        assert P.verify_plan(runner) == P.VerifyPlan("chain", CFG)
        assert P.runner_kind(runner) is None  # its backend is not the chain backend
        with pytest.raises(VerifyGraphConfigError):
            P.refuse_if_flag_lost(runner)
    assert built == [runner.server_args]
    other = _runner()
    P.verify_plan(other)
    assert built == [runner.server_args, other.server_args]


def test_a_refused_config_is_not_kept(monkeypatch):
    """A conflicting setting raises at every ask (no plan is kept for the runner)."""
    calls = []

    def refuse(args):
        calls.append(args)
        raise VerifyGraphConfigError("conflicts", "--flag", "x", "fix it")

    monkeypatch.setattr(P, "build_config", refuse)
    monkeypatch.setattr(P.adapter, "resolved", lambda args: args)
    runner = _runner()
    for _ in range(2):
        with pytest.raises(VerifyGraphConfigError):
            P.verify_plan(runner)
    assert len(calls) == 2


def test_the_flag_config_is_built_once_per_model_runner(monkeypatch):
    """``flag_config`` (also read by the draft runner's hooks, which have no plan of their own)
    validates the server args once per model runner: a second call returns the kept config."""
    built = []
    monkeypatch.setattr(P, "build_config", lambda args: built.append(args) or CFG)
    monkeypatch.setattr(P.adapter, "resolved", lambda args: args)
    runner, other = _runner(), _runner()
    assert [P.flag_config(runner) for _ in range(3)] == [CFG] * 3
    assert P.flag_config(other) is CFG and built == [runner.server_args, other.server_args]


def test_a_flag_off_config_is_kept_too(monkeypatch):
    built = []
    monkeypatch.setattr(P, "build_config", lambda args: built.append(args))
    monkeypatch.setattr(P.adapter, "resolved", lambda args: args)
    runner = _runner()
    assert P.flag_config(runner) is None and P.flag_config(runner) is None and len(built) == 1


def test_the_plan_is_kept_on_the_runner_from_its_first_ask(flag_on):
    """Decided at the first ask: the same plan afterwards, even if the runner changes."""
    runner = _runner()
    plan = P.verify_plan(runner)
    runner.is_draft_worker = True  # would make it upstream's if decided again
    assert P.verify_plan(runner) is plan and plan.kind == P.CHAIN


def test_no_model_runner_is_upstreams():
    plan = P.verify_plan(None)
    assert plan == P.VerifyPlan(P.UPSTREAM) and not plan.ours


def test_a_runner_with_the_chain_backend_keeps_its_plan_without_refusal(flag_on):
    from sglang_verify_graph import chain_backend as cb

    runner = _runner(backend=cb.ChainVerifyTritonBackend.__new__(cb.ChainVerifyTritonBackend))
    assert P.runner_kind(runner) == P.CHAIN
    assert P.refuse_if_flag_lost(runner) is None


def test_a_runner_without_an_attention_backend_is_refused_naming_none(flag_on):
    runner = _runner()
    del runner.attn_backend
    assert P.runner_kind(runner) is None
    with pytest.raises(VerifyGraphConfigError) as info:
        P.refuse_if_flag_lost(runner)
    assert info.value.value == "NoneType"


def test_the_refusal_names_the_backend_the_plan_expects_and_the_one_the_model_got(monkeypatch):
    """A native plan (flashmla: ``FlashMLABackend``) on a runner whose backend is a wrapper; the
    whole one-line message."""
    cfg = VerifyGraphConfig(num_steps=3, num_draft_tokens=4, topk=1, speculative_algorithm="EAGLE3",
                            attention_backend="flashmla", page_size=1, max_running_requests=None,
                            num_kv_splits=None, log_every=0, verify_attention="native")
    monkeypatch.setattr(P, "flag_config", lambda mr: cfg)
    wrapper = type("HybridLinearAttnBackend", (), {})()
    with pytest.raises(VerifyGraphConfigError) as info:
        P.refuse_if_flag_lost(_runner(backend=wrapper))
    e = info.value
    assert (e.flag, e.value) == ("attention backend", "HybridLinearAttnBackend")
    assert str(e) == (
        "--enable-verify-cuda-graph: with --attention-backend flashmla the verify graph serves "
        "FlashMLABackend, but this model got another attention backend (an attention wrapper, e.g. "
        "hybrid linear or sparse attention, or for flashinfer/flashmla a target without MLA) "
        "(attention backend = HybridLinearAttnBackend). Fix: pass --attention-backend triton, or "
        "remove --enable-verify-cuda-graph for this model.")


def test_a_native_plan_for_a_backend_without_classes_serves_none():
    """A native plan whose backend has no class list (none of ``backends.NATIVE_BACKEND_CLASSES``)
    expects no backend class: such a runner is refused, not crashed on."""
    cfg = VerifyGraphConfig(num_steps=3, num_draft_tokens=4, topk=1, speculative_algorithm="EAGLE3",
                            attention_backend="no-such-backend", page_size=1, max_running_requests=None,
                            num_kv_splits=None, log_every=0)
    assert P.expected_backends(P.VerifyPlan(P.NATIVE, cfg)) == ()
    assert P.expected_backends(P.VerifyPlan(P.CHAIN, cfg)) == ("ChainVerifyTritonBackend",)
    assert P.expected_backends(P.VerifyPlan(P.UPSTREAM, cfg)) == ()


def test_the_refusal_lists_every_backend_class_the_plan_serves(monkeypatch):
    cfg = VerifyGraphConfig(num_steps=3, num_draft_tokens=4, topk=1, speculative_algorithm="EAGLE3",
                            attention_backend="flashinfer", page_size=1, max_running_requests=None,
                            num_kv_splits=None, log_every=0, verify_attention="native")
    monkeypatch.setattr(P, "flag_config", lambda mr: cfg)
    monkeypatch.setitem(P.NATIVE_BACKEND_CLASSES, "flashinfer", ("FlashInferMLAAttnBackend", "OtherMLABackend"))
    with pytest.raises(VerifyGraphConfigError) as info:
        P.refuse_if_flag_lost(_runner())
    assert "the verify graph serves FlashInferMLAAttnBackend / OtherMLABackend, but" in str(info.value)
