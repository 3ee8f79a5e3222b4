"""The plugin's flag and the one error type every refusal raises (imports nothing)."""

from __future__ import annotations

from typing import Any

FLAG = "--enable-verify-cuda-graph"
"""The command-line flag this plugin adds to SGLang's server arguments."""


def one_line(text: Any) -> str:
    """``text`` as one line (runs of whitespace, newlines included, become one space)."""
    return " ".join(str(text).split())


class VerifyGraphConfigError(ValueError):
    """A server setting that ``--enable-verify-cuda-graph`` cannot work with.

    Attributes:
        problem: what is wrong, e.g. ``"needs a linear draft chain"``.
        flag: the conflicting flag (``"--speculative-eagle-topk"``) or
            environment variable name.
        value: the offending value as given/resolved (any type, shown with ``str``).
        fix: what to do, e.g. ``"pass --speculative-eagle-topk 1"``.

    ``str(err)`` is one line:
    ``--enable-verify-cuda-graph: <problem> (<flag> = <value>). Fix: <fix>.``
    """

    def __init__(self, problem: str, flag: str, value: Any, fix: str):
        self.problem = one_line(problem)
        self.flag = one_line(flag)
        self.value = value
        self.fix = one_line(fix).rstrip(".")
        super().__init__(
            f"{FLAG}: {self.problem} ({self.flag} = {one_line(str(value))}). "
            f"Fix: {self.fix}."
        )

    def __reduce__(self):  # picklable across processes despite the custom __init__
        return (type(self), (self.problem, self.flag, self.value, self.fix))
