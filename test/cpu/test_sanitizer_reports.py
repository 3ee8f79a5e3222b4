"""CPU tier: the compute-sanitizer evidence of the GPU job's ``sanitizer`` stage (issue #6 item 1).

Failure modes guarded:
* a memcheck report without ``ERROR SUMMARY`` taken as clean: run 10 call 2's server report held
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


def test_gpu_job_fails_a_sanitizer_stage_without_summary():
    """The stage's RC becomes memcheck_<verdict> unless the verdict is ok."""
    src = open(os.path.join(ROOT, "scripts", "gpu_job.sh")).read()
    assert 'python3 scripts/memcheck_verdict.py "$LOGS/memcheck_${k#sanitizer_}"' in src
    assert "case $v in ok:*) ;; *) RC[$k]=memcheck_${v%%:*} ;; esac" in src


# A stand-in for compute-sanitizer: runs its arguments as a child and writes its summary only when
# the child has exited (as the real frontend does); SIGKILL leaves the banner alone.
_FAKE_WRAPPER = textwrap.dedent("""
    import subprocess, sys
    log = sys.argv[1]
    with open(log, "w") as f:
        f.write("========= COMPUTE-SANITIZER\\n"); f.flush()
        rc = subprocess.call(sys.argv[2:])
        f.write(f"========= ERROR SUMMARY: 0 errors\\n")
    sys.exit(rc)
""")
# A stand-in server: exits 0 on SIGTERM (SGLang's graceful stop), else sleeps.
_FAKE_SERVER = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(600)"


def _start(tmp_path, wrapped: bool):
    log = tmp_path / "memcheck_server.1.txt"
    proc = subprocess.Popen([sys.executable, "-c", _FAKE_WRAPPER, str(log), sys.executable, "-c", _FAKE_SERVER])
    proc.verify_graph_wrapped = wrapped
    deadline = time.time() + 20
    import psutil
    while time.time() < deadline and not psutil.Process(proc.pid).children():
        time.sleep(0.05)
    return proc, log


def test_stop_server_lets_the_wrapper_write_its_summary(tmp_path, monkeypatch):
    monkeypatch.setenv(server_utils.STOP_GRACE_ENV, "20")
    proc, log = _start(tmp_path, wrapped=True)
    server_utils.stop_server(proc)
    assert proc.wait(timeout=20) == 0
    assert memcheck_verdict.verdict(str(tmp_path / "memcheck_server"))[0] == "ok", log.read_text()


def test_stop_server_unwrapped_kills_at_once(tmp_path):
    """The control: kill_process_tree alone (the old teardown) leaves a report with no summary."""
    proc, log = _start(tmp_path, wrapped=False)
    t0 = time.time()
    server_utils.stop_server(proc)
    proc.wait(timeout=20)
    assert time.time() - t0 < 15
    assert memcheck_verdict.verdict(str(tmp_path / "memcheck_server"))[0] == "no_summary", log.read_text()
