"""The lab's one reader of the plugin's per-phase profile lines (``verify_graph_profile
key=value ...``, written by ``sglang_verify_graph.profile.format_line``; the tag is the product's,
``sglang_verify_graph.advisor.inputs.LOG_TAG``). Values stay strings; a caller converts the keys
it reads."""

from __future__ import annotations

from typing import Iterable, List, Optional

from sglang_verify_graph.advisor.inputs import LOG_TAG


def profile_fields(line: str) -> Optional[dict]:
    """``{key: value}`` (str) of the ``key=value`` words after the tag of a profile line (the tag a
    word of its own, after any logger prefix), or ``None`` for a line without the tag or without
    ``cycles=`` (e.g. a start-up message naming the profile)."""
    words = line.split()
    if LOG_TAG not in words:
        return None
    out = dict(w.split("=", 1) for w in words[words.index(LOG_TAG) + 1:] if "=" in w)
    return out if "cycles" in out else None


def profile_field(line: str, key: str) -> Optional[str]:
    """The value of ``key`` in a profile line, or ``None`` (no such line, or no such key)."""
    fields = profile_fields(line)
    return None if fields is None else fields.get(key)


def at_batch(fields: Optional[dict], bs: int) -> bool:
    """Whether a profile line's window ran at batch size ``bs`` (its ``bs=`` is the window's mean
    batch size, printed as a float: a window across two load levels matches neither)."""
    try:
        return fields is not None and float(fields["bs"]) == bs
    except (KeyError, ValueError):
        return False


def lines_at_batch(lines: Iterable[str], bs: int) -> List[str]:
    """The profile lines among ``lines`` whose window ran at batch size ``bs``."""
    return [ln for ln in lines if at_batch(profile_fields(ln), bs)]


def read_profile_lines(path: str) -> List[str]:
    """The profile lines of a log file (undecodable bytes replaced), without their newline."""
    with open(path, errors="replace") as f:
        return [ln.rstrip("\n") for ln in f if profile_fields(ln) is not None]
