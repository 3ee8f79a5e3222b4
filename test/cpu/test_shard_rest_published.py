"""CPU tier: the shard sweep's bs-16/32 tables (``docs/benchmarks.md`` section 7.6) against their
raw files ``docs/runs/bench_kimi_k25_shard_steps2_bs16_32.json`` and
``bench_kimi_k25_shard_steps3_16k_bs16_32.json`` (upstream's num_steps 3 figures from section 7.2's
``bench_kimi_k25_shard_steps3_sweep.json``).

Failure modes guarded: a table cell edited by hand or left behind by a rerun (a number the raw
rows do not give at the cell's rounding); stored rows that ``bench_verify.build_rows`` would not
compute from the files' own phases (a formula changed after the run); ours' verify steps not all
replays of its graph in the runs the section cites.
"""

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import bench_verify as bv  # noqa: E402

RUNS = os.path.join(ROOT, "docs", "runs")
STEPS2 = os.path.join(RUNS, "bench_kimi_k25_shard_steps2_bs16_32.json")
STEPS3 = os.path.join(RUNS, "bench_kimi_k25_shard_steps3_16k_bs16_32.json")
STEPS3_SWEEP = os.path.join(RUNS, "bench_kimi_k25_shard_steps3_sweep.json")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")


def _load(path):
    with open(path) as f:
        return json.load(f)


def _tables():
    """Section 7.6's two tables as lists of cell lists (first the num_steps 2 one)."""
    text = open(DOC).read()
    sec = text[text.index("### 7.6 "):text.index("## 8. ")]
    tables, cur = [], None
    for ln in sec.splitlines():
        if ln.startswith("| ctx |"):
            cur = []
            tables.append(cur)
        elif cur is not None and re.match(r"\| \d+ \|", ln):
            cur.append([c.strip() for c in ln.strip().strip("|").split("|")])
        elif not ln.startswith("|"):
            cur = None
    return tables


def _same(cell, value):
    """The doc's cell is the raw value at the cell's own number of decimals (half a unit apart)."""
    places = len(cell.split(".")[1]) if "." in cell else 0
    return value is not None and abs(float(cell) - value) <= 0.5 * 10 ** -places + 1e-9


def _pair(cell):
    return [c.strip() for c in cell.split("/")]


@pytest.mark.parametrize("path", [STEPS2, STEPS3])
def test_stored_rows_are_what_build_rows_computes(path):
    a, modes, _ = bv.merge_runs([path])  # the file's own modes, read back as --merge reads an input
    assert bv.build_rows(a, modes) == _load(path)["rows"]


def _check_table(index, path, checks_of):
    """Table ``index`` of section 7.6 has the raw file's points, and every (cell, value) pair
    ``checks_of(cells, row)`` gives agrees at the cell's rounding."""
    rows = {(r["context"], r["bs"]): r for r in _load(path)["rows"]}
    table = _tables()[index]
    assert sorted((int(c[0]), int(c[1])) for c in table) == sorted(rows)
    for c in table:
        bad = [(cell, v) for cell, v in checks_of(c, rows[(int(c[0]), int(c[1]))]) if not _same(cell, v)]
        assert not bad, (c[:2], bad)


def test_the_num_steps_2_table_is_the_raw_file():
    def checks(c, r):
        return [(c[2], r["decode_ms"]), *zip(_pair(c[3]), (r["upstream_verify_ms"], r["ours_verify_ms"])),
                *zip(_pair(c[4]), (r["upstream_verify_per_decode"], r["ours_verify_per_decode"])),
                *zip(_pair(c[5]), (r["upstream_draft_extend_ms"], r["ours_draft_extend_ms"])),
                *zip(_pair(c[6]), (r["upstream_cycle_per_decode"], r["ours_cycle_per_decode"]))]
    _check_table(0, STEPS2, checks)


def test_the_num_steps_3_table_is_the_raw_file():
    """Ours against the same session's plain; upstream in brackets from section 7.2's sweep."""
    sweep = {(r["context"], r["bs"]): r for r in _load(STEPS3_SWEEP)["rows"]}

    def checks(c, r):
        (verify, up_verify), (dext, up_dext) = (re.fullmatch(r"(\S+) \((\S+)\)", c[i]).groups() for i in (3, 5))
        up = sweep[(r["context"], r["bs"])]
        return [(c[2], r["decode_ms"]), (verify, r["ours_verify_ms"]), (c[4], r["ours_verify_per_decode"]),
                (dext, r["ours_draft_extend_ms"]), (c[6], r["ours_cycle_per_decode"]),
                (up_verify, up["upstream_verify_ms"]), (up_dext, up["upstream_draft_extend_ms"])]
    _check_table(1, STEPS3, checks)


def test_ours_replayed_every_verify_step_in_each_run():
    for path in (STEPS2, STEPS3):
        status = _load(path)["meta"]["mode_status"]["ours"]
        runs = re.findall(r"replays=(\d+) verify_steps=(\d+) fallbacks=(\d+)", status)
        assert runs and all(r == v and int(v) > 0 and f == "0" for r, v, f in runs), status
