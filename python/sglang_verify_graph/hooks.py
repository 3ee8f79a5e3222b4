"""The hook table: every hook is declared once, next to its body, with :func:`hook`; the plugin
installs the groups a process needs (``plugin.install``). ``python -m sglang_verify_graph.hooks``
prints the table for the installed SGLang release.

Groups, in install order: ``cli`` (every process; bodies in ``cli.py``), ``runtime`` (where the
flag is on; ``plugin.py``), ``profile`` (``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0;
``profile_hooks.py``), ``sync_check`` (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``; ``debug/hooks.py``).
SGLang's ``HookRegistry`` calls BEFORE hooks as ``hook(*args, **kwargs)``, AFTER hooks as
``hook(result, *args, **kwargs)`` and AROUND hooks as ``hook(original, *args, **kwargs)``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

from sglang_verify_graph.compat.sglang_adapter import HookType

GROUPS = ("cli", "runtime", "profile", "sync_check")
"""Hook groups in install order."""

_DECLARING_MODULES = {
    "cli": "sglang_verify_graph.cli",
    "runtime": "sglang_verify_graph.plugin",
    "profile": "sglang_verify_graph.profile_hooks",
    "sync_check": "sglang_verify_graph.debug.hooks",
}


@dataclass(frozen=True)
class Hook:
    """One declared hook: ``group`` (:data:`GROUPS`), ``target`` (the dotted name SGLang's
    ``HookRegistry`` resolves), ``body`` and ``kind`` (``HookType``)."""

    group: str
    target: str
    body: Callable
    kind: HookType

    def triple(self) -> tuple:
        """``(target, body, kind)``, what ``compat.sglang_adapter.install_hooks`` takes."""
        return self.target, self.body, self.kind


_TABLE: list[Hook] = []


def hook(group: str, target: Optional[str], kind: HookType) -> Callable:
    """Decorator declaring ``body`` a hook of ``group`` on ``target``; a ``target`` of ``None``
    (a point this SGLang release does not have) declares nothing. Raises ValueError on an unknown
    group. Returns the body unchanged."""
    if group not in GROUPS:
        raise ValueError(f"hook group {group!r}: use one of {', '.join(GROUPS)}")

    def declare(body: Callable) -> Callable:
        if target is not None:
            _TABLE.append(Hook(group, target, body, kind))
        return body

    return declare


def table(groups=GROUPS) -> list[Hook]:
    """The declared hooks of ``groups`` (importing the modules that declare them), in
    :data:`GROUPS` order, then in declaration order. Raises ValueError on an unknown group."""
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"hook groups {unknown}: use {', '.join(GROUPS)}")
    for g in groups:
        importlib.import_module(_DECLARING_MODULES[g])
    return [h for g in GROUPS if g in groups for h in _TABLE if h.group == g]


def describe(groups=GROUPS) -> str:
    """The table as text, one line per hook: group, kind, target, body."""
    return "\n".join(f"{h.group:<10} {h.kind.name:<6} {h.target}  ->  {h.body.__module__}.{h.body.__name__}"
                     for h in table(groups))


if __name__ == "__main__":  # the table lives in the imported module, not in __main__
    from sglang_verify_graph import hooks

    print(hooks.describe())
