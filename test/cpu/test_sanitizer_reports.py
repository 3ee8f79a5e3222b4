"""CPU tier: the compute-sanitizer evidence of the GPU job's ``sanitizer`` stage.

Failure modes guarded:
* a memcheck report without ``ERROR SUMMARY`` taken as clean: a server report has held
  only compute-sanitizer's banner, because the test teardown SIGKILLed the frontend with the
  server (``scripts/memcheck_verdict.py`` must call that ``no_summary``, and ``gpu_job.sh`` must
  fail the stage);
* a wrapped server stopped so that its wrapper cannot finish its report (``server_utils.
  stop_server`` must SIGTERM the server under the wrapper and let the wrapper exit by itself).
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test"))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import memcheck_verdict  # noqa: E402
import server_utils  # noqa: E402

CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
BANNER_ONLY = "========= COMPUTE-SANITIZER\n"
DIRTY = ("========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
         "=========     at chain_verify_stage1+0x1f0\n========= ERROR SUMMARY: 1 error\n")


def _reports(tmp_path, *texts):
    for i, t in enumerate(texts):
        (tmp_path / f"memcheck_server.{100 + i}.txt").write_text(t)
    return str(tmp_path / "memcheck_server")


@pytest.mark.parametrize("texts, want", [
    ((CLEAN,), "ok"),
    ((CLEAN, CLEAN), "ok"),
    ((BANNER_ONLY,), "no_summary"),
    ((CLEAN, BANNER_ONLY), "no_summary"),
    ((DIRTY,), "errors"),
    ((BANNER_ONLY, DIRTY), "errors"),
    (("========= COMPUTE-SANITIZER\n========= Program hit cudaErrorIllegalAddress on CUDA API call\n",),
     "errors"),
    # a target SIGKILLed at the end of SGLang's graceful stop: a tool notice, not a memory error
    (("========= COMPUTE-SANITIZER\n========= Error: process didn't terminate successfully\n"
      "========= ERROR SUMMARY: 0 errors\n",), "ok"),
    (("",), "no_summary"),
])
def test_memcheck_verdict(tmp_path, texts, want):
    v, detail = memcheck_verdict.verdict(_reports(tmp_path, *texts))
    assert v == want, detail
    assert detail.count("memcheck_server.") == len(texts)


def test_memcheck_verdict_absent_and_cli(tmp_path):
    assert memcheck_verdict.verdict(str(tmp_path / "memcheck_kernel"))[0] == "absent"
    prefix = _reports(tmp_path, BANNER_ONLY)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "memcheck_verdict.py"), prefix],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout.startswith("no_summary: memcheck_server.100.txt=no_summary"), r
    (tmp_path / "memcheck_server.100.txt").write_text(CLEAN)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "memcheck_verdict.py"), prefix],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r


# A stand-in compute-sanitizer on PATH for the GPU job's dry run: writes its banner, runs the
# command, then the 0-error summary unless NO_SUMMARY is set (what a killed frontend leaves).
_FAKE_SANITIZER = """#!/bin/bash
LOG=""; while [ $# -gt 0 ]; do case $1 in --log-file) LOG=$2; shift 2;; --*) shift 2;; *) break;; esac; done
LOG=${LOG//%p/$$}; echo "========= COMPUTE-SANITIZER" > "$LOG"; "$@"; rc=$?
[ -n "$NO_SUMMARY" ] || echo "========= ERROR SUMMARY: 0 errors" >> "$LOG"; exit $rc
"""


@pytest.mark.parametrize("no_summary", [False, True])
def test_gpu_job_fails_a_sanitizer_stage_without_summary(tmp_path, no_summary):
    """``DRY_RUN=1 STAGES=sanitizer`` with the stand-in: a report without a summary turns the
    kernel stage into ``memcheck_no_summary`` and the job's exit code into 1; with the summary the
    job passes (the server stage starts no server in a dry run: ``absent`` is tolerated there)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "compute-sanitizer").write_text(_FAKE_SANITIZER)
    (bindir / "compute-sanitizer").chmod(0o755)
    env = dict(os.environ, DRY_RUN="1", BASE=str(tmp_path), STAGES="sanitizer",
               PATH=os.pathsep.join([str(bindir), os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    env.pop("NO_SUMMARY", None)
    if no_summary:
        env["NO_SUMMARY"] = "1"
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_job.sh")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    summary = (tmp_path / "gpujob" / "summary.txt").read_text()
    if no_summary:
        assert p.returncode == 1, summary
        assert "-- sanitizer_kernel memcheck: no_summary: memcheck_kernel." in summary
        assert "stages: sanitizer_kernel=memcheck_no_summary sanitizer_server=0" in summary
    else:
        assert p.returncode == 0, summary + p.stderr[-2000:]
        assert "-- sanitizer_kernel memcheck: ok: memcheck_kernel." in summary
        assert "-- sanitizer_server memcheck: absent:" in summary
        assert "stages: sanitizer_kernel=0 sanitizer_server=0" in summary


# A stand-in for compute-sanitizer: runs its arguments as a child and writes its summary only when
# the child has exited (as the real frontend does), after a second of report work, so that a
# SIGKILL that follows the child's (kill_process_tree kills children first) leaves the banner alone
# however the two kills are scheduled.
_FAKE_WRAPPER = textwrap.dedent("""
    import subprocess, sys, time
    log = sys.argv[1]
    with open(log, "w") as f:
        f.write("========= COMPUTE-SANITIZER\\n"); f.flush()
        rc = subprocess.call(sys.argv[2:])
        time.sleep(1.0)
        f.write(f"========= ERROR SUMMARY: 0 errors\\n")
    sys.exit(rc)
""")
# A launcher between wrapper and server (compute-sanitizer may have one): exits 7 if it gets the
# SIGTERM meant for the server, else passes the server's exit code on.
_FAKE_LAUNCHER = ("import signal, subprocess, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
                  "sys.exit(subprocess.call(sys.argv[1:]))")
# A stand-in server (its argv names sglang.launch_server): exits 0 on SIGTERM (SGLang's graceful
# stop), else sleeps; writes the ready file once its handler is installed.
_FAKE_SERVER = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
                "pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(600)")


def _start(tmp_path, wrapped: bool, launcher: bool = False):
    log, ready = tmp_path / "memcheck_server.1.txt", tmp_path / "ready"
    server = [sys.executable, "-c", _FAKE_SERVER, str(ready), "-m", "sglang.launch_server"]
    inner = [sys.executable, "-c", _FAKE_LAUNCHER, *server] if launcher else server
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_WRAPPER, str(log), *inner])
    proc.verify_graph_wrapped = wrapped
    deadline = time.time() + 30
    while not ready.exists():
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"fake server never became ready (wrapper rc {proc.poll()})")
        time.sleep(0.05)
    return proc, log


@pytest.mark.parametrize("launcher", [False, True])
def test_stop_server_lets_the_wrapper_write_its_summary(tmp_path, monkeypatch, launcher):
    """SIGTERM reaches the server (not a launcher in between), the wrapper exits by itself."""
    monkeypatch.setenv(server_utils.STOP_GRACE_ENV, "20")
    proc, log = _start(tmp_path, wrapped=True, launcher=launcher)
    server_utils.stop_server(proc)
    assert proc.wait(timeout=20) == 0
    assert memcheck_verdict.verdict(str(tmp_path / "memcheck_server"))[0] == "ok", log.read_text()


def test_stop_server_kills_what_outlives_the_grace(tmp_path, monkeypatch):
    """A server that ignores SIGTERM is killed after the grace time, with its whole tree."""
    import psutil

    monkeypatch.setenv(server_utils.STOP_GRACE_ENV, "1")
    monkeypatch.setattr(sys.modules[__name__], "_FAKE_SERVER", _FAKE_SERVER.replace(
        "lambda *a: sys.exit(0)", "signal.SIG_IGN"))
    proc, _ = _start(tmp_path, wrapped=True)
    tree = psutil.Process(proc.pid).children(recursive=True)
    server_utils.stop_server(proc)
    proc.wait(timeout=20)
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, alive


def test_stop_server_unwrapped_kills_at_once(tmp_path):
    """The control: kill_process_tree alone (the old teardown) leaves a report with no summary."""
    proc, log = _start(tmp_path, wrapped=False)
    t0 = time.time()
    server_utils.stop_server(proc)
    proc.wait(timeout=20)
    assert time.time() - t0 < 15
    assert memcheck_verdict.verdict(str(tmp_path / "memcheck_server"))[0] == "no_summary", log.read_text()
