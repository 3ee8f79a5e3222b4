"""CPU tier: ``bench_verify.py --plain-twice`` and ``benchmark/baseline.py``, the plain-decode
baseline measured by two engines in one call.

Failure mode guarded: every verify/decode ratio rests on one plain engine's medians, and one
engine start can read slow at most points (run 12 call 4: 8-34% at 11 of 18 points against calls 2
and 3, e.g. 16k bs 1 1.617 ms against 1.233 and 1.237; ``docs/benchmarks.md`` section 10.2), which
flatters every ratio of that call without any sign in its own output.
"""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import baseline  # noqa: E402
import bench_verify as bv  # noqa: E402


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
    """Run 12 call 4's slow plain figures (first engine) against calls 2-3's (second)."""
    a = bv.parse_args(["--contexts", "1024,16384", "--batch-sizes", "1", "--steps", "5", "--plain-twice"])
    modes = {"plain": {"phases": [_phase(1024, 1, 1.386), _phase(16384, 1, 1.617)]},
             "plain_end": {"phases": [_phase(1024, 1, 1.031), _phase(16384, 1, 1.619)]},
             "ours": {"phases": [_phase(1024, 1, verify=0.996), _phase(16384, 1, verify=1.216)]}}
    r1k, r16k = bv.build_rows(a, modes)
    assert (r1k["decode_ms"], r1k["decode_drift"], r1k["ours_verify_per_decode"]) == (1.031, -0.2561, 0.966)
    assert (r16k["decode_ms"], r16k["decode_drift"]) == (1.617, 0.0012)
    meta = {"model": "kimi-small", "mode_status": {}, "hardware": "h", "versions": {}, "flags": "", "command": "c"}
    table = bv.format_table([r1k, r16k], meta)
    assert "RESULT baseline: plain decode measured by two engines (plain, plain_end); decode = the lower median; " \
           "1 of 2 points differ by more than 5%" in table
    assert "RESULT baseline ctx=1024 bs=1: 1.386 / 1.031 ms (-25.6%)" in table
    assert "ctx=16384" not in table.split("RESULT baseline:")[1]


def test_without_the_second_engine_nothing_changes():
    a = bv.parse_args(["--contexts", "1024", "--batch-sizes", "1"])
    (row,) = bv.build_rows(a, {"plain": {"phases": [_phase(1024, 1, 1.03)]}})
    assert row["decode_ms"] == 1.03 and row["decode_drift"] is None and row["decode_ms_second"] is None
    assert baseline.drift_lines([row]) == []


def test_plain_twice_needs_plain(capsys):
    with pytest.raises(SystemExit) as e:
        bv.parse_args(["--modes", "ours,upstream", "--plain-twice"])
    assert e.value.code == 2 and "--plain-twice needs plain in --modes" in capsys.readouterr().err


def test_main_starts_the_second_plain_engine_last(tmp_path, monkeypatch, capsys):
    """The engines replaced by a stand-in that writes each child's JSON: the run order is the
    modes, then ``plain`` again under the key ``plain_end``, and the table lists the drift."""
    started = []

    class FakeEngine:
        def __init__(self, cmd, stdout, stderr):
            mode, out = cmd[cmd.index("--child") + 1], cmd[cmd.index("--child-out") + 1]
            started.append((mode, os.path.basename(out)))
            second = os.path.basename(out) == "bench_plain_end.json"
            ph = _phase(1024, 1, decode=(1.03 if second else 1.39) if mode == "plain" else None,
                        verify=None if mode == "plain" else {"ours": 1.0, "upstream": 2.3}[mode])
            with open(out, "w") as f:
                json.dump({"mode": mode, "ok": True, "startup_s": 1.0, "phases": [ph]}, f)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(bv.subprocess, "Popen", FakeEngine)
    monkeypatch.setattr(bv, "model_paths", lambda a: (None, None))
    monkeypatch.setattr(bv, "_hardware", lambda: "stand-in")
    monkeypatch.setattr(bv, "_versions", lambda: {})
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["bench_verify.py", "--contexts", "1024", "--batch-sizes", "1",
                                      "--plain-twice", "--out", str(out), "--log-dir", str(tmp_path / "logs")])
    assert bv.main() == 0
    assert started == [("ours", "bench_ours.json"), ("upstream", "bench_upstream.json"),
                       ("plain", "bench_plain.json"), ("plain", "bench_plain_end.json")]
    text = capsys.readouterr().out
    assert "RESULT baseline ctx=1024 bs=1: 1.390 / 1.030 ms (-25.9%)" in text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["decode_ms"] == 1.03 and row["ours_verify_per_decode"] == 0.971
