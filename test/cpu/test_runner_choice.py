"""Which decode-graph runner a model runner gets: ours for the EAGLE topk=1 target whose attention
backend the verify graph serves; upstream's for every other runner; and never upstream's silently
when the flag is on but SGLang wrapped the backend (hybrid linear-attention / sparse models)."""

from types import SimpleNamespace

import pytest

from sglang_verify_graph import capture
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
    monkeypatch.setattr(capture, "config_for", lambda mr: CFG)


def test_wrapped_backend_with_flag_on_is_refused(flag_on):
    with pytest.raises(VerifyGraphConfigError, match="remove --enable-verify-cuda-graph"):
        capture.refuse_if_flag_lost(_runner(backend=SimpleNamespace(full_attn_backend=object())))


@pytest.mark.parametrize("kw", [dict(draft=True), dict(eagle=False), dict(topk=4)],
                         ids=["draft", "not-eagle", "topk4"])
def test_other_runners_fall_back_to_upstream(flag_on, kw):
    capture.refuse_if_flag_lost(_runner(**kw))  # no error: upstream's runner is the right one


def test_flag_off_falls_back_to_upstream(monkeypatch):
    monkeypatch.setattr(capture, "config_for", lambda mr: None)
    capture.refuse_if_flag_lost(_runner())


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


def test_capture_out_of_memory_is_one_actionable_line(monkeypatch):
    """A capture that runs out of GPU memory raises the one line naming the flags that shrink the
    graphs (the original error chained); any other capture error propagates unchanged."""
    from sglang_verify_graph.compat import sglang_adapter

    monkeypatch.setattr(sglang_adapter, "available_gpu_memory", lambda model_runner: 10.0)
    mr = SimpleNamespace(attn_backend=SimpleNamespace(verify_cfg=CFG))

    def oom(model_runner, cfg, counters):
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(RuntimeError) as info:
        capture.capture_verify_runner(mr, oom)
    assert str(info.value) == capture.OOM_MESSAGE and "\n" not in capture.OOM_MESSAGE
    assert "--cuda-graph-max-bs-decode" in capture.OOM_MESSAGE
    assert isinstance(info.value.__cause__, RuntimeError)

    def other(model_runner, cfg, counters):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        capture.capture_verify_runner(mr, other)
