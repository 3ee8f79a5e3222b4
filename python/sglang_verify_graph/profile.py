"""Per-phase profile of EAGLE decode cycles (``--verify-graph-profile-every N``).

One speculative cycle (``EAGLEWorkerV2.forward_batch_generation``, decode branch) is split into
phases: ``draft`` (the draft chain), ``verify`` (target verify), ``draft_extend`` (draft-extend of
the accepted tokens) and ``other`` (the rest of the cycle: cycle time minus the three phases).
For each phase and for the whole cycle the profiler records a pair of CUDA events on the
*current* stream (device time) and ``time.perf_counter()`` (host time, i.e. launch cost).

Events are never waited for: a finished cycle is kept pending and drained at later cycles with
``event.query()`` (non-blocking), in order; nothing here calls ``synchronize()``. The tokens of a
cycle come from a reader the caller passes to :meth:`PhaseProfiler.cycle_end`, called at drain
time; it returns ``None`` while the host copy is not complete (the adapter reads the per-request
``accept_lens`` SGLang copies to the host for its own output processing).

Every ``every`` drained cycles one line per rank is logged, in the advisor's format
(:mod:`sglang_verify_graph.advisor.inputs`)::

    verify_graph_profile rank=0 cycles=200 tokens=1544 bs=4 num_steps=3 cycle_ms=9.10 \\
        draft_ms=1.20 verify_ms=6.30 draft_extend_ms=0.90 other_ms=0.70 draft_pct=13.2 \\
        verify_pct=69.2 draft_extend_pct=9.9 other_pct=7.7 host_draft_ms=0.35 ... \\
        accept_length=1.93 accepted_drafts=0.93 tok_s=848.1 replay_pct=100.0 fallbacks=none

``*_ms``: medians over the window's cycles (device time); ``*_pct``: share of the mean cycle
time (means, so the four add up to 100 unless ``other`` had to be clamped at 0);
``host_*_ms``: medians of host time; ``accept_length``: SGLang's metric (tokens emitted per
request per cycle, bonus token included) = tokens / request-cycles; ``accepted_drafts`` =
``accept_length - 1``; ``tok_s``: tokens / device time from the first cycle's start to the last
cycle's end (gaps between cycles included); ``replay_pct`` and ``fallbacks``: verify-graph
counters over the window (``na`` when the verify graph is not installed in this process);
``prof_self_ms``: mean host ms per cycle spent inside this profiler's own methods (event
records, clock reads, draining, folding, the log line; the hook wrappers around them are not
included) and ``prof_self_pct`` its share of ``cycle_mean_ms``: the profile's host overhead,
measured in the run it profiles (an upper bound of its cost when the loop is host-bound; hidden
behind the GPU when it is not).

No ``sglang.srt`` imports; torch is imported only by the default event factory.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

logger = logging.getLogger("sglang_verify_graph")

PHASES = ("draft", "verify", "draft_extend")
"""Timed phases of a cycle; ``other`` is the cycle minus these."""

ALL_PHASES = PHASES + ("other",)

MAX_PENDING = 256
"""Finished cycles kept waiting for their events; beyond this the oldest is dropped (counted)."""

TOKEN_WAIT_DRAINS = 8
"""Drain calls a cycle whose events completed may wait for its tokens before it is counted
without them (e.g. a path that never copies ``accept_lens`` to the host)."""


def cuda_event_factory():
    """A ``torch.cuda.Event(enable_timing=True)`` (the default event factory)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


_EVENT_FACTORY: Optional[Callable] = None


def default_event_factory() -> Callable:
    """The event factory new profilers get: :func:`cuda_event_factory` unless a test set
    another with :func:`set_event_factory`."""
    return _EVENT_FACTORY or cuda_event_factory


def set_event_factory(factory: Optional[Callable]) -> None:
    """Make ``factory`` the default event factory (``None``: CUDA events again)."""
    global _EVENT_FACTORY
    _EVENT_FACTORY = factory


class _Cycle:
    __slots__ = ("begin", "end", "phase_events", "host_t0", "host_ms", "host_phase",
                 "tokens_reader", "num_steps", "waited", "_open")

    def __init__(self, begin_event, host_t0: float, num_steps: Optional[int]):
        self.begin = begin_event
        self.end = None
        self.phase_events: Dict[str, List[tuple]] = {}
        self.host_t0 = host_t0
        self.host_ms = 0.0
        self.host_phase: Dict[str, float] = {}
        self.tokens_reader: Any = None
        self.num_steps = num_steps
        self.waited = 0
        self._open: Dict[str, tuple] = {}

    def events(self):
        yield self.begin
        for pairs in self.phase_events.values():
            for a, b in pairs:
                yield a
                yield b
        if self.end is not None:
            yield self.end


class PhaseProfiler:
    """Times the phases of EAGLE cycles with events read back later (never synchronizing).

    Args:
        every: complete cycles per log line (> 0).
        rank: the rank named in the log line.
        event_factory: zero-argument callable returning an event with ``record()``,
            ``query()`` and ``elapsed_time(other)`` (ms); default :func:`cuda_event_factory`.
        clock: host clock in seconds (default ``time.perf_counter``).
        counters: zero-argument callable returning the verify-graph counters
            (:class:`~sglang_verify_graph.counters.VerifyCounters`) or ``None``.
        metrics: optional :class:`PrometheusMetrics` (or any object with ``observe(phase, ms)``
            and ``count(replays_delta, fallback_deltas)``).
        log: callable ``log(line)``; default logs at INFO on the package logger.
    """

    def __init__(self, every: int, rank: int = 0, event_factory: Optional[Callable] = None,
                 clock: Callable[[], float] = time.perf_counter,
                 counters: Optional[Callable[[], Any]] = None, metrics: Any = None,
                 log: Optional[Callable[[str], None]] = None):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}")
        self.every = every
        self.rank = rank
        self.event_factory = event_factory or cuda_event_factory
        self.clock = clock
        self.counters = counters
        self.metrics = metrics
        self.log = log or (lambda line: logger.info("%s", line))
        self.pending: Deque[_Cycle] = deque()
        self.dropped = 0
        self.lines: List[str] = []  # the last few lines (tests, /get_server_info)
        self._cur: Optional[_Cycle] = None
        self._window: List[dict] = []
        self._last_counts = None  # Prometheus counters start from the counters' zero
        self._window_counts = self._read_counts()
        self._self_s = 0.0  # host seconds inside this profiler since the last line
        self._ended = 0  # cycles ended since the last line

    # ---- recording (decode loop; never blocks) ------------------------------------------
    @property
    def in_cycle(self) -> bool:
        return self._cur is not None

    def _record(self):
        event = self.event_factory()
        event.record()
        return event

    def cycle_begin(self, num_steps: Optional[int] = None) -> None:
        """Start a cycle (an unfinished previous one is discarded). Lets the readers of pending
        cycles ``settle()`` (drop references they no longer need)."""
        t_in = self.clock()
        for cycle in self.pending:
            settle = getattr(cycle.tokens_reader, "settle", None)
            if settle is not None:
                try:
                    settle()
                except Exception:
                    cycle.tokens_reader = None
        self._cur = _Cycle(self._record(), t_in, num_steps)
        self._self_s += self.clock() - t_in

    def begin(self, phase: str) -> None:
        """Start ``phase`` of the current cycle (no-op outside a cycle)."""
        cycle = self._cur
        if cycle is None:
            return
        t_in = self.clock()
        cycle._open[phase] = (self._record(), t_in)
        self._self_s += self.clock() - t_in

    def end(self, phase: str) -> None:
        """End ``phase`` (no-op outside a cycle or without a matching :meth:`begin`)."""
        cycle = self._cur
        if cycle is None or phase not in cycle._open:
            return
        t_in = self.clock()
        start, t0 = cycle._open.pop(phase)
        stop = self._record()
        cycle.phase_events.setdefault(phase, []).append((start, stop))
        cycle.host_phase[phase] = cycle.host_phase.get(phase, 0.0) + (t_in - t0) * 1e3
        self._self_s += self.clock() - t_in

    def cycle_abort(self) -> None:
        """Forget the current cycle (its forward raised)."""
        self._cur = None

    def cycle_end(self, accept_lengths: Any = None) -> None:
        """End the current cycle, queue it and drain completed cycles.

        Args:
            accept_lengths: per-request accept lengths of the cycle (tokens emitted per
                request, bonus included): a sequence of ints, or a zero-argument callable
                returning one, or ``None`` while not yet available on the host (called at
                drain time, after the cycle's events completed). ``None``: unknown.
        """
        cycle = self._cur
        if cycle is None:
            return
        self._cur = None
        t_in = self.clock()
        cycle.end = self._record()
        cycle.host_ms = (t_in - cycle.host_t0) * 1e3
        cycle.tokens_reader = accept_lengths
        self.pending.append(cycle)
        while len(self.pending) > MAX_PENDING:
            self.pending.popleft()
            self.dropped += 1
        self._ended += 1
        self.drain()
        self._self_s += self.clock() - t_in

    # ---- draining (non-blocking) --------------------------------------------------------
    def drain(self) -> int:
        """Fold every leading pending cycle whose events have completed (``query()``) into the
        window; stops at the first incomplete one. Returns how many were folded."""
        done = 0
        while self.pending:
            cycle = self.pending[0]
            if not all(e.query() for e in cycle.events()):
                break
            lens = self._read_tokens(cycle)
            if lens is None:
                cycle.waited += 1
                if cycle.waited <= TOKEN_WAIT_DRAINS:
                    break
                lens = ()  # give up on the tokens of this cycle; time it anyway
            self.pending.popleft()
            self._fold(cycle, lens)
            done += 1
        return done

    @staticmethod
    def _read_tokens(cycle: _Cycle):
        reader = cycle.tokens_reader
        if reader is None:
            return ()
        try:
            value = reader() if callable(reader) else reader
        except Exception:  # a reader must never break the decode loop
            return ()
        return None if value is None else [int(x) for x in value]

    def _fold(self, cycle: _Cycle, lens: Sequence[int]) -> None:
        cycle_ms = cycle.begin.elapsed_time(cycle.end)
        phase_ms = {p: sum(a.elapsed_time(b) for a, b in cycle.phase_events.get(p, ()))
                    for p in PHASES}
        phase_ms["other"] = max(0.0, cycle_ms - sum(phase_ms.values()))
        record = dict(cycle_ms=cycle_ms, phase_ms=phase_ms, host_ms=cycle.host_ms,
                      host_phase={p: cycle.host_phase.get(p, 0.0) for p in PHASES},
                      tokens=sum(lens), requests=len(lens), num_steps=cycle.num_steps,
                      begin=cycle.begin, end=cycle.end)
        if self.metrics is not None:
            try:
                for p in ALL_PHASES:
                    self.metrics.observe(p, phase_ms[p])
                self.metrics.observe("cycle", cycle_ms)
                self._count_metrics()
            except Exception as e:  # metrics must never break the decode loop
                logger.warning("verify_graph_profile: metrics disabled (%s)", e)
                self.metrics = None
        self._window.append(record)
        if len(self._window) >= self.every:
            self._flush()

    # ---- counters and output ------------------------------------------------------------
    def _read_counts(self):
        c = self.counters() if self.counters is not None else None
        if c is None:
            return None
        return int(c.replays), Counter({str(k): int(v) for k, v in c.fallbacks.items()})

    def _count_metrics(self) -> None:
        now = self._read_counts()
        if now is None:
            return
        last = self._last_counts or (0, Counter())
        fallbacks = {k: v - last[1].get(k, 0) for k, v in now[1].items()
                     if v - last[1].get(k, 0) > 0}
        self.metrics.count(max(0, now[0] - last[0]), fallbacks)
        self._last_counts = now

    def _flush(self) -> None:
        window, self._window = self._window, []
        self_ms = 1e3 * self._self_s / self._ended if self._ended else None
        self._self_s, self._ended = 0.0, 0
        line = format_line(window, self.rank, self._window_counts, self._read_counts(),
                           self.dropped, self_ms=self_ms)
        self._window_counts = self._read_counts()
        self.lines = (self.lines + [line])[-8:]
        self.log(line)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def format_line(window: List[dict], rank: int, counts_before, counts_after,
                dropped: int = 0, self_ms: Optional[float] = None) -> str:
    """The ``verify_graph_profile ...`` line of a window of folded cycles; ``self_ms``: the
    profiler's own host ms per cycle (``prof_self_ms``/``prof_self_pct``; left out when None)."""
    med = statistics.median
    cycles = len(window)
    cycle_mean = statistics.fmean(r["cycle_ms"] for r in window)
    fields: Dict[str, str] = {"rank": str(rank), "cycles": str(cycles)}
    tokens = sum(r["tokens"] for r in window)
    requests = sum(r["requests"] for r in window)
    fields["tokens"] = str(tokens)
    fields["bs"] = _fmt(med(r["requests"] for r in window))
    steps = [r["num_steps"] for r in window if r["num_steps"] is not None]
    if steps:
        fields["num_steps"] = str(Counter(steps).most_common(1)[0][0])
    fields["cycle_ms"] = _fmt(med(r["cycle_ms"] for r in window))
    fields["cycle_mean_ms"] = _fmt(cycle_mean)
    for p in ALL_PHASES:
        fields[f"{p}_ms"] = _fmt(med(r["phase_ms"][p] for r in window))
    for p in ALL_PHASES:
        mean = statistics.fmean(r["phase_ms"][p] for r in window)
        fields[f"{p}_pct"] = f"{100.0 * mean / cycle_mean:.1f}" if cycle_mean > 0 else "0.0"
    fields["host_cycle_ms"] = _fmt(med(r["host_ms"] for r in window))
    for p in PHASES:
        fields[f"host_{p}_ms"] = _fmt(med(r["host_phase"][p] for r in window))
    if requests:
        accept_length = tokens / requests
        fields["accept_length"] = f"{accept_length:.3f}"
        fields["accepted_drafts"] = f"{accept_length - 1:.3f}"
    span_ms = window[0]["begin"].elapsed_time(window[-1]["end"])
    fields["tok_s"] = f"{1e3 * tokens / span_ms:.1f}" if span_ms > 0 else "na"
    if counts_before is not None and counts_after is not None:
        replays = counts_after[0] - counts_before[0]
        fb = {k: v - counts_before[1].get(k, 0) for k, v in counts_after[1].items()
              if v - counts_before[1].get(k, 0) > 0}
        steps_total = replays + sum(fb.values())
        fields["replay_pct"] = f"{100.0 * replays / steps_total:.1f}" if steps_total else "na"
        fields["fallbacks"] = ",".join(f"{k}:{v}" for k, v in sorted(fb.items())) or "none"
    else:
        fields["replay_pct"] = "na"
        fields["fallbacks"] = "na"
    if self_ms is not None:
        fields["prof_self_ms"] = f"{self_ms:.4f}"
        fields["prof_self_pct"] = f"{100.0 * self_ms / cycle_mean:.2f}" if cycle_mean > 0 else "na"
    if dropped:
        fields["dropped_cycles"] = str(dropped)
    return "verify_graph_profile " + " ".join(f"{k}={v}" for k, v in fields.items())
