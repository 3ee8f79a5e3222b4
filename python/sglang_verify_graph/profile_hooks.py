"""Bodies of the per-phase profile's SGLang hooks (``--verify-graph-profile-every N``), installed
by ``plugin.py`` where ``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0, with or without the flag:
AROUND hooks on ``EAGLEWorkerV2.forward_batch_generation`` (one cycle per decode batch),
``EagleDraftWorker.draft``, ``EAGLEWorkerV2.verify`` and ``EagleDraftWorker._draft_extend_for_decode``
(target names in ``sglang_adapter``); the timing itself is ``profile.PhaseProfiler``.
"""

from __future__ import annotations

import logging
from typing import Callable

from sglang_verify_graph import metrics as metrics_module
from sglang_verify_graph import profile
from sglang_verify_graph.config import read_env
from sglang_verify_graph.counters import get_counters
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.compat.sglang_adapter import resolved
from sglang_verify_graph.hooks import hook

logger = logging.getLogger("sglang_verify_graph")

_PROFILER = None  # this process's PhaseProfiler, made at the first profiled decode cycle


def _batch_arg(args, kwargs):
    return kwargs.get("batch", args[0] if args else None)


def _is_decode_cycle(batch) -> bool:
    """A decode (verify) cycle with requests: not prefill/extend, not mixed, not idle."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None or mode.is_extend() or getattr(batch, "is_extend_in_batch", False):
        return False
    return not mode.is_idle()


def _rank_of(worker) -> int:
    ps = getattr(worker, "ps", None)
    rank = getattr(ps, "tp_rank", None)
    if rank is None:
        rank = getattr(worker, "tp_rank", 0)
    return int(rank or 0)


def profiler_for(worker):
    """The process's PhaseProfiler (made on first use from the worker's settings)."""
    global _PROFILER
    if _PROFILER is None:
        every = read_env().profile_every
        server_args = getattr(worker, "server_args", None)
        metrics = None
        if server_args is not None and getattr(resolved(server_args), "enable_metrics", False):
            metrics = metrics_module.prometheus_metrics()
        _PROFILER = profile.PhaseProfiler(
            max(1, every), rank=_rank_of(worker), event_factory=profile.default_event_factory(),
            counters=get_counters, metrics=metrics)
        logger.info("verify_graph_profile: profiling EAGLE cycles, one line every %d cycles "
                    "(rank %d, metrics=%s)", every, _PROFILER.rank, metrics is not None)
    return _PROFILER


class HostAcceptLens:
    """Reader of a cycle's per-request accept lengths that never synchronizes.

    SGLang copies ``result.accept_lens`` to the host right after the forward returns
    (``GenerationBatchResult.copy_to_cpu``: pinned, non-blocking, then ``copy_done.record()``).
    :meth:`settle` (called by the profiler at the next cycle's start, and by every read) swaps
    the reference to the whole result (logits and all) for that host tensor and its
    ``copy_done`` once the swap happened, so pending cycles keep no device tensors alive.
    Calling it returns ``None`` while the tensor is on the device or ``copy_done.query()`` is
    false, else the list of accept lengths (``()`` when the result has none)."""

    __slots__ = ("_result", "_lens", "_done")

    def __init__(self, result):
        self._result, self._lens, self._done = result, None, None

    def settle(self) -> None:
        result = self._result
        if result is None:
            return
        lens = getattr(result, "accept_lens", None)
        if lens is not None and (getattr(lens, "is_cuda", False)
                                 or not getattr(lens, "is_cpu", True)):
            return  # not copied to the host yet
        self._lens, self._done, self._result = lens, getattr(result, "copy_done", None), None

    def __call__(self):
        self.settle()
        if self._result is not None:
            return None
        if self._lens is None:
            return ()
        if self._done is not None and not self._done.query():
            return None
        return self._lens.tolist()


def host_accept_lens(result) -> HostAcceptLens:
    """The :class:`HostAcceptLens` reader of ``result`` (a ``GenerationBatchResult``)."""
    return HostAcceptLens(result)


@hook("profile", adapter.CYCLE, adapter.HookType.AROUND)
def profile_cycle_hook(original: Callable, worker, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.forward_batch_generation``: one profiled cycle per decode batch."""
    if not _is_decode_cycle(_batch_arg(args, kwargs)):
        return original(worker, *args, **kwargs)
    prof = profiler_for(worker)
    prof.cycle_begin(num_steps=getattr(worker, "speculative_num_steps", None))
    try:
        result = original(worker, *args, **kwargs)
    except BaseException:
        prof.cycle_abort()
        raise
    prof.cycle_end(host_accept_lens(result))
    return result


def _phase_hook(phase: str, target: str) -> Callable:
    def phase_hook(original: Callable, *args, **kwargs):
        prof = _PROFILER
        if prof is None or not prof.in_cycle:
            return original(*args, **kwargs)
        prof.begin(phase)
        try:
            return original(*args, **kwargs)
        finally:
            prof.end(phase)

    phase_hook.__name__ = phase_hook.__qualname__ = f"profile_{phase}_hook"
    return hook("profile", target, adapter.HookType.AROUND)(phase_hook)


profile_draft_hook = _phase_hook("draft", adapter.DRAFT)
profile_verify_hook = _phase_hook("verify", adapter.VERIFY)
profile_draft_extend_hook = _phase_hook("draft_extend", adapter.DRAFT_EXTEND)
