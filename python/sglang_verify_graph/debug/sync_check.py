"""Host-sync check of the EAGLE verify step (tests only; ``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``).

Wraps ``EAGLEWorkerV2.verify`` (target verify forward + greedy/sampled acceptance + KV
bookkeeping, SGLang 0.5.16 ``speculative/eagle_worker_v2.py``) with PyTorch's CUDA sync debug
mode set to ``"warn"`` (``torch.cuda.set_sync_debug_mode``): every synchronizing CUDA call that
PyTorch makes inside the step (``.item()``, ``.tolist()``, blocking device-to-host copies,
``torch.cuda.synchronize()``, ``nonzero`` and other data-dependent shapes) raises a warning,
which this module counts. The claim it checks (``docs/design.md``, "Host syncs on the verify
path"): with the overlap scheduler and a backend that needs no CPU sequence lengths (triton), the
topk=1 verify step has no blocking host sync between the verify forward and acceptance.

It also counts calls of named kernels made inside the step (:meth:`SyncCheck.note`): the plugin
wraps sgl_kernel's ``top_p_renorm_prob`` / ``top_k_renorm_prob``, which SGLang's sampled verify
(``speculative/eagle_utils.py``) calls only when a request in the batch needs them, so a test can
show that top_p = 1 runs no top-p renormalisation (sglang#6949).

Limits: the debug mode and ``warnings.catch_warnings`` are process-wide, so a synchronizing call
of another thread of the scheduler process during the step would be counted too; calls made by
extension kernels outside PyTorch's API (e.g. a raw ``cudaStreamSynchronize`` in C++) are not
seen. Never enable it when measuring speed.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional


SYNC_WARNING = "called a synchronizing cuda operation"
"""What PyTorch's warning for a synchronizing call says (``c10/cuda/CUDAFunctions.cpp``,
``warn_or_error_on_sync``), lower-cased. Setting the mode also warns once that "Synchronization
debug mode is a prototype feature ...": that notice is not a sync (torch 2.11)."""


def is_sync_warning(message: str) -> bool:
    """True for PyTorch's synchronizing-call warning, False for anything else (its prototype
    notice included)."""
    return SYNC_WARNING in message.lower()


class SyncCheck:
    """Counts synchronizing CUDA calls made during wrapped calls.

    Attributes:
        calls: wrapped calls made (verify steps).
        syncs: synchronizing CUDA calls seen inside them (0 is the expected value).
        first: the first warning text seen (``None`` while ``syncs == 0``).
        kernel_calls: ``{name: calls}`` of the kernels :meth:`note` was told about, counted
            only inside wrapped calls.
    """

    def __init__(self):
        self.calls = 0
        self.syncs = 0
        self.first: Optional[str] = None
        self.kernel_calls: dict = {}
        self._inside = 0
        self._lock = threading.Lock()

    def note(self, name: str) -> None:
        """Count one call of kernel ``name`` if it happens inside a wrapped call."""
        with self._lock:
            if self._inside:
                self.kernel_calls[name] = self.kernel_calls.get(name, 0) + 1

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """``fn(*args, **kwargs)`` with the CUDA sync debug mode on ``"warn"``; returns its result
        (and re-raises its errors) after restoring the previous mode."""
        import torch

        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            with self._lock:
                self._inside += 1
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(previous)
                with self._lock:
                    self._inside -= 1
                hits = [str(w.message) for w in caught if is_sync_warning(str(w.message))]
                with self._lock:
                    self.calls += 1
                    self.syncs += len(hits)
                    if hits and self.first is None:
                        self.first = hits[0][:300]

    def snapshot(self) -> dict:
        """``{"calls": int, "syncs": int, "first": str | None, "kernel_calls": {name: int}}``."""
        with self._lock:
            return {"calls": self.calls, "syncs": self.syncs, "first": self.first,
                    "kernel_calls": dict(self.kernel_calls)}


_CHECK: Optional[SyncCheck] = None


def get_sync_check() -> SyncCheck:
    """This process's :class:`SyncCheck` (made on first use)."""
    global _CHECK
    if _CHECK is None:
        _CHECK = SyncCheck()
    return _CHECK


def peek_sync_check() -> Optional[SyncCheck]:
    """This process's :class:`SyncCheck`, or ``None`` when none was made."""
    return _CHECK
