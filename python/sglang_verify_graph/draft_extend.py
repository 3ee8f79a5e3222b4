"""The draft's ``DRAFT_EXTEND_V2`` policy: which draft-extend attention the draft gets, and how
its graph replays and eager forwards are counted and probed.

With the flag on and ``SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=chain`` (the default), a draft whose
draft-extend backend is exactly SGLang's ``TritonAttnBackend`` gets ``ChainDraftExtendTritonBackend``
(the chain kernel with ``seq_lens`` = prefix + ``num_draft_tokens``); SGLang's draft-extend graph
runner (``EAGLEDraftExtendCudaGraphRunner``) captures and replays it unchanged.
"""

from __future__ import annotations

from typing import Callable

from sglang_verify_graph.chain_backend import ChainDraftExtendTritonBackend
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.counters import get_counters, note_draft_extend_attention
from sglang_verify_graph.debug import make_draft_extend_probe
from sglang_verify_graph.plan import flag_config


def _holds_chain(owner, attr: str) -> bool:
    return isinstance(getattr(owner, attr, None), ChainDraftExtendTritonBackend)


def draft_extend_backend_for(draft_runner, backend):
    """The draft-extend backend the draft gets: ``ChainDraftExtendTritonBackend`` in place of a
    backend that is exactly SGLang's ``TritonAttnBackend`` when the flag is on with
    ``SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=chain`` (the default); else ``backend`` itself. Raises
    VerifyGraphConfigError when the draft's KV setup is one the chain kernel does not serve."""
    if type(backend) is not adapter.triton_attn_backend_cls():
        return backend
    cfg = flag_config(draft_runner)
    if cfg is None or cfg.draft_extend_attention != "chain":
        return backend
    ours = ChainDraftExtendTritonBackend(draft_runner, cfg)
    for name in ("prefill_attention_backend_str", "decode_attention_backend_str"):  # 0.5.23 stamps
        if hasattr(backend, name):
            setattr(ours, name, getattr(backend, name))
    note_draft_extend_attention(f"chain split-KV ({'MLA' if ours.use_mla else 'MHA'})")
    return ours


def count_eager_draft_extend(model_runner) -> None:
    """Counts one ``DRAFT_EXTEND_V2`` forward that runs eagerly (not through the draft-extend
    graph, whose replays go through :func:`execute_draft_extend`) on a draft model runner whose
    attention backend is ``ChainDraftExtendTritonBackend``; nothing for any other runner, or
    when no counters are installed."""
    counters = get_counters()
    if counters is not None and _holds_chain(model_runner, "attn_backend"):
        counters.count_draft_extend_eager()


def draft_extend_probe(draft_extend_runner):
    """The probe of a draft-extend graph runner served by the chain kernel
    (``debug.make_draft_extend_probe``: the self-test when ``SGLANG_VERIFY_GRAPH_SELFTEST`` is on,
    else one that does nothing). Made once per runner."""
    probe = getattr(draft_extend_runner, "_verify_graph_probe", None)
    if probe is None:
        backend = draft_extend_runner.draft_extend_attn_backend
        probe = make_draft_extend_probe(draft_extend_runner, backend.verify_cfg, get_counters())
        draft_extend_runner._verify_graph_probe = probe
    return probe


def execute_draft_extend(execute: Callable, runner, forward_batch, *args, **kwargs):
    """``execute(runner, forward_batch, *args, **kwargs)``: one replay of the draft-extend graph
    runner ``runner`` (``EAGLEDraftExtendCudaGraphRunner.execute``, unbound), returning what it
    returns. When ``runner``'s backend is ``ChainDraftExtendTritonBackend`` and counters are
    installed, the replay is counted (``raw_bs`` padded to ``bs``) and passed to the runner's
    probe (:func:`draft_extend_probe`); ``select_index`` (the second argument from SGLang 0.5.20
    on: the selected row of each request) goes to the probe with the output."""
    counters = get_counters()
    if counters is None or not _holds_chain(runner, "draft_extend_attn_backend"):
        return execute(runner, forward_batch, *args, **kwargs)
    probe = draft_extend_probe(runner)
    probe.before_execute(runner, forward_batch)
    out = execute(runner, forward_batch, *args, **kwargs)
    counters.count_draft_extend_replay(runner.bs, runner.raw_bs)
    probe.after_execute(runner, forward_batch, out, adapter.draft_extend_select_index(args, kwargs))
    return out
