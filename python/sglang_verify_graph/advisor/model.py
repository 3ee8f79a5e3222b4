"""The advisor's model: expected accept length, speed-up, break-even and best ``num_steps`` from
per-phase timings (formulas and assumptions: ``advisor.py``'s docstring). Pure Python."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from sglang_verify_graph.advisor.inputs import AdvisorError


# ----------------------------------------------------------------------------- math

def expected_accept_length(rates: Sequence[float], num_steps: Optional[int] = None) -> float:
    """E[accept_length] (tokens per cycle) = 1 + sum_i prod_{j<=i} p_j over the first k rates."""
    k = len(rates) if num_steps is None else num_steps
    if k > len(rates):
        raise AdvisorError(f"{len(rates)} acceptance rates given but num_steps is {k}")
    total, prod = 1.0, 1.0
    for p in rates[:k]:
        if not 0.0 <= p <= 1.0:
            raise AdvisorError(f"acceptance rate {p} is outside [0, 1]")
        prod *= p
        total += prod
    return total


def constant_rate_for_accept_length(accept_length: float, num_steps: int) -> float:
    """The constant per-position rate p with 1 + p + ... + p^k = accept_length (bisection)."""
    check_accept_length(accept_length, num_steps)
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if expected_accept_length([mid] * num_steps) < accept_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def check_accept_length(accept_length: float, num_steps: int) -> None:
    if not 1.0 <= accept_length <= num_steps + 1:
        raise AdvisorError(
            f"accept_length {accept_length} must be in [1, num_steps + 1 = {num_steps + 1}] "
            f"(accept_length = accepted_drafts + 1 tokens per cycle)")


def speedup(accept_length: float, cycle_ms: float, decode_ms: float) -> float:
    """Speculative tok/s over plain-decode tok/s = accept_length * decode_ms / cycle_ms."""
    return accept_length * decode_ms / cycle_ms


def break_even_accept_length(cycle_ms: float, decode_ms: float) -> float:
    """accept_length (tokens per cycle) at which speculation matches plain decode."""
    return cycle_ms / decode_ms


def fit_verify_line(points: Dict[int, float]) -> Tuple[float, float]:
    """Least-squares (a, b) of verify_ms = a + b * (k + 1) through {k: verify_ms}, >= 2 points."""
    if len(points) < 2:
        raise AdvisorError("a verify-time line needs verify ms at >= 2 different num_steps")
    xs = [k + 1.0 for k in points]
    ys = list(points.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


@dataclass
class Inputs:
    """Everything the advisor needs; ms are per step at one batch size and context."""

    decode_ms: float
    num_steps: int
    verify_points: Dict[int, float]            # {num_steps: verify ms}
    draft_points: Dict[int, float] = field(default_factory=dict)  # {num_steps: draft-phase ms}
    draft_ms_per_step: Optional[float] = None
    draft_extend_ms: float = 0.0
    other_ms: float = 0.0
    accept_length: Optional[float] = None      # tokens per cycle at num_steps
    rates: Optional[List[float]] = None        # per-position acceptance rates p_1..p_n
    accept_points: Dict[int, float] = field(default_factory=dict)  # {k: measured accept_length}
    max_steps: Optional[int] = None

    def validate(self) -> None:
        if self.num_steps < 1:
            raise AdvisorError(f"num_steps {self.num_steps} must be >= 1")
        if not self.decode_ms > 0:
            raise AdvisorError(f"decode ms {self.decode_ms} must be > 0")
        named = [("draft-extend ms", self.draft_extend_ms), ("other ms", self.other_ms),
                 ("draft ms per step", self.draft_ms_per_step)]
        named += [(f"verify ms at num_steps {k}", v) for k, v in self.verify_points.items()]
        named += [(f"draft ms at num_steps {k}", v) for k, v in self.draft_points.items()]
        for name, value in named:
            if value is not None and value < 0:
                raise AdvisorError(f"{name} {value} must be >= 0")
        if any(k < 1 for k in list(self.verify_points) + list(self.draft_points)):
            raise AdvisorError("num_steps in measured points must be >= 1")
        if not self.verify_points:
            raise AdvisorError("no verify time: give --verify-ms or --verify-ms-per-steps")
        if self.num_steps not in self.verify_points and len(self.verify_points) < 2:
            raise AdvisorError(f"verify ms measured at num_steps {sorted(self.verify_points)} "
                               f"only; give it at num_steps {self.num_steps} or >= 2 points")
        if (self.accept_length is None) == (self.rates is None):
            raise AdvisorError("give exactly one of accept_length, accepted_drafts, rates")
        if self.rates is not None:
            expected_accept_length(self.rates, self.num_steps)  # checks range and count
        else:
            check_accept_length(self.accept_length, self.num_steps)
        for k, length in self.accept_points.items():
            check_accept_length(length, k)
        if self.max_steps is not None and self.max_steps < 1:
            raise AdvisorError(f"max_steps {self.max_steps} must be >= 1")

    def verify_ms(self, k: int) -> Tuple[float, str]:
        """(verify ms at k, "measured" | "fit" | "extrapolated")."""
        if k in self.verify_points:
            return self.verify_points[k], "measured"
        a, b = fit_verify_line(self.verify_points)
        inside = min(self.verify_points) < k < max(self.verify_points)
        return max(a + b * (k + 1), 0.0), "fit" if inside else "extrapolated"

    def draft_ms(self, k: int) -> float:
        if k in self.draft_points:
            return self.draft_points[k]
        if self.draft_ms_per_step is not None:
            return self.draft_ms_per_step * k
        if self.draft_points:  # scale the measured draft phase(s) linearly in k
            return statistics.median(v / j for j, v in self.draft_points.items()) * k
        return 0.0

    def cycle_ms(self, k: int) -> float:
        return self.draft_ms(k) + self.verify_ms(k)[0] + self.draft_extend_ms + self.other_ms

    def accept_length_at(self, k: int) -> float:
        if self.rates is not None:
            return expected_accept_length(self.rates, k)
        if k == self.num_steps:
            return self.accept_length
        if k in self.accept_points:
            return self.accept_points[k]
        p = constant_rate_for_accept_length(self.accept_length, self.num_steps)
        return expected_accept_length([p] * k)

    def sweep_steps(self) -> List[int]:
        top = self.max_steps or max([self.num_steps] + list(self.verify_points))
        if self.rates is not None:
            top = min(top, len(self.rates))
        return list(range(1, top + 1))


@dataclass
class Row:
    """One num_steps: ms, accept_length in tokens/cycle, spec_tok_s in tokens/s per sequence."""

    num_steps: int
    verify_ms: float
    verify_source: str
    cycle_ms: float
    accept_length: float
    spec_tok_s: float
    speedup: float
    break_even: float


def evaluate(inp: Inputs, k: int) -> Row:
    """The model at num_steps k (see the module docstring)."""
    cycle = inp.cycle_ms(k)
    if not cycle > 0:
        raise AdvisorError(f"cycle time at num_steps {k} is {cycle} ms; it must be > 0")
    verify, source = inp.verify_ms(k)
    length = inp.accept_length_at(k)
    return Row(k, verify, source, cycle, length, 1000.0 * length / cycle,
               speedup(length, cycle, inp.decode_ms),
               break_even_accept_length(cycle, inp.decode_ms))


def best_num_steps(inp: Inputs) -> Tuple[Optional[Row], List[Row]]:
    """(row with the highest speedup or None if only one k can be evaluated, all rows)."""
    ks = [k for k in inp.sweep_steps() if k in inp.verify_points or len(inp.verify_points) >= 2]
    rows = [evaluate(inp, k) for k in ks]
    if len(rows) < 2:
        return None, rows
    return max(rows, key=lambda r: r.speedup), rows
