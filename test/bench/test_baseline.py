"""CPU tier: ``python -m bench verify --plain-twice`` and ``bench/lib/baseline.py``, the plain-decode
baseline measured by two engines in one call.

Failure mode guarded: every verify/decode ratio rests on one plain engine's medians, and one
engine start can read slow at most points (against two earlier
calls with the same flags),
which flatters every ratio of that call without any sign in its own output.
"""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lib import baseline, engine
from bench.verify import child as verify_child
from bench.verify import cli as verify_cli
from bench.verify import table as verify_table


def test_combine_keeps_the_lower_median_and_the_drift():
    assert baseline.combine(1.617, 1.235) == (1.235, -0.2362)
    assert baseline.combine(1.030, 1.040) == (1.03, 0.0097)
    assert baseline.combine(1.2, None) == (1.2, None) and baseline.combine(None, 1.3) == (1.3, None)
    assert baseline.combine(None, None) == (None, None)


def _phase(ctx, bs, decode=None, verify=None):
    roles = {}
    if decode is not None:
        roles["target_decode"] = {"gpu_ms": decode}
    if verify is not None:
        roles["target_verify"] = {"gpu_ms": verify}
    return {"context": ctx, "bs": bs, "e2e_ms_per_step": 1.0, "roles": roles}


def test_rows_use_the_lower_decode_and_the_table_lists_the_drifting_points():
    """Measured slow plain figures (first engine) against two earlier calls' (second)."""
    a = verify_cli.parse_args(["--contexts", "1024,16384", "--batch-sizes", "1", "--steps", "5", "--plain-twice"])
    modes = {"plain": {"phases": [_phase(1024, 1, 1.386), _phase(16384, 1, 1.617)]},
             "plain_end": {"phases": [_phase(1024, 1, 1.031), _phase(16384, 1, 1.619)]},
             "ours": {"phases": [_phase(1024, 1, verify=0.996), _phase(16384, 1, verify=1.216)]}}
    r1k, r16k = verify_table.build_rows(a, modes)
    assert (r1k["decode_ms"], r1k["decode_drift"], r1k["ours_verify_per_decode"]) == (1.031, -0.2561, 0.966)
    assert (r16k["decode_ms"], r16k["decode_drift"]) == (1.617, 0.0012)
    meta = {"model": "kimi-small", "mode_status": {}, "hardware": "h", "versions": {}, "flags": "", "command": "c"}
    table = verify_table.format_table([r1k, r16k], meta)
    assert ("RESULT baseline: plain decode by two engines (plain, plain_end) at 2 points, decode = the lower "
            "median; 1 of them differ by more than 5% (a listed point wants a rerun); 0 points measured by one "
            "engine only") in table
    assert "RESULT baseline ctx=1024 bs=1: 1.386 / 1.031 ms (-25.6%)" in table
    assert "ctx=16384" not in table.split("RESULT baseline:")[1]


def test_the_verdict_does_not_depend_on_which_engine_ran_first():
    # 1.0 vs 0.95 is 5.26% of the lower one either way round: listed whichever engine ran first
    assert baseline.differs(1.0, 0.95) is True and baseline.differs(0.95, 1.0) is True
    assert baseline.differs(1.0, 0.96) is False and baseline.differs(0.96, 1.0) is False
    assert baseline.differs(1.0, 1.06) and baseline.differs(1.06, 1.0)
    assert baseline.combine(0.0, 1.0) == (0.0, None)  # no division by a zero median


def test_a_failed_second_engine_or_a_point_it_missed_is_named():
    """``--plain-twice`` given, but ``plain_end`` died (no figures) or missed a point: the summary
    says so instead of staying silent, and the one-engine points are named."""
    a = verify_cli.parse_args(["--contexts", "1024,8192", "--batch-sizes", "1", "--plain-twice"])
    first = {"phases": [_phase(1024, 1, 1.39), _phase(8192, 1, 1.54)]}
    rows = verify_table.build_rows(a, {"plain": first})
    (line,) = baseline.drift_lines(rows, expected=True)
    assert "at 0 points" in line and "2 points measured by one engine only" in line and "plain_end failed" in line
    assert baseline.drift_lines(rows) == []  # not asked for: nothing printed
    rows = verify_table.build_rows(a, {"plain": first, "plain_end": {"phases": [_phase(1024, 1, 1.03)]}})
    lines = baseline.drift_lines(rows, expected=True)
    assert "at 1 points" in lines[0] and "1 points measured by one engine only" in lines[0]
    assert lines[-1] == "RESULT baseline measured once: ctx=8192 bs=1"
    assert rows[1]["decode_ms"] == 1.54 and rows[1]["decode_drift"] is None


def test_the_plain_e2e_column_takes_the_lower_engine_too():
    a = verify_cli.parse_args(["--contexts", "1024", "--batch-sizes", "1", "--plain-twice"])
    p1, p2 = _phase(1024, 1, 1.39), _phase(1024, 1, 1.03)
    p1["e2e_ms_per_step"], p2["e2e_ms_per_step"] = 1.44, 1.08
    (row,) = verify_table.build_rows(a, {"plain": {"phases": [p1]}, "plain_end": {"phases": [p2]}})
    assert row["plain_e2e_ms_per_step"] == 1.08


def test_plain_twice_is_refused_where_it_times_nothing(capsys):
    from bench import capture as bc

    with pytest.raises(SystemExit) as e:
        verify_cli.parse_args(["--plain-twice", "--capture-only"])
    assert e.value.code == 2 and "--capture-only runs no decode" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bc.parse_args(["--plain-twice"])
    assert e.value.code == 2 and "capture times captures only" in capsys.readouterr().err


def test_dry_run_lists_the_second_plain_engine(tmp_path, capsys):
    assert verify_cli.main(["--dry-run", "--plain-twice", "--model", "llama-small", "--models-dir", str(tmp_path)]) == 0
    out = [ln.split(":")[0] for ln in capsys.readouterr().out.splitlines() if ln.startswith("DRYRUN")]
    assert out == ["DRYRUN ours", "DRYRUN upstream", "DRYRUN plain", "DRYRUN plain_end"]


def test_without_the_second_engine_nothing_changes():
    a = verify_cli.parse_args(["--contexts", "1024", "--batch-sizes", "1"])
    (row,) = verify_table.build_rows(a, {"plain": {"phases": [_phase(1024, 1, 1.03)]}})
    assert row["decode_ms"] == 1.03 and row["decode_drift"] is None and row["decode_ms_second"] is None
    assert baseline.drift_lines([row]) == []


def test_plain_twice_needs_plain(capsys):
    with pytest.raises(SystemExit) as e:
        verify_cli.parse_args(["--modes", "ours,upstream", "--plain-twice"])
    assert e.value.code == 2 and "--plain-twice needs plain in --modes" in capsys.readouterr().err


def test_main_starts_the_second_plain_engine_last(tmp_path, monkeypatch, capsys):
    """The engines replaced by a stand-in that writes each child's JSON: the run order is the
    modes, then ``plain`` again under the key ``plain_end``, and the table lists the drift."""
    started = []

    class FakeEngine:
        def __init__(self, cmd, stdout, stderr, **kw):
            mode, out = cmd[cmd.index("--child") + 1], cmd[cmd.index("--child-out") + 1]
            started.append((mode, os.path.basename(out)))
            second = os.path.basename(out) == "bench_plain_end.json"
            ph = _phase(1024, 1, decode=(1.03 if second else 1.39) if mode == "plain" else None,
                        verify=None if mode == "plain" else {"ours": 1.0, "upstream": 2.3}[mode])
            with open(out, "w") as f:
                json.dump({"mode": mode, "ok": True, "startup_s": 1.0, "phases": [ph]}, f)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(engine.subprocess, "Popen", FakeEngine)
    monkeypatch.setattr(verify_child, "model_paths", lambda a: (None, None))
    monkeypatch.setattr(engine, "hardware", lambda: "stand-in")
    monkeypatch.setattr(engine, "versions", lambda: {})
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["bench_verify.py", "--contexts", "1024", "--batch-sizes", "1",
                                      "--plain-twice", "--out", str(out), "--log-dir", str(tmp_path / "logs")])
    assert verify_cli.main() == 0
    assert started == [("ours", "bench_ours.json"), ("upstream", "bench_upstream.json"),
                       ("plain", "bench_plain.json"), ("plain", "bench_plain_end.json")]
    text = capsys.readouterr().out
    assert "RESULT baseline ctx=1024 bs=1: 1.390 / 1.030 ms (-25.9%)" in text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["decode_ms"] == 1.03 and row["ours_verify_per_decode"] == 0.971
