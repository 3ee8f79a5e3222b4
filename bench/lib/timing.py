"""The lab's one CUDA-graph timer: a kernel's calls captured into one CUDA graph (after an eager
warm-up that compiles every kernel), the graph replayed between CUDA events, per-call ms = replay
time / calls in the graph (``time_calls``; ``graph_ms``: the median of one callable). The parts
bench and the kernel bench both time with it."""

from __future__ import annotations

import math
import statistics


def percentile(xs, q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of a non-empty sequence, q in [0, 100]."""
    s = sorted(xs)
    if not s:
        raise ValueError("no samples")
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples) -> dict:
    """Median, p10 and p90 (ms) of per-replay samples."""
    return {"median_ms": statistics.median(samples), "p10_ms": percentile(samples, 10),
            "p90_ms": percentile(samples, 90), "n": len(samples)}

def time_calls(calls, replays: int, warmup: int, min_calls: int = 8) -> dict:
    """Per-call GPU ms of ``calls`` (zero-argument callables, each on its own input set): run each
    once eagerly (compiles kernels), once more on a side stream, capture ``calls`` repeated to at
    least ``min_calls`` into one CUDA graph, replay it ``warmup`` times, then ``replays`` times
    between CUDA events. Returns ``summarize`` of (replay ms / calls in the graph) plus
    ``calls_per_replay``, ``input_sets`` and the samples."""
    import torch

    seq = list(calls) * max(1, math.ceil(min_calls / len(calls)))
    for f in calls:
        f()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in seq:
            f()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for s, e in ev:
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) / len(seq) for s, e in ev]
    del g
    res = summarize(samples)
    res.update(calls_per_replay=len(seq), input_sets=len(calls), samples=[round(x, 6) for x in samples])
    return res


def graph_ms(fn, replays: int = 100, warmup: int = 3, min_calls: int = 8) -> float:
    """Median GPU ms per call of ``fn`` (a zero-argument callable) from :func:`time_calls`:
    ``fn`` repeated ``min_calls`` times in one CUDA graph, ``replays`` timed replays."""
    return time_calls([fn], replays, warmup, min_calls)["median_ms"]
