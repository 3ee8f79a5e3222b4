"""The mutation-testing table of ``docs/testing.md``, rendered from the raw mutmut results kept in
``docs/runs/mutation/*.txt`` (``python -m bench report`` writes it with the results reference).

A raw file is what ``scripts/mutation_test.sh`` leaves as ``$MUTATION_DIR/raw.txt``: ``#`` lines
(the run: mutmut and SGLang versions, the commit, the command) and one ``NAME: STATUS`` line per
mutant, as ``mutmut results --all true`` prints it (``NAME`` =
``sglang_verify_graph.<module>.x_<function>__mutmut_<n>`` or ``...xǁ<class>ǁ<method>__mutmut_<n>``).

``render(root) -> str``: the block between :data:`BEGIN` and :data:`END`: one table per raw file
(name order): per module, killed / total, the mutants not killed by status, and the score
(killed + timeout) / total, then all modules of the file. Raises ``ValueError`` (one line naming
the file and line) on a line that is neither.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Dict, List

from bench.lib.markers import splice

DOC = os.path.join("docs", "testing.md")
RAW_DIR = os.path.join("docs", "runs", "mutation")
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
_LINE = re.compile(r"\s*sglang_verify_graph\.([\w.]+)\.x[_ǁ]\S*__mutmut_\d+: (\w[\w ]*)$")
DETECTED = ("killed", "timeout")


def parse(text: str, name: str = "raw") -> tuple:
    """``(header lines without '#', {module: Counter(status -> mutants)})`` of one raw file."""
    header, per = [], collections.defaultdict(collections.Counter)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            header.append(line.lstrip("#").strip())
            continue
        m = _LINE.match(line.rstrip())
        if not m:
            raise ValueError(f"{name}:{n}: not a mutmut result line: {line.strip()[:80]!r}")
        per[m.group(1)][m.group(2)] += 1
    return header, dict(per)


def _row(name: str, c: collections.Counter) -> str:
    total = sum(c.values())
    rest = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in DETECTED) or "-"
    timeout = f" + {c['timeout']} timeout" if c["timeout"] else ""
    score = 100.0 * sum(c[k] for k in DETECTED) / total
    return f"| {name} | {c['killed']}{timeout} / {total} | {rest} | {score:.1f}% |"


def render(root: str) -> str:
    """The block for ``docs/testing.md`` from every raw file under ``root``'s ``docs/runs/mutation``."""
    folder = os.path.join(root, RAW_DIR)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".txt")) if os.path.isdir(folder) else []
    out: List[str] = []
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            header, per = parse(f.read(), f"{RAW_DIR}/{name}")
        if not per:
            raise ValueError(f"{RAW_DIR}/{name}: no mutant results")
        out += ["", f"`{RAW_DIR}/{name}`" + (": " + "; ".join(header) if header else "") + ".", "",
                "| module | killed / total | not killed | score |", "|---|---|---|---|"]
        out += [_row(f"`{m}`", per[m]) for m in sorted(per)]
        out.append(_row("all", sum(per.values(), collections.Counter())).replace("| all |", "| **all** |", 1))
    return "\n".join(out + [""]) + "\n"


def render_doc(root: str) -> Dict[str, str]:
    """``{DOC: the new text of docs/testing.md}``."""
    with open(os.path.join(root, DOC), encoding="utf-8") as f:
        return {DOC: splice(f.read(), render(root), DOC, BEGIN, END)}
