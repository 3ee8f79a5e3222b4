"""Verify-step counters of one scheduler process (one TP rank): graph replays and eager
fallbacks by reason, read by ``/get_server_info`` (``internal_states[i]["verify_cuda_graph"]``)
and logged. Host-side integers only: counting never touches the GPU or synchronizes.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

logger = logging.getLogger("sglang_verify_graph")

# Fallback reasons (the first refusing condition of DecodeCudaGraphRunner.can_run_graph, 0.5.16).
REASON_BS_ABOVE_MAX = "batch_size_above_max_captured"
REASON_BS_NOT_CAPTURED = "batch_size_not_captured_without_padding"
REASON_REPLACE_EMBEDS = "replace_embeds"
REASON_WIDTH = "tokens_per_request_mismatch"
REASON_DP_SYNC = "dp_attention_batch_not_graphable"
REASON_HIDDEN_MODE = "capture_hidden_mode_mismatch"
REASON_TBO = "two_batch_overlap_split_impossible"
REASON_OTHER = "not_graphable_other"


@dataclass
class VerifyCounters:
    """Counts TARGET_VERIFY forwards of the target model in this process.

    Two independent counts of the same verify steps:

    * ``verify_steps`` / ``verify_requests``: SGLang's speculative worker entering its verify
      (``EAGLEWorkerV2.verify``, ``plugin.verify_step_hook``), with the batch's requests; counted
      before, and whatever, the model runner does.
    * ``replays`` / ``replayed_requests`` (our graph, ``raw_bs`` summed) and ``fallbacks`` /
      ``eager_requests`` (a TARGET_VERIFY forward of the target that did not replay our graph,
      counted in ``ModelRunner._forward_raw`` under its reason).

    When every verify step is seen where it runs, ``replays + fallback_total == verify_steps`` and
    ``replayed_requests + eager_requests == verify_requests``; a verify that bypassed both the
    graph and ``_forward_raw`` breaks the equality. SGLang's per-request ``spec_verify_ct``
    counts the verify steps whose result it committed (not those a finished request rode along
    in under the overlap scheduler). ``capture_*`` describe the captured graphs (batch-size
    buckets, tokens per request, seconds, GiB of GPU memory).

    ``draft_extend_*`` count the draft's ``DRAFT_EXTEND_V2`` forwards served by the chain kernel
    (``draft_extend_attention`` non-empty): replays of SGLang's draft-extend graph
    (``EAGLEDraftExtendCudaGraphRunner.execute``), their padded rows, and eager forwards
    (``ModelRunner._forward_raw`` of the draft). Each verify step is followed by one draft extend,
    so ``draft_extend_replays + draft_extend_eager`` equals ``verify_steps`` when every verify
    step is counted (``test_server_e2e`` asserts it).
    """

    runner: str = "VerifyCudaGraphRunner"
    capture_bs: list = field(default_factory=list)
    num_draft_tokens: int = 0
    capture_seconds: float = 0.0
    graph_mem_gib: float = 0.0
    attention: str = ""
    replays: int = 0
    replayed_requests: int = 0
    padded_rows: int = 0
    verify_steps: int = 0
    verify_requests: int = 0
    eager_requests: int = 0
    fallbacks: Counter = field(default_factory=Counter)
    log_every: int = 0
    selftest: dict = field(default_factory=dict)
    draft_extend_attention: str = ""
    draft_extend_replays: int = 0
    draft_extend_padded_rows: int = 0
    draft_extend_eager: int = 0
    _last_reason: Optional[str] = None
    _last_detail: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def fallback_total(self) -> int:
        return sum(self.fallbacks.values())

    def note_refusal(self, reason: str, detail: str = "") -> None:
        """Record why the runner refused a batch (called from can_run_graph; may repeat per step)."""
        self._last_reason = reason
        self._last_detail = detail

    def count_verify_step(self, num_requests: int) -> None:
        """SGLang's worker starts one verify step over ``num_requests`` requests."""
        with self._lock:
            self.verify_steps += 1
            self.verify_requests += num_requests
        self._maybe_log()

    def count_replay(self, bs: int, raw_bs: int) -> None:
        """One replay of our graph over ``raw_bs`` requests padded to the bucket ``bs``."""
        with self._lock:
            self.replays += 1
            self.replayed_requests += raw_bs
            self.padded_rows += bs - raw_bs

    def count_eager_verify(self, num_requests: int) -> None:
        """One TARGET_VERIFY forward over ``num_requests`` requests did not replay our graph
        (``plugin.forward_raw_hook``); counts it under the reason ``can_run_graph`` recorded last
        (``REASON_OTHER`` when none) and logs it (WARNING the first time per reason and every
        1000th)."""
        reason = self._last_reason or REASON_OTHER
        with self._lock:
            self.fallbacks[reason] += 1
            self.eager_requests += num_requests
            n = self.fallbacks[reason]
        if n == 1 or n % 1000 == 0:
            logger.warning(
                "verify CUDA graph fallback #%d (%s%s): this verify step ran eagerly",
                n, reason, f": {self._last_detail}" if self._last_detail else "",
            )
        self._last_reason = None
        self._last_detail = ""  # else the next fallback's warning would name this refusal's detail

    def count_draft_extend_replay(self, bs: int, raw_bs: int) -> None:
        """One replay of the draft-extend graph over ``raw_bs`` requests padded to ``bs``."""
        with self._lock:
            self.draft_extend_replays += 1
            self.draft_extend_padded_rows += bs - raw_bs

    def count_draft_extend_eager(self) -> None:
        """One eager ``DRAFT_EXTEND_V2`` forward of the draft (WARNING the first time and every
        1000th: each costs more than a replay)."""
        with self._lock:
            self.draft_extend_eager += 1
            n = self.draft_extend_eager
        if n == 1 or n % 1000 == 0:
            logger.warning("draft-extend CUDA graph fallback #%d: this draft extend ran eagerly", n)

    def _maybe_log(self) -> None:
        if self.log_every and self.verify_steps % self.log_every == 0:
            logger.info("verify CUDA graph counters: %s", self.snapshot())

    def snapshot(self) -> dict:
        """JSON-ready view (what /get_server_info returns)."""
        return {
            "runner": self.runner,
            "attention": self.attention,
            "capture_bs": list(self.capture_bs),
            "num_draft_tokens": self.num_draft_tokens,
            "capture_seconds": round(self.capture_seconds, 3),
            "graph_mem_gib": round(self.graph_mem_gib, 4),
            "replays": self.replays,
            "replayed_requests": self.replayed_requests,
            "padded_rows": self.padded_rows,
            "verify_steps": self.verify_steps,
            "verify_requests": self.verify_requests,
            "eager_requests": self.eager_requests,
            "fallbacks": {str(k): int(v) for k, v in self.fallbacks.items()},
            "fallback_total": self.fallback_total,
            **({"selftest": dict(self.selftest)} if self.selftest else {}),
            **({"draft_extend": {
                "attention": self.draft_extend_attention, "replays": self.draft_extend_replays,
                "padded_rows": self.draft_extend_padded_rows, "eager": self.draft_extend_eager,
            }} if self.draft_extend_attention else {}),
        }


_COUNTERS: Optional[VerifyCounters] = None
_DRAFT_EXTEND_ATTENTION = ""


def get_counters() -> Optional[VerifyCounters]:
    """This process's counters, or None when no verify runner was installed here."""
    return _COUNTERS


def install_counters(counters: VerifyCounters) -> VerifyCounters:
    """Make ``counters`` this process's; they carry the draft-extend attention noted before
    (SGLang builds the draft's backends before the target's graphs are captured)."""
    global _COUNTERS
    counters.draft_extend_attention = counters.draft_extend_attention or _DRAFT_EXTEND_ATTENTION
    _COUNTERS = counters
    return counters


def note_draft_extend_attention(description: str) -> None:
    """Record that the draft's DRAFT_EXTEND_V2 runs the chain kernel (``description``, e.g.
    ``"chain split-KV (MHA)"``), in the current counters and in any installed later."""
    global _DRAFT_EXTEND_ATTENTION
    _DRAFT_EXTEND_ATTENTION = description
    if _COUNTERS is not None:
        _COUNTERS.draft_extend_attention = description


def eager_cliff_warning(max_running_requests, capture_bs) -> "str | None":
    """The start-up warning when batches can exceed the largest captured bucket.

    Args:
        max_running_requests: the model runner's max concurrent requests (int) or ``None``.
        capture_bs: the captured batch sizes (requests).

    Returns:
        ``None`` when every batch up to ``max_running_requests`` replays a graph, else one line
        naming the eager range, the fallback reason it will be counted under and the flag that
        closes it (an eager verify costs several graphed ones).
    """
    if not capture_bs or not max_running_requests:
        return None
    top = max(capture_bs)
    if max_running_requests <= top:
        return None
    return (f"--enable-verify-cuda-graph: verify batches of {top + 1}..{max_running_requests} "
            f"requests will run eagerly (largest captured bucket {top}; counted as "
            f"{REASON_BS_ABOVE_MAX}). To graph them: --cuda-graph-max-bs-decode "
            f"{max_running_requests}, or --max-running-requests {top}.")
