"""The time estimate ``python -m bench speedup`` prints before it runs: the points each engine
measures, and seconds from a fitted per-cycle cost (an estimate, not a measurement)."""
from __future__ import annotations

START_S, BUILD_S, POINT_OVERHEAD_S, PREFILL_TOK_S = 75.0, 15.0, 0.3, 40000.0
"""Seconds per mode outside its points (child process, engine start with the weights read and
graph capture, shutdown), seconds to build the pair, host seconds per point, prefill tokens
per second."""


def plan(a) -> list:
    """``[(mode, [(context, cls, bs), ...]), ...]``: the points each engine measures, in order
    (plain: the first class only)."""
    out = []
    for m in a.modes:
        classes = a.classes[:1] if m == "plain" else a.classes
        out.append((m, [(ctx, c, bs) for ctx in a.contexts for c in classes for bs in a.batch_sizes]))
    return out


def _decode_ms(ctx: int, bs: int) -> float:
    k = ctx / 1024
    return 4.63 + 0.359 * k + 0.032 * bs * k


def cycle_ms(mode: str, ctx: int, bs: int) -> float:
    """Estimated GPU ms of one decode step (plain) or one EAGLE-3 cycle at num_steps 3 on one H200
    (fitted to the pair's measured decode and verify times; an estimate, not a measurement)."""
    dec = _decode_ms(ctx, bs)
    if mode == "plain":
        return dec
    side = 1.2 + 0.05 * bs + 0.05 * ctx / 1024  # draft steps + draft extend
    k = ctx / 1024
    ratio = 1.0 if mode == "ours" else 1.17 + 0.185 * k + 0.057 * bs + 0.0193 * k * bs
    return dec * ratio + side


def estimate_s(a, maps: dict, build: bool) -> dict:
    """Estimated seconds of the run: ``{"build", "engines", "points", "total"}``."""
    points = 0.0
    for mode, pts in plan(a):
        seen_prefill = set()
        for ctx, cls, bs in pts:
            acc = 1.0 if mode == "plain" else (maps["classes"][cls].get("target_accept_length") or 2.0)
            steps = (a.warmup_tokens + a.repeats * (1 + a.new_tokens)) / acc
            new = [i for i in range(bs) if (ctx, i) not in seen_prefill]
            seen_prefill.update((ctx, i) for i in new)
            points += 1.1 * steps * cycle_ms(mode, ctx, bs) / 1000 + POINT_OVERHEAD_S + len(new) * ctx / PREFILL_TOK_S
    out = {"build": BUILD_S if build else 0.0, "engines": START_S * len(a.modes), "points": round(points, 1)}
    out["total"] = round(sum(out.values()), 1)
    return out
