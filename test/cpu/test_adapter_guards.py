"""CPU tier: the capture hooks never silently fall back to upstream's runner when the flag is on
for an EAGLE topk=1 target whose attention backend is not the chain backend (e.g. wrapped by
SGLang for a hybrid linear-attention model); they do fall back for every other runner."""

from types import SimpleNamespace

import pytest

from sglang_verify_graph import sglang_adapter as sa
from sglang_verify_graph.config import VerifyGraphConfigError


def _runner(draft=False, eagle=True, topk=1, backend=None):
    return SimpleNamespace(
        is_draft_worker=draft, attn_backend=backend or SimpleNamespace(),
        spec_algorithm=SimpleNamespace(is_eagle=lambda: eagle),
        server_args=SimpleNamespace(speculative_eagle_topk=topk),
    )


@pytest.fixture
def flag_on(monkeypatch):
    monkeypatch.setattr(sa, "_config_for", lambda mr: object())


def test_wrapped_backend_with_flag_on_is_refused(flag_on):
    with pytest.raises(VerifyGraphConfigError, match="remove --enable-verify-cuda-graph"):
        sa.refuse_if_flag_lost(_runner(backend=SimpleNamespace(full_attn_backend=object())))


@pytest.mark.parametrize("kw", [dict(draft=True), dict(eagle=False), dict(topk=4)],
                         ids=["draft", "not-eagle", "topk4"])
def test_other_runners_fall_back_to_upstream(flag_on, kw):
    sa.refuse_if_flag_lost(_runner(**kw))  # no error: upstream's runner is the right one


def test_flag_off_falls_back_to_upstream(monkeypatch):
    monkeypatch.setattr(sa, "_config_for", lambda mr: None)
    sa.refuse_if_flag_lost(_runner())
