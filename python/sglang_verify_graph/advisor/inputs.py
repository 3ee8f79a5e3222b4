"""Input formats of the advisor (``python -m sglang_verify_graph.advisor``).

The profile-log line format (what ``--from-log`` reads; a profiler is to emit it) and the
command-line value types (argparse ``type=`` callables: a bad value is an exit-2 usage error).

Profile log: one record per line, anywhere after a prefix such as a logger timestamp::

    verify_graph_profile num_steps=2 decode_ms=12.0 verify_ms=25.6 draft_ms=1.0 \\
        draft_extend_ms=0.3 accept_length=1.93

``key=value`` pairs separated by spaces. Keys: ``num_steps`` (int >= 1); in ms per step at one
batch size and context: ``decode_ms``, ``verify_ms``, ``draft_ms`` (whole draft phase),
``draft_ms_per_step``, ``draft_extend_ms``, ``other_ms``; in tokens per cycle:
``accept_length`` (SGLang's, >= 1) or ``accepted_drafts`` (= accept_length - 1). Other keys
(``bs``, ``ctx``, ...) are ignored, so the profiler may add fields. Values are medians over the
lines of one ``num_steps``; lines without ``num_steps`` (e.g. plain-decode lines) form a common
group, used where a ``num_steps`` group lacks a key. Pure Python.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

LOG_TAG = "verify_graph_profile"
LOG_FLOAT_KEYS = ("decode_ms", "verify_ms", "draft_ms", "draft_ms_per_step", "draft_extend_ms",
                  "other_ms", "accept_length", "accepted_drafts")
_PAIR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S+)$")


class AdvisorError(ValueError):
    """Invalid advisor input (flags or log); the message names the offending value."""


@dataclass
class ProfileSummary:
    """Medians from a profile log: ``common`` over lines without num_steps, ``by_steps[k]``."""

    common: Dict[str, float]
    by_steps: Dict[int, Dict[str, float]]
    lines: int
    line_counts: Dict[int, int]  # lines per num_steps

    def main_steps(self) -> Optional[int]:
        """The num_steps with the most lines (ties: the larger), None without num_steps."""
        if not self.line_counts:
            return None
        return max(self.line_counts, key=lambda k: (self.line_counts[k], k))

    def value(self, key: str, num_steps: Optional[int]) -> Optional[float]:
        """Median of key at num_steps, else over the lines without num_steps, else None."""
        group = self.by_steps.get(num_steps, {}) if num_steps is not None else {}
        return group.get(key, self.common.get(key))

    def points(self, key: str) -> Dict[int, float]:
        """{num_steps: median of key} over the groups that have it."""
        return {k: v[key] for k, v in sorted(self.by_steps.items()) if key in v}


def parse_profile_log(lines: Iterable[str]) -> ProfileSummary:
    """Parse ``verify_graph_profile key=value ...`` lines (format in the module docstring)."""
    common: Dict[str, List[float]] = {}
    grouped: Dict[int, Dict[str, List[float]]] = {}
    line_counts: Dict[int, int] = {}
    count = 0
    for lineno, line in enumerate(lines, 1):
        words = line.split()
        if LOG_TAG not in words:
            continue
        count += 1
        record: Dict[str, float] = {}
        steps: Optional[int] = None
        for word in words[words.index(LOG_TAG) + 1:]:
            m = _PAIR.match(word)
            if not m:
                raise AdvisorError(f"log line {lineno}: {word!r} is not key=value")
            key, raw = m.groups()
            if key == "num_steps":
                try:
                    steps = int(raw)
                except ValueError:
                    raise AdvisorError(f"log line {lineno}: num_steps={raw} is not an integer")
            elif key in LOG_FLOAT_KEYS:
                try:
                    record[key] = float(raw)
                except ValueError:
                    raise AdvisorError(f"log line {lineno}: {key}={raw} is not a number")
                if not 0.0 <= record[key] < math.inf:
                    raise AdvisorError(f"log line {lineno}: {key}={raw} must be finite, >= 0")
        if steps is not None and steps < 1:
            raise AdvisorError(f"log line {lineno}: num_steps={steps} must be >= 1")
        target = common if steps is None else grouped.setdefault(steps, {})
        for key, value in record.items():
            target.setdefault(key, []).append(value)
        if steps is not None:
            line_counts[steps] = line_counts.get(steps, 0) + 1
    if count == 0:
        raise AdvisorError(f"no '{LOG_TAG}' lines found")
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}  # noqa: E731
    return ProfileSummary(med(common), {k: med(v) for k, v in grouped.items()}, count,
                          line_counts)


# ----------------------------------------------------------------------------- flag values

def _number(text: str, what: str, low: float, high: float, rule: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number")
    if not low <= value <= high:  # also rejects nan
        raise argparse.ArgumentTypeError(f"{what} {text!r} must be {rule}")
    return value


def ms_value(text: str) -> float:
    """A time in ms: finite, >= 0."""
    return _number(text, "time", 0.0, 1e9, "a finite number of ms >= 0")


def rate_value(text: str) -> float:
    """A per-position acceptance rate in [0, 1]."""
    return _number(text, "acceptance rate", 0.0, 1.0, "in [0, 1]")


def int_at_least(text: str, what: str, low: int, hint: str = "") -> int:
    """``text`` as an integer >= ``low``; else raises argparse.ArgumentTypeError naming ``what``
    (``hint``, e.g. ``" (e.g. --tp 8)"``, ends the message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}{text!r} is not an integer{hint}")
    if value < low:
        raise argparse.ArgumentTypeError(f"{what}{text!r} must be >= {low}{hint}")
    return value


def num_steps_value(text: str) -> int:
    """num_steps: an integer >= 1."""
    return int_at_least(text, "num_steps ", 1)


def steps_points(text: str) -> Dict[int, float]:
    """``K:MS,K:MS,...`` -> {num_steps: ms}."""
    points: Dict[int, float] = {}
    for item in text.split(","):
        k, sep, ms = item.strip().partition(":")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r} is not NUM_STEPS:MS (e.g. 2:25.6,5:28.7)")
        points[num_steps_value(k)] = ms_value(ms)
    return points
