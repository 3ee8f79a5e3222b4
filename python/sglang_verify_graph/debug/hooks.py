"""The host-sync check's hooks (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``, tests only; group
``sync_check`` of the hook table): the verify-step wrapper, the internal-state report and, where
``sgl_kernel`` is installed (not on a CPU-only machine), the renorm-kernel counters."""

from __future__ import annotations

from typing import Callable

from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.debug.sync_check import get_sync_check, peek_sync_check
from sglang_verify_graph.hooks import hook

_RENORM = adapter.sgl_kernel_installed()


@hook("sync_check", adapter.VERIFY, adapter.HookType.AROUND)
def sync_check_hook(original: Callable, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.verify``: count synchronizing CUDA calls inside the verify step
    (``debug.sync_check``)."""
    return get_sync_check().run(original, *args, **kwargs)


@hook("sync_check", adapter.TOP_P_RENORM if _RENORM else None, adapter.HookType.AROUND)
def top_p_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND ``sgl_kernel.top_p_renorm_prob``: count the call in a verify step."""
    get_sync_check().note("top_p_renorm_prob")
    return original(*args, **kwargs)


@hook("sync_check", adapter.TOP_K_RENORM if _RENORM else None, adapter.HookType.AROUND)
def top_k_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND ``sgl_kernel.top_k_renorm_prob``: count the call in a verify step."""
    get_sync_check().note("top_k_renorm_prob")
    return original(*args, **kwargs)


@hook("sync_check", adapter.GET_INTERNAL_STATE, adapter.HookType.AFTER)
def sync_check_state_hook(result, *args, **kwargs):
    """AFTER ``Scheduler.get_internal_state``: add the sync check's snapshot to the returned
    ``internal_state`` dict as ``verify_sync_check`` (what ``/get_server_info`` serves)."""
    state = getattr(result, "internal_state", result)
    check = peek_sync_check()
    if isinstance(state, dict) and check is not None:
        state["verify_sync_check"] = check.snapshot()
    return result
