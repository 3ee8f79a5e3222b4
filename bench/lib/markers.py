"""Rendered blocks inside hand-written documents: the text between a begin and an end marker line
is replaced by a renderer's output, the rest of the document is kept."""

from __future__ import annotations


def splice(text: str, block: str, path: str, begin: str, end: str) -> str:
    """``text`` with the part between ``begin`` and ``end`` replaced by ``block`` (which should end
    with a newline). Raises ``ValueError`` (one line naming ``path`` and the markers) unless
    ``text`` holds exactly one ``begin`` and one ``end``, in that order."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{path}: needs one {begin} ... {end} pair")
    head, rest = text.split(begin)
    return head + begin + "\n" + block + end + rest.split(end, 1)[1]
