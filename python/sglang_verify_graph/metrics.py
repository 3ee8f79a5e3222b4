"""Prometheus metrics of the per-phase profile (``--verify-graph-profile-every N`` with
``--enable-metrics``), exported through SGLang's multiprocess registry (``/metrics``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

PHASE_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 200, 500)


class PrometheusMetrics:
    """``sglang_verify_graph_phase_ms{phase}`` (histogram, ms per cycle; phases draft, verify,
    draft_extend, other and cycle), ``sglang_verify_graph_replays_total`` and
    ``sglang_verify_graph_fallbacks_total{reason}`` (counters). Created in the scheduler
    process, after SGLang set ``PROMETHEUS_MULTIPROC_DIR`` (``--enable-metrics``), so the values
    reach the server's ``/metrics`` through SGLang's ``MultiProcessCollector``."""

    def __init__(self, registry: Any = None):
        from prometheus_client import REGISTRY, Counter as PromCounter, Histogram

        registry = registry if registry is not None else REGISTRY
        self.phase_ms = Histogram(
            "sglang_verify_graph_phase_ms",
            "Device time per EAGLE cycle phase (ms), from CUDA events.",
            labelnames=("phase",), buckets=PHASE_BUCKETS_MS, registry=registry)
        self.replays = PromCounter(
            "sglang_verify_graph_replays",
            "Target verify steps replayed through the verify CUDA graph.", registry=registry)
        self.fallbacks = PromCounter(
            "sglang_verify_graph_fallbacks",
            "Target verify steps that ran eagerly, by reason.", labelnames=("reason",),
            registry=registry)

    def observe(self, phase: str, ms: float) -> None:
        self.phase_ms.labels(phase=phase).observe(ms)

    def count(self, replays: int, fallbacks: Dict[str, int]) -> None:
        if replays:
            self.replays.inc(replays)
        for reason, n in fallbacks.items():
            self.fallbacks.labels(reason=reason).inc(n)


_METRICS: Optional[PrometheusMetrics] = None


def prometheus_metrics() -> Optional[PrometheusMetrics]:
    """This process's metrics (created once; a second registration would raise), or ``None``
    when ``prometheus_client`` is not importable."""
    global _METRICS
    if _METRICS is None:
        try:
            _METRICS = PrometheusMetrics()
        except ImportError:
            return None
    return _METRICS
