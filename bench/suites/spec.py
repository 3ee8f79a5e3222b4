"""The vocabulary of a suite declaration: :class:`Stage` (one command), :class:`Cases` (stages made
per word of an environment list), :class:`Group` (stages under one name), :class:`Suite` (a
purpose, an estimate and its parts), :class:`Arg` (arguments read from the environment).
Stdlib only."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping, Union

WAIT = "wait"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_file(command: str) -> str:
    """The file ``python3 -m bench <command>`` runs, from the dispatcher's table (stdlib only), or
    ``bench/__main__.py:<command>`` (no such file) when it has no such command."""
    try:
        from bench.__main__ import COMMANDS
    except ImportError:
        COMMANDS = {}
    if command not in COMMANDS:
        return f"bench/__main__.py:{command}"
    path = COMMANDS[command][0].replace(".", "/")
    package = os.path.join(path, "__init__.py")  # a command that is a package runs its __init__'s main
    return package if os.path.isfile(os.path.join(ROOT, package)) else path + ".py"


class SuiteError(ValueError):
    """A bad suite name or setting: the message is the one line to print."""


@dataclass(frozen=True)
class Arg:
    """Arguments read from the environment when the stage starts: ``shlex.split($var)``, or
    ``default`` when the variable is unset (set and empty: no arguments)."""

    var: str
    default: str = ""

    def expand(self, environ: Mapping[str, str]) -> list[str]:
        value = environ.get(self.var)
        return shlex.split(self.default if value is None else value)


Part = Union[str, Arg]


@dataclass(frozen=True)
class Stage:
    """One command of a suite.

    ``cmd``: argv; strings may hold ``{logs}``, ``{work}``, ``{models}``, ``{jit}``; :class:`Arg` items
    expand from the environment. ``kind`` ``pytest``: ``--collect-only`` in a dry run and its
    result line in the summary; ``bench``: ``--dry-run``. ``extra``: arguments after those.
    ``env``: variables set for the stage (a string, or an :class:`Arg`: its words joined).
    ``alone``: never beside other stages (timing; compute-sanitizer). ``memcheck`` ``kernel``:
    the command runs under compute-sanitizer; ``server``: the test servers do. ``needs_pair``:
    the constructed target/draft pair (``python3 -m bench models pair``, real weights) is made
    first; ``needs_attn_pair``: its attention pair (``--attention``); ``needs_prefix_pair``: the
    prefix-reading pair (``--prefix``, span 1024).
    ``report``: its benchmark lines for the summary (``bench``, ``speedup``, ``capture``, ``kbench``,
    ``demo``, ``jit``) and ``results``: the JSON it writes in ``{work}``, copied into ``$OUT``.
    ``e2e_report``: its ``e2e_results.json`` lines (startup, parity, concurrency, counters).
    ``est_s``: measured seconds on the H200 with a warm kernel cache, the stage alone unless
    its comment says otherwise."""

    name: str
    cmd: tuple[Part, ...]
    tmo_env: str
    tmo_s: int
    est_s: int
    kind: str = "pytest"
    extra: Arg | None = None
    env: tuple[tuple[str, Part], ...] = ()
    alone: bool = False
    memcheck: str = ""
    needs_pair: bool = False
    needs_attn_pair: bool = False
    needs_prefix_pair: bool = False
    report: str = ""
    results: str = ""
    e2e_report: bool = False

    @property
    def files(self) -> list[str]:
        """The test files, scripts and lab commands (``-m bench X``) the stage runs (paths
        relative to the repo root)."""
        files = [c for c in self.cmd if isinstance(c, str) and c.endswith(".py") and "/" in c]
        for a, b, c in zip(self.cmd, self.cmd[1:], self.cmd[2:]):
            if (a, b) == ("-m", "bench") and isinstance(c, str):
                files.append(bench_file(c))
        return files

    def stages(self, environ: Mapping[str, str]) -> list["Stage"]:
        return [self]


@dataclass(frozen=True)
class Cases:
    """Stages made per word of an environment list (``var``, default ``default``): one stage per
    case, each with its own name (own log, own server logs)."""

    name: str
    var: str
    default: str
    make: Callable[[str, int], Stage]
    doc: str = ""

    def stages(self, environ: Mapping[str, str]) -> list[Stage]:
        return [self.make(c, i) for i, c in enumerate(environ.get(self.var, self.default).split())]


@dataclass(frozen=True)
class Group:
    """A fixed list of stages under one name (run together, addressable by that name)."""

    name: str
    members: tuple[Stage, ...]

    def stages(self, environ: Mapping[str, str]) -> list[Stage]:
        return list(self.members)


@dataclass(frozen=True)
class Suite:
    """``parts``: stages, cases, groups or names of other suites, in run order. ``est_s``:
    seconds for the whole suite as it runs by default (at once when ``parallel``), measured on
    the H200 with a warm kernel cache. ``total_s``: the default ``TOTAL_S`` when this suite is
    named in full (nothing left out) and ``TOTAL_S`` is unset."""

    purpose: str
    est_s: int
    parts: tuple = ()
    parallel: bool = False
    total_s: int | None = None


def pytest_cmd(marker: str, path: str, *args: str, stop_first: bool = True) -> tuple[str, ...]:
    return ("python3", "-m", "pytest", *(("-x",) if stop_first else ()), "-q", "-rs", "-m", marker,
            path, *args, "-p", "no:cacheprovider")


def bench_cmd(command: str, *args: Part) -> tuple[Part, ...]:
    """``python3 -m bench <command> ARGS`` (the lab's dispatcher)."""
    return ("python3", "-m", "bench", command, *args)
