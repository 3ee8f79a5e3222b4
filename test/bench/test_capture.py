"""CPU tier: ``bench/capture.py``, the repeated-start capture comparison (target:
capture time and graph memory no larger than upstream's).

Failure modes guarded: the capture target judged from one engine start per mode (two single starts
of the same configuration measured 0.79x and 1.17x), one mode always started first (page cache,
the previous engine's teardown), a failed engine silently dropped from the medians, a capture of
several draft lengths mixed into one figure.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import capture as bc
from bench.lib import engine
from bench.verify import child as verify_child

OURS_LINE = ("[t] VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=[1, 2, 4, 8], num_draft_tokens=3 "
             "tokens/request, attention=chain split-KV (MHA), {s} s, {g} GiB\n")
UP_LINE = "[t] Capture target verify CUDA graph end. elapsed={s} s, mem usage={g} GB, avail mem=28.81 GB.\n"


def test_run_order_alternates_which_mode_starts_first():
    assert bc.run_order(["ours", "upstream"], 3) == [
        (0, "ours"), (0, "upstream"), (1, "upstream"), (1, "ours"), (2, "ours"), (2, "upstream")]


def _cap(s, g, kind="ours"):
    return {"kind": kind, "seconds": s, "gib": g}


def _run(rep, mode, cap, ok=True):
    return {"repeat": rep, "mode": mode, "capture": cap, "ok": ok}


def test_summarise_medians_ratios_and_paired_repeats():
    up = "upstream verify"
    runs = [_run(0, "ours", _cap(3.0, 0.10)), _run(0, "upstream", _cap(3.3, 0.17, up)),
            _run(1, "upstream", _cap(3.1, 0.17, up)), _run(1, "ours", _cap(3.4, 0.11)),
            _run(2, "ours", _cap(3.2, 0.11)), _run(2, "upstream", None, ok=False),
            _run(3, "ours", _cap(9.9, 0.5), ok=False)]  # a failed engine with a line: not counted
    s = bc.summarise(runs)
    assert s["modes"]["ours"] == {"n": 3, "median_s": 3.2, "min_s": 3.0, "max_s": 3.4, "median_gib": 0.11,
                                  "median_free_after_gib": None, "seconds": [3.0, 3.4, 3.2]}
    assert s["modes"]["upstream"]["n"] == 2 and s["modes"]["upstream"]["median_s"] == 3.2
    assert s["ours_per_upstream"] == {"time": 1.0, "memory": 0.647, "free_after_diff_gib": None}
    assert s["paired_time"] == [0.909, 1.097]  # repeat 2 has no upstream figure: not paired


def test_summarise_without_upstream_gives_no_ratio():
    s = bc.summarise([_run(0, "ours", _cap(3.0, 0.1)), _run(0, "upstream", None, ok=False)])
    assert s["modes"]["upstream"] == {"n": 0} and "ours_per_upstream" not in s


def test_judge_fails_an_engine_that_exited_badly_or_captured_the_wrong_graph():
    """An ``ours`` engine whose log shows upstream's verify capture: the plugin did not install."""
    assert bc.judge("ours", 0, _cap(3.0, 0.1)) == (True, "rc=0")
    assert bc.judge("ours", 0, _cap(3.0, 0.1, "upstream verify"))[0] is False
    assert "expected 'ours'" in bc.judge("ours", 0, _cap(3.0, 0.1, "upstream verify"))[1]
    assert bc.judge("upstream", 1, _cap(3.0, 0.1, "upstream verify")) == (False, "rc=1")
    assert bc.judge("upstream", "timeout", None) == (False, "rc=timeout")
    assert bc.judge("plain", 0, None) == (False, "rc=0, no capture line")


def test_negative_memory_prints_no_ratio():
    s = bc.summarise([_run(0, "ours", _cap(3.0, -0.9)), _run(0, "upstream", _cap(3.0, 0.17, "upstream verify"))])
    meta = {"model": "m", "steps": 2, "runs": [], "hardware": "-", "versions": {}, "command": "-"}
    assert "time 1.0x, memory -, free after -;" in bc.format_summary(s, meta)


def test_negative_drops_compare_on_free_memory_after_the_target_graphs():
    """Measured on kimi-small (num_steps 2, two starts per mode): both drops read negative
    in every start; the medians of the free memory after the target's graphs are compared."""
    up = "upstream verify"
    runs = [_run(0, "ours", dict(_cap(2.56, -0.557), free_after_gib=29.57)),
            _run(0, "upstream", dict(_cap(3.67, -0.17, up), free_after_gib=29.23)),
            _run(1, "upstream", dict(_cap(3.68, -0.17, up), free_after_gib=29.23)),
            _run(1, "ours", dict(_cap(3.31, -0.557), free_after_gib=29.57))]
    s = bc.summarise(runs)
    assert s["modes"]["ours"]["median_free_after_gib"] == 29.57
    assert s["ours_per_upstream"] == {"time": 0.799, "memory": None, "free_after_diff_gib": 0.34}
    meta = {"model": "kimi-small", "steps": 2, "hardware": "-", "versions": {}, "command": "-",
            "runs": [dict(r, status="rc=0") for r in runs]}
    text = bc.format_summary(s, meta)
    assert "time 0.799x, memory -, free after +0.34 GiB; per repeat: 0.698x, 0.899x" in text
    assert "RESULT run 0 ours: 2.56 s, -0.557 GiB, 29.57 GiB free after (rc=0)" in text
    # one counted start without the figure: no median of it, no difference
    runs[3]["capture"].pop("free_after_gib")
    assert bc.summarise(runs)["ours_per_upstream"]["free_after_diff_gib"] is None


@pytest.mark.parametrize("argv, msg", [(["--steps", "1,2"], "one value per run"),
                                       (["--modes", "ours,eager"], "at most once"),
                                       (["--modes", ","], "(none)"),
                                       (["--modes", "ours,ours"], "at most once"),
                                       (["--repeats", "0"], ">= 1")])
def test_bad_flags_exit_2_naming_the_flag(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bc.parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_main_runs_each_engine_and_fails_on_a_missing_capture(tmp_path, monkeypatch, capsys):
    """The engines replaced by a stand-in that writes each mode's real log line (measured
    figures); the third upstream start logs none and the run must exit 1 with it reported."""
    starts = []

    class FakeEngine:
        def __init__(self, cmd, stdout, stderr, **kw):
            mode = cmd[cmd.index("--child") + 1]
            starts.append((mode, "--capture-only" in cmd))
            n = sum(1 for m, _ in starts if m == mode)
            if mode == "ours":
                stdout.write(OURS_LINE.format(s=f"{3.36 + 0.01 * n:.2f}", g=0.109))
            elif n < 3:
                stdout.write(UP_LINE.format(s=3.16, g=0.17))
            stdout.flush()

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(engine.subprocess, "Popen", FakeEngine)
    monkeypatch.setattr(verify_child, "model_paths", lambda a: None)
    monkeypatch.setattr(engine, "hardware", lambda: "H200 (stand-in)")
    out = tmp_path / "capture.json"
    rc = bc.main(["--repeats", "3", "--out", str(out), "--log-dir", str(tmp_path / "logs"), "--steps", "2"])
    text = capsys.readouterr().out
    assert rc == 1
    assert starts == [("ours", True), ("upstream", True), ("upstream", True), ("ours", True),
                      ("ours", True), ("upstream", True)]
    assert "RESULT capture ours / upstream (medians): time 1.07x, memory 0.641x, free after -; per repeat: 1.066x, 1.07x" in text
    assert "RESULT run 2 upstream: no capture line (rc=0, no capture line, FAILED: not counted)" in text
    assert out.exists()


def test_gpu_job_dry_run_has_the_capture_stage(tmp_path, gpu_job_dry):
    p, summary = gpu_job_dry(timeout=300, STAGES="capture", CAPTURE_ARGS="--repeats 2 --steps 2 --batch-sizes 1,8")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (tmp_path / "gpujob" / "logs" / "capture.log").read_text()
    order = [ln.split(":")[0] for ln in log.splitlines() if ln.startswith("DRYRUN ")]
    assert order == ["DRYRUN 0 ours", "DRYRUN 0 upstream", "DRYRUN 1 upstream", "DRYRUN 1 ours"]
    assert "stages: capture=0" in summary


DRIVER = """
import sys, subprocess
from bench import capture as bc
from bench.lib import engine as lib_engine
from bench.verify import child as verify_child
REAL = subprocess.Popen
n = []
def engine(cmd, stdout, stderr, **kw):
    n.append(1)
    code = "print(%r, flush=True)" % {line!r}
    if len(n) > 1:
        code += "; import time; time.sleep(60)"
    return REAL([sys.executable, "-c", code], stdout=stdout, stderr=stderr)
subprocess.Popen = engine
verify_child.model_paths = lambda a: None
lib_engine.hardware = lambda: "stand-in"
sys.exit(bc.main(["--repeats", "2", "--out", {out!r}, "--log-dir", {logs!r}, "--steps", "2"]))
"""


def test_sigterm_keeps_the_finished_engines(tmp_path):
    """The GPU job's stage limit sends SIGTERM: the engine is killed, the finished runs are printed
    and written (run 0), and the exit code is 124."""
    import json
    import signal
    import time

    out = tmp_path / "c.json"
    drv = tmp_path / "drv.py"
    drv.write_text(DRIVER.format(line=OURS_LINE.format(s="3.36", g=0.109),
                                 out=str(out), logs=str(tmp_path / "logs")))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    p = subprocess.Popen([sys.executable, str(drv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    deadline = time.time() + 60
    while not out.exists() and time.time() < deadline:  # written after run 0
        time.sleep(0.2)
    time.sleep(1.0)  # run 1 (the sleeping engine) has started
    p.send_signal(signal.SIGTERM)
    text = p.communicate(timeout=60)[0]
    assert p.returncode == 124, text[-2000:]
    assert "RESULT run 0 ours: 3.36 s, 0.109 GiB (rc=0)" in text
    data = json.loads(out.read_text())
    assert len(data["meta"]["runs"]) == 1 and data["meta"]["interrupted"].startswith("signal 15")
    assert data["summary"]["modes"]["ours"]["n"] == 1
