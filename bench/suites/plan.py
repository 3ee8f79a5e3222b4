"""From names to a plan: expand suite and stage names (``-NAME`` leaves out, ``wait`` is a
barrier), check every setting the plan reads, estimate its time, print the table of suites.
Stdlib only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from . import MOVED, RENAMED, SUITES, UNITS, suite_stages
from .spec import WAIT, Cases, SuiteError

DEFAULT_TOTAL_S, DEFAULT_RESERVE_S = 550, 40  # one 10-minute call: setup + stages + packing


def valid_names_line() -> str:
    return (f"valid suites: {', '.join(SUITES)}; stages: {', '.join(UNITS)}; '{WAIT}' (barrier); "
            "'-NAME' leaves a suite or stage out")


def expand(names: list[str], environ: Mapping[str, str]) -> list:
    """Stages (and WAIT barriers) in run order, each stage once, ``-NAME`` ones left out."""
    plan: list = []
    excluded: set[str] = set()
    for raw in names:
        name = raw[1:] if raw.startswith("-") else raw
        if name in SUITES:
            stages = suite_stages(name, environ)
        elif name in UNITS:
            stages = UNITS[name].stages(environ)
        elif name == WAIT and not raw.startswith("-"):
            plan.append(WAIT)
            continue
        elif name in MOVED:
            raise SuiteError(f"'{name}' is no longer a suite: it is a command of {MOVED[name]}")
        else:
            raise SuiteError(f"unknown suite '{raw}' (SUITE=\"{' '.join(names)}\"): {valid_names_line()}")
        if raw.startswith("-"):
            excluded |= {s.name for s in stages}
        else:
            plan += stages
    seen: set[str] = set()
    out = []
    for s in plan:
        if s == WAIT or (s.name not in seen and s.name not in excluded):
            out.append(s)
            if s != WAIT:
                seen.add(s.name)
    if not any(s != WAIT for s in out):
        raise SuiteError(f"SUITE=\"{' '.join(names)}\" leaves no stage to run: {valid_names_line()}")
    return out


def _int_env(environ: Mapping[str, str], var: str, default: int, lo: int = 0) -> int:
    raw = environ.get(var)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        v = lo - 1
    if v < lo:
        raise SuiteError(f"{var}={raw!r}: want a whole number >= {lo} (seconds); fix: set {var} to e.g. {default}")
    return v


@dataclass
class Settings:
    names: list[str]
    plan: list
    dry: bool
    parallel: bool
    total_s: int
    reserve_s: int
    parallel_tmo: int
    stagger_s: int
    shared_tokens: int
    limits: dict[str, int] = field(default_factory=dict)  # stage name -> its *_TMO value when set


def settings(names: list[str], environ: Mapping[str, str]) -> Settings:
    """Check the names and every setting the plan reads; :class:`SuiteError` names the first bad one."""
    for var, instead in RENAMED.items():
        if environ.get(var):
            raise SuiteError(f"{var} is no longer read: use {instead}")
    plan = expand(names, environ)
    stages = [s for s in plan if s != WAIT]
    par_raw = environ.get("PARALLEL", "")
    if par_raw not in ("", "0", "1"):
        raise SuiteError(f"PARALLEL={par_raw!r}: want 1 (stages at once) or 0 (one at a time)")
    named = [n for n in names if n in SUITES]
    parallel = par_raw == "1" or (par_raw == "" and any(SUITES[n].parallel for n in named))
    whole = not any(n.startswith("-") for n in names)
    suite_total = max([SUITES[n].total_s or 0 for n in named] + [0]) if whole else 0
    st = Settings(
        names, plan, environ.get("DRY_RUN") == "1", parallel,
        _int_env(environ, "TOTAL_S", suite_total or DEFAULT_TOTAL_S, 1),
        _int_env(environ, "RESERVE_S", DEFAULT_RESERVE_S),
        _int_env(environ, "PARALLEL_TMO", 520, 1), _int_env(environ, "PARALLEL_STAGGER_S", 4),
        _int_env(environ, "SHARED_GPU_TOKENS", 65536, 1))
    for s in stages:
        if environ.get(s.tmo_env):
            st.limits[s.name] = _int_env(environ, s.tmo_env, s.tmo_s, 1)
    return st


def estimate_s(st: Settings) -> int:
    """The selection's estimated seconds: a suite named in full counts its own estimate (at once
    where it is parallel); any other stage its own, the longest one for stages started at once."""
    covered: set[str] = set()
    total = 0
    if all(not n.startswith("-") for n in st.names):
        for n in st.names:
            if n in SUITES:
                members = {s.name for s in suite_stages(n, {})}
                if not members & covered:
                    total += SUITES[n].est_s
                covered |= members
    together, par = 0, st.parallel
    for s in st.plan:
        if s == WAIT or (par and s.alone):
            total, together, par = total + together, 0, False
        if s == WAIT or s.name in covered:
            continue
        if par:
            together = max(together, s.est_s)
        else:
            total += s.est_s
    return total + together


def minutes(s: int) -> str:
    return f"~{s // 60} min" if s >= 60 else f"~{s} s"


def table() -> str:
    lines = [f"{'suite':<12} {'est':>8}  purpose / stages (limit variable, default s)"]
    for name, s in SUITES.items():
        lines.append(f"{name:<12} {minutes(s.est_s):>8}  {s.purpose}" + (" [stages at once]" if s.parallel else ""))
        for p in s.parts:
            if isinstance(p, str):
                continue
            if isinstance(p, Cases):
                lines.append(f"{'':<23}{p.name}: {p.doc}, default {p.default}")
                continue
            for x in p.stages({}):
                env = " ".join(f"{k}={v if isinstance(v, str) else '$' + v.var}" for k, v in x.env)
                lines.append(f"{'':<23}{x.name}: {env + ' ' if env else ''}"
                             f"{' '.join(a if isinstance(a, str) else '$' + a.var for a in x.cmd)}"
                             f"{' $' + x.extra.var if x.extra else ''} ({x.tmo_env} {x.tmo_s}; est {x.est_s} s)")
        if all(isinstance(p, str) for p in s.parts):
            lines.append(f"{'':<23}= {' '.join(s.parts)}")
    lines.append(f"the shard sweeps, floor and capture (SUITE=bench / parts / capture with *_ARGS): {MOVED['shard_bench']}")
    return "\n".join(lines)
