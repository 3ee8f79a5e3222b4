"""CPU tier: ``benchmark/bench_capture.py``, the repeated-start capture comparison (issue #4
target: capture time and graph memory no larger than upstream's).

Failure modes guarded: the capture target judged from one engine start per mode (run 8 and run 10
measured the same configuration as 0.79x and 1.17x), one mode always started first (page cache,
the previous engine's teardown), a failed engine silently dropped from the medians, a capture of
several draft lengths mixed into one figure.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import bench_capture as bc  # noqa: E402

OURS_LINE = ("[t] VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=[1, 2, 4, 8], num_draft_tokens=3 "
             "tokens/request, attention=chain split-KV (MHA), {s} s, {g} GiB\n")
UP_LINE = "[t] Capture target verify CUDA graph end. elapsed={s} s, mem usage={g} GB, avail mem=28.81 GB.\n"


def test_run_order_alternates_which_mode_starts_first():
    assert bc.run_order(["ours", "upstream"], 3) == [
        (0, "ours"), (0, "upstream"), (1, "upstream"), (1, "ours"), (2, "ours"), (2, "upstream")]


def _cap(s, g, kind="ours"):
    return {"kind": kind, "seconds": s, "gib": g}


def test_summarise_medians_ratios_and_paired_repeats():
    runs = [{"repeat": 0, "mode": "ours", "capture": _cap(3.0, 0.10)},
            {"repeat": 0, "mode": "upstream", "capture": _cap(3.3, 0.17, "upstream verify")},
            {"repeat": 1, "mode": "upstream", "capture": _cap(3.1, 0.17, "upstream verify")},
            {"repeat": 1, "mode": "ours", "capture": _cap(3.4, 0.11)},
            {"repeat": 2, "mode": "ours", "capture": _cap(3.2, 0.11)},
            {"repeat": 2, "mode": "upstream", "capture": None}]
    s = bc.summarise(runs)
    assert s["modes"]["ours"] == {"n": 3, "median_s": 3.2, "min_s": 3.0, "max_s": 3.4, "median_gib": 0.11,
                                  "seconds": [3.0, 3.4, 3.2]}
    assert s["modes"]["upstream"]["n"] == 2 and s["modes"]["upstream"]["median_s"] == 3.2
    assert s["ours_per_upstream"] == {"time": 1.0, "memory": 0.647}
    assert s["paired_time"] == [0.909, 1.097]  # repeat 2 has no upstream figure: not paired


def test_summarise_without_upstream_gives_no_ratio():
    s = bc.summarise([{"repeat": 0, "mode": "ours", "capture": _cap(3.0, 0.1)},
                      {"repeat": 0, "mode": "upstream", "capture": None}])
    assert s["modes"]["upstream"] == {"n": 0} and "ours_per_upstream" not in s


@pytest.mark.parametrize("argv, msg", [(["--steps", "1,2"], "one value per run"),
                                       (["--modes", "ours,eager"], "unknown mode"),
                                       (["--repeats", "0"], ">= 1")])
def test_bad_flags_exit_2_naming_the_flag(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bc.parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_main_runs_each_engine_and_fails_on_a_missing_capture(tmp_path, monkeypatch, capsys):
    """The engines replaced by a stand-in that writes each mode's real log line (run 11's
    figures); the third upstream start logs none and the run must exit 1 with it reported."""
    starts = []

    class FakeEngine:
        def __init__(self, cmd, stdout, stderr):
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

    monkeypatch.setattr(bc.subprocess, "Popen", FakeEngine)
    monkeypatch.setattr(bc.bv, "model_paths", lambda a: None)
    monkeypatch.setattr(bc.bv, "_hardware", lambda: "H200 (stand-in)")
    out = tmp_path / "capture.json"
    rc = bc.main(["--repeats", "3", "--out", str(out), "--log-dir", str(tmp_path / "logs"), "--steps", "2"])
    text = capsys.readouterr().out
    assert rc == 1
    assert starts == [("ours", True), ("upstream", True), ("upstream", True), ("ours", True),
                      ("ours", True), ("upstream", True)]
    assert "RESULT capture ours / upstream (medians): time 1.07x, memory 0.641x; per repeat: 1.066x, 1.07x" in text
    assert "RESULT run 2 upstream: no capture line (rc=0)" in text
    assert out.exists()


def test_gpu_job_dry_run_has_the_capture_stage(tmp_path):
    env = dict(os.environ, DRY_RUN="1", BASE=str(tmp_path), STAGES="capture",
               CAPTURE_ARGS="--repeats 2 --steps 2 --batch-sizes 1,8",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("PARALLEL", None)
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_job.sh")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (tmp_path / "gpujob" / "logs" / "capture.log").read_text()
    order = [ln.split(":")[0] for ln in log.splitlines() if ln.startswith("DRYRUN ")]
    assert order == ["DRYRUN 0 ours", "DRYRUN 0 upstream", "DRYRUN 1 upstream", "DRYRUN 1 ours"]
    assert "stages: capture=0" in (tmp_path / "gpujob" / "summary.txt").read_text()
