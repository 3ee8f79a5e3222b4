"""Verdict on compute-sanitizer memcheck reports (``--log-file DIR/PREFIX.%p.txt``).

Usage: ``python3 scripts/memcheck_verdict.py DIR/PREFIX``; prints one line
``<verdict>: <detail>`` and exits 0 only for ``ok``.

A report is clean only when it holds compute-sanitizer's ``========= ERROR SUMMARY: 0 errors``:
the frontend writes that line when its targets have exited, so a frontend killed with the server
(SIGKILL at test teardown: the report then holds only its banner) has no summary and
proves nothing.

Verdicts: ``ok`` (every report has a 0-error summary and no memory-error record), ``errors`` (a
summary counts errors, or a memory-error record such as ``Invalid __global__ read``, ``Program
hit cudaErrorIllegalAddress``, ``Out-of-range`` or ``Misaligned`` is present), ``no_summary`` (a
report with neither a summary nor an error record), ``absent`` (no report file). Tool notices
such as ``========= Error: process didn't terminate successfully`` (a target SIGKILLed at the end
of SGLang's graceful stop) are not memory errors; they are listed in the detail as ``notes``.
"""

from __future__ import annotations

import glob
import re
import sys

SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
ERROR_RECORD = re.compile(r"^========= (Invalid |Program hit |Out-of-range|Misaligned|Illegal |Leaked )", re.M)
TOOL_NOTE = re.compile(r"^========= (Error: .*|Target application returned an error.*)$", re.M)


def verdict(prefix: str) -> tuple[str, str]:
    """``(verdict, detail)`` for the reports ``prefix.*.txt``."""
    files = sorted(glob.glob(glob.escape(prefix) + ".*.txt"))
    if not files:
        return "absent", f"no {prefix}.*.txt"
    worst, details = "ok", []
    rank = {"ok": 0, "no_summary": 1, "errors": 2}
    for f in files:
        text = open(f, errors="replace").read()
        counts = [int(n) for n in SUMMARY.findall(text)]
        records = len(ERROR_RECORD.findall(text))
        if (counts and max(counts) > 0) or records:
            v = "errors"
        elif counts:
            v = "ok"
        else:
            v = "no_summary"
        n_err = max(counts + [records])
        notes = TOOL_NOTE.findall(text)
        details.append(f"{f.rsplit('/', 1)[-1]}={v}" + (f"({n_err})" if v == "errors" else "")
                       + (f" notes={notes[:2]}" if notes else ""))
        worst = max(worst, v, key=rank.__getitem__)
    return worst, ", ".join(details)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    v, detail = verdict(argv[1])
    print(f"{v}: {detail}")
    return 0 if v == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
