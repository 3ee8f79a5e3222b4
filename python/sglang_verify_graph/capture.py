"""Which decode-graph runner the target gets, and its capture (time, GPU memory, OOM message).

Policy for the hooks of ``plugin.py``: :func:`verify_runner_kind` says whether this model runner
gets ``VerifyCudaGraphRunner`` (and with which verify attention), :func:`refuse_if_flag_lost`
stops a start that would silently serve upstream's runner with the flag on, and
:func:`capture_verify_runner` builds our runner and fills the capture counters.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.backends import NATIVE_BACKEND_CLASSES
from sglang_verify_graph.chain_backend import ChainDraftExtendTritonBackend, ChainVerifyTritonBackend
from sglang_verify_graph.config import VerifyGraphConfig, build_config
from sglang_verify_graph.counters import (
    VerifyCounters,
    eager_cliff_warning,
    get_counters,
    install_counters,
    note_draft_extend_attention,
)
from sglang_verify_graph.errors import VerifyGraphConfigError
from sglang_verify_graph.runner import VerifyCudaGraphRunner
from sglang_verify_graph.debug.selftest import NO_DRAFT_EXTEND_PROBE, DraftExtendSelfTest

logger = logging.getLogger("sglang_verify_graph")

OOM_MESSAGE = (
    "--enable-verify-cuda-graph: capturing the verify graphs ran out of GPU memory. "
    "Fix: lower --cuda-graph-max-bs-decode (fewer/smaller buckets) or --mem-fraction-static.")
"""The one line a capture that runs out of GPU memory raises (as ``RuntimeError``)."""


def config_for(model_runner) -> Optional[VerifyGraphConfig]:
    """The validated config of this model runner's server args (``None`` when the flag is off).
    Raises VerifyGraphConfigError on a conflicting setting."""
    return build_config(adapter.resolved(model_runner.server_args))


def _holds(owner, attr: str, cls) -> bool:
    return isinstance(getattr(owner, attr, None), cls)


def uses_chain_backend(model_runner) -> bool:
    """Whether the model runner's attention backend is ``ChainVerifyTritonBackend``."""
    return _holds(model_runner, "attn_backend", ChainVerifyTritonBackend)


def count_eager_draft_extend(model_runner) -> None:
    """Counts one ``DRAFT_EXTEND_V2`` forward that runs eagerly (not through the draft-extend
    graph, whose replays go through :func:`execute_draft_extend`) on a draft model runner whose
    attention backend is ``ChainDraftExtendTritonBackend``; nothing for any other runner, or
    when no counters are installed."""
    counters = get_counters()
    if counters is not None and _holds(model_runner, "attn_backend", ChainDraftExtendTritonBackend):
        counters.count_draft_extend_eager()


def execute_draft_extend(execute: Callable, runner, forward_batch, *args, **kwargs):
    """``execute(runner, forward_batch, *args, **kwargs)``: one replay of the draft-extend graph
    runner ``runner`` (``EAGLEDraftExtendCudaGraphRunner.execute``, unbound), returning what it
    returns. When ``runner``'s backend is ``ChainDraftExtendTritonBackend`` and counters are
    installed, the replay is counted (``raw_bs`` padded to ``bs``) and passed to the runner's
    probe (:func:`draft_extend_probe`); ``select_index`` (the second argument from SGLang 0.5.20
    on: the selected row of each request) goes to the probe with the output."""
    counters = get_counters()
    if counters is None or not _holds(runner, "draft_extend_attn_backend", ChainDraftExtendTritonBackend):
        return execute(runner, forward_batch, *args, **kwargs)
    probe = draft_extend_probe(runner)
    probe.before_execute(runner, forward_batch)
    out = execute(runner, forward_batch, *args, **kwargs)
    counters.count_draft_extend_replay(runner.bs, runner.raw_bs)
    probe.after_execute(runner, forward_batch, out, adapter.draft_extend_select_index(args, kwargs))
    return out


def draft_extend_backend_for(draft_runner, backend):
    """The draft-extend backend the draft gets: ``ChainDraftExtendTritonBackend`` in place of a
    backend that is exactly SGLang's ``TritonAttnBackend`` when the flag is on with
    ``SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=chain`` (the default); else ``backend`` itself. Raises
    VerifyGraphConfigError when the draft's KV setup is one the chain kernel does not serve."""
    if type(backend) is not adapter.triton_attn_backend_cls():
        return backend
    cfg = config_for(draft_runner)
    if cfg is None or cfg.draft_extend_attention != "chain":
        return backend
    ours = ChainDraftExtendTritonBackend(draft_runner, cfg)
    for name in ("prefill_attention_backend_str", "decode_attention_backend_str"):  # 0.5.23 stamps
        if hasattr(backend, name):
            setattr(ours, name, getattr(backend, name))
    note_draft_extend_attention(f"chain split-KV ({'MLA' if ours.use_mla else 'MHA'})")
    return ours


def draft_extend_probe(draft_extend_runner):
    """The probe of a draft-extend graph runner served by the chain kernel: the self-test
    (``DraftExtendSelfTest``) when ``SGLANG_VERIFY_GRAPH_SELFTEST`` is on, else one that does
    nothing. Made once per runner."""
    probe = getattr(draft_extend_runner, "_verify_graph_probe", None)
    if probe is None:
        backend = draft_extend_runner.draft_extend_attn_backend
        counters = get_counters()
        probe = (DraftExtendSelfTest(draft_extend_runner, counters.selftest)
                 if backend.verify_cfg.selftest and counters is not None else NO_DRAFT_EXTEND_PROBE)
        draft_extend_runner._verify_graph_probe = probe
    return probe


def verify_runner_kind(model_runner) -> Optional[str]:
    """``"chain"`` when the target's backend is ``ChainVerifyTritonBackend``; ``"native"`` when
    the flag's config chose a native backend (``backends.py``) and the target's backend object is
    that backend's SGLang class; else ``None`` (upstream's runner, or a refusal)."""
    if uses_chain_backend(model_runner):
        return "chain"
    if model_runner is None or not adapter.is_eagle_topk1_target(model_runner):
        return None
    cfg = config_for(model_runner)
    if cfg is None or cfg.verify_attention != "native":
        return None
    name = type(getattr(model_runner, "attn_backend", None)).__name__
    return "native" if name in NATIVE_BACKEND_CLASSES.get(cfg.attention_backend, ()) else None


def refuse_if_flag_lost(model_runner) -> None:
    """Raise instead of silently capturing upstream's runner when the flag is on for this EAGLE
    topk=1 target but its attention backend is not (or no longer) one the verify graph serves
    (the chain backend, or the configured native backend's own class), e.g. SGLang wrapped it for
    a hybrid linear-attention / sparse model. Raises VerifyGraphConfigError."""
    if model_runner is None or not adapter.is_eagle_topk1_target(model_runner):
        return
    cfg = config_for(model_runner)
    if cfg is None:
        return
    backend = cfg.attention_backend
    expected = (("ChainVerifyTritonBackend",) if cfg.verify_attention == "chain"
                else NATIVE_BACKEND_CLASSES.get(backend, ()))
    raise VerifyGraphConfigError(
        problem=f"with --attention-backend {backend} the verify graph serves "
                f"{' / '.join(expected)}, but this model got another attention backend "
                "(an attention wrapper, e.g. hybrid linear or sparse attention, or for "
                "flashinfer/flashmla a target without MLA)",
        flag="attention backend", value=type(getattr(model_runner, "attn_backend", None)).__name__,
        fix="pass --attention-backend triton, or remove --enable-verify-cuda-graph for this model")


def capture_verify_runner(model_runner, build: Callable = VerifyCudaGraphRunner):
    """Capture our runner with ``build(model_runner, cfg, counters)``, fill the capture counters
    (seconds, GiB of GPU memory) and log one line.

    Returns:
        ``(runner, graph_mem_gib)``: what ``build`` returned and the drop of free GPU memory
        across the capture, GiB.

    Raises:
        RuntimeError: :data:`OOM_MESSAGE` when the capture runs out of GPU memory (the original
            error chained); other errors propagate unchanged.
    """
    cfg = getattr(model_runner.attn_backend, "verify_cfg", None) or config_for(model_runner)
    counters = install_counters(VerifyCounters(log_every=cfg.log_every))
    before = adapter.available_gpu_memory(model_runner)
    try:
        runner = build(model_runner, cfg, counters)
    except Exception as e:
        if "out of memory" in str(e).lower():
            raise RuntimeError(OOM_MESSAGE) from e
        raise
    after = adapter.available_gpu_memory(model_runner)
    counters.graph_mem_gib = before - after
    logger.info(
        "VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=%s, num_draft_tokens=%d "
        "tokens/request, attention=%s, %.2f s, %.3f GiB",
        counters.capture_bs, counters.num_draft_tokens, counters.attention,
        counters.capture_seconds, counters.graph_mem_gib)
    cliff = eager_cliff_warning(getattr(model_runner, "max_running_requests", None),
                                counters.capture_bs)
    if cliff:
        logger.warning("%s", cliff)
    return runner, before - after


class VerifyCudaGraphRunnerFromModelRunner(VerifyCudaGraphRunner):
    """``VerifyCudaGraphRunner`` built as SGLang 0.5.17 and later build a decode-graph runner,
    ``cls(model_runner)``: config and counters come from the chain backend (or the flag's config),
    capture is timed and its GPU memory counted by :func:`capture_verify_runner`. Raises
    RuntimeError on keyword arguments (a constructor call this class was not written for)."""

    def __init__(self, model_runner, **kwargs):
        if kwargs:
            raise RuntimeError(f"VerifyCudaGraphRunner: unexpected arguments {sorted(kwargs)}")
        capture_verify_runner(model_runner, self._build)

    def _build(self, model_runner, cfg, counters):
        VerifyCudaGraphRunner.__init__(self, model_runner, cfg, counters)
        return self
