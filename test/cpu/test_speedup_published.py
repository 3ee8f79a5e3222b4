"""CPU tier: the measured speed-up tables of ``docs/benchmarks.md`` section 12 against their raw
file ``docs/runs/speedup_llama8b_pair.json``.

Failure modes guarded: a published table edited by hand or left behind by a rerun (a number in the
doc that the raw file does not give); rows or advisor predictions in the raw file that the current
``speedup_report`` would not compute from the file's own per-phase measurements (a formula changed
after the run, or the stored rows not those of the phases); an output or verify-count mismatch in
the run that the doc's "checks" paragraph would hide.
"""

import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import speedup_report as sr  # noqa: E402

RAW = os.path.join(ROOT, "docs", "runs", "speedup_llama8b_pair.json")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")


@pytest.fixture(scope="module")
def raw():
    with open(RAW) as f:
        return json.load(f)


def _section12_tables():
    text = open(DOC).read()
    sec = text[text.index("## 12. Measured speed-up"):]
    speed, adv = [], []
    for ln in sec.splitlines():
        cells = [c.strip().strip("*") for c in ln.strip().strip("|").split("|")]
        if not re.fullmatch(r"(1024|8192)", cells[0] if cells else ""):
            continue
        if len(cells) == 9:
            speed.append(cells)
        elif len(cells) == 6 and "," in cells[3]:
            adv.append(cells)
    return speed, adv


def test_stored_rows_are_what_the_report_computes_from_the_phases(raw):
    assert sr.build_rows(raw["modes"]) == raw["rows"]
    assert sr.advisor_rows(raw["rows"], 3) == raw["advisor"]
    assert sr.check_outputs(raw["modes"]) == [] and raw["output_checks"] == []


def test_every_request_matched_the_pair_and_ours_replayed_every_verify(raw):
    for mode in ("upstream", "ours"):
        phases = raw["modes"][mode]["phases"]
        assert len(phases) == 24
        assert sum(p["outputs_match"] for p in phases) == sum(p["bs"] for p in phases) == 168
        assert all(h == p["predicted_histogram"] for p in phases for h in p["histogram"])
    after = raw["modes"]["ours"]["plugin_after"]
    assert after["replays"] == after["verify_steps"] > 0 and after["fallback_total"] == 0 and not after["fallbacks"]
    assert after["draft_extend"]["replays"] == after["replays"] and after["draft_extend"]["eager"] == 0


def test_the_speedup_table_is_the_raw_files(raw):
    speed, _ = _section12_tables()
    assert len(speed) == len(raw["rows"]) == 24
    for cells, row in zip(speed, raw["rows"]):
        assert (int(cells[0]), int(cells[1])) == (row["context"], row["bs"])
        sp = row["speedup"]
        assert [float(c) for c in cells[6:9]] == [round(sp[k], 2) for k in
                                                   ("ours_over_plain", "upstream_over_plain", "ours_over_upstream")]
        for col, mode in ((3, "plain"), (4, "upstream"), (5, "ours")):
            req, srv = (float(x) for x in cells[col].split("/"))
            m = row[mode]
            assert (req, srv) == (round(m["decode_request_tok_s"], 1), round(m["decode_server_tok_s"]))


def test_the_advisor_table_is_the_raw_files(raw):
    _, adv = _section12_tables()
    by = {(a["context"], a["bs"], a["cls"], a["mode"]): a for a in raw["advisor"]}
    keys = sorted({(a["context"], a["cls"], a["bs"]) for a in raw["advisor"]})
    assert len(adv) == len(keys) == 24
    worst = 0.0
    for cells, (ctx, cls, b) in zip(adv, keys):
        assert (int(cells[0]), int(cells[1])) == (ctx, b)
        assert float(cells[2]) == round(by[(ctx, b, cls, "ours")]["accept_length"], 2)
        gaps = []
        for col, mode in ((3, "upstream"), (4, "ours")):
            a = by[(ctx, b, cls, mode)]
            cyc, pm = cells[col].split(",")
            pred, meas = (float(x) for x in pm.split("/"))
            assert (float(cyc), pred, meas) == (round(a["cycle_ms"], 2), round(a["predicted"], 3),
                                                round(a["measured"], 3))
            gaps.append(a["gap_pct"])
        big = max(gaps, key=abs)
        assert float(cells[5].rstrip("%")) == big
        worst = max(worst, abs(big))
    assert worst <= 10.0  # the doc says no gap exceeds 10%


def test_the_kv_splits_table_is_the_two_raw_files(raw):
    with open(os.path.join(ROOT, "docs", "runs", "speedup_llama8b_plain_kv_splits32.json")) as f:
        tuned = json.load(f)
    assert '"triton_attention_num_kv_splits":32' in tuned["meta"]["command"]
    text = open(DOC).read()
    sec = text[text.index("**The plain baseline's KV splits.**"):text.index("**The advisor against the measurement.**")]
    rows = [[c.strip().strip("*") for c in ln.strip().strip("|").split("|")] for ln in sec.splitlines()
            if re.match(r"\| (1024|8192) \|", ln)]
    plain8 = {(p["context"], p["bs"]): p for p in raw["modes"]["plain"]["phases"]}
    plain32 = {(p["context"], p["bs"]): p for p in tuned["modes"]["plain"]["phases"]}
    ours = {(r["context"], r["bs"]): r["ours"] for r in raw["rows"] if r["cls"] == 1}
    t32 = {(r["context"], r["bs"]): r["plain"] for r in tuned["rows"]}
    assert len(rows) == len(plain32) == 6
    for cells in rows:
        key = (int(cells[0]), int(cells[1]))
        dec = [float(x) for x in cells[2].split("/")]
        assert dec == [round(plain8[key]["roles"]["target_decode"]["gpu_ms"], 2),
                       round(plain32[key]["roles"]["target_decode"]["gpu_ms"], 2)]
        tok = [float(x) for x in cells[3].split("/")]
        assert tok[1] == round(t32[key]["decode_request_tok_s"], 1)
        sp = [float(x.strip().strip("*")) for x in cells[4].split("/")]
        assert sp[1] == round(ours[key]["decode_server_tok_s"] / t32[key]["decode_server_tok_s"], 2)


@pytest.mark.parametrize("doc", ["README.md", os.path.join("docs", "upstream_pr.md")])
def test_the_accept_two_rows_of_the_readme_and_the_pr_text_are_the_raw_files(raw, doc):
    text = open(os.path.join(ROOT, doc)).read()
    rows = {(r["context"], r["bs"]): r["speedup"] for r in raw["rows"] if r["cls"] == 1}
    seen = 0
    for ln in text.splitlines():
        m = re.match(r"\| 2\.0 \| (1k|8k|1024|8192) \| (\d+) \| \*\*([\d.]+)\*\*[^|]*\| ([\d.]+) \| ([\d.]+) \|", ln)
        if not m:
            continue
        ctx = {"1k": 1024, "8k": 8192}.get(m.group(1)) or int(m.group(1))
        sp = rows[(ctx, int(m.group(2)))]
        assert [float(m.group(i)) for i in (3, 4, 5)] == [
            round(sp[k], 2) for k in ("ours_over_plain", "upstream_over_plain", "ours_over_upstream")], ln
        seen += 1
    assert seen >= 4
