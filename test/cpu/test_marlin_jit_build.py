"""CPU tier: the background build of the Marlin MoE JIT modules (``scripts/build_marlin_jit.py``)
and the shard suites' dry run through ``scripts/gpu_job.sh``.

Failure modes guarded: the builder killed with the stage that started it (the Marlin stage then
builds for minutes inside its own limit); ``wait`` passing a failed build, or hanging with no
builder; a second ``start`` building again what an earlier job built; the Marlin ``.so`` files
not returned in their own file (or dropped from the kernel cache); the shard suite's stages not
all running, or the JIT build started after the plugin install.
"""

import json
import os
import subprocess
import sys
import time

from bench.suites import plan, runner
from bench.suites.spec import Stage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import build_marlin_jit as bmj  # noqa: E402


def _runner(tmp_path, stage):
    st = plan.Settings([stage.name], [stage], dry=False, parallel=False, total_s=500, reserve_s=0,
                       parallel_tmo=520, stagger_s=0, shared_tokens=65536)
    env = dict(os.environ, GPUJOB_DIR=str(tmp_path / "w"), OUT=str(tmp_path / "out"), GPUJOB_T0=str(time.time()))
    return runner.Runner(st, env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def _jit(*args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "build_marlin_jit.py"), *args],
                          capture_output=True, text=True, timeout=180, **kw)


def test_jit_build_start_outlives_its_stage_and_wait_reads_the_marker(tmp_path):
    """``start`` returns at once and leaves the builder in its own session, so the stage's
    process-group kill (and the end of the command) does not stop it; the builder writes its
    marker last; ``wait`` reports it and fails for a failed build; a second ``start`` with a good
    marker builds nothing; ``wait`` with neither marker nor builder builds in the foreground."""
    d = tmp_path / "jit"
    stage = Stage("jitstart", ("python3", "scripts/build_marlin_jit.py", "start", str(d), "nosuch"),
                     "JITSTART_TMO", 60, 1, kind="bench", report="jit")
    r = _runner(tmp_path, stage)
    assert r.run() == 0
    pid = int((d / "nosuch.pid").read_text())
    assert "JIT nosuch: started pid" in (tmp_path / "w" / "summary.txt").read_text()
    t0 = time.time()
    while not (d / "nosuch.json").exists() and time.time() - t0 < 120:
        time.sleep(0.5)
    marker = json.loads((d / "nosuch.json").read_text())  # written by the builder after the stage ended
    assert marker["rc"] == 1 and "unknown JIT module 'nosuch'" in marker["error"]
    assert not _alive(pid)
    w = _jit("wait", str(d), "nosuch")
    assert w.returncode == 1 and "JIT nosuch: FAILED" in w.stdout
    (d / "done.json").write_text(json.dumps({"rc": 0, "seconds": 212.0, "so": {"path": "/c/x.so", "bytes": 2**25,
                                                                             "xz_bytes": 2**23}}))
    again = _jit("start", str(d), "done")
    assert again.returncode == 0 and "built in 212.0s; .so 32.0 MiB (xz 8.0 MiB)" in again.stdout
    assert not (d / "done.pid").exists()
    fg = _jit("wait", str(d), "other")
    assert fg.returncode == 1 and "no marker and no builder: building in the foreground" in fg.stdout
    assert json.loads((d / "other.json").read_text())["rc"] == 1


def test_jit_build_dry_run_and_usage(tmp_path):
    p = _jit("start", str(tmp_path), "--dry-run")
    assert p.returncode == 0 and [ln.split(":")[0] for ln in p.stdout.splitlines()] == [
        f"JIT {m}" for m in bmj.MODULES]
    assert not list(tmp_path.glob("*.pid"))
    assert _jit("build", str(tmp_path)).returncode == 2
    # the runner's old spelling reaches the same script
    old = subprocess.run([sys.executable, "-m", "bench.suites", "--jit-build", "wait", str(tmp_path), "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert old.returncode == 0 and old.stdout.count("DRY_RUN: would wait") == len(bmj.MODULES)


def test_shard_suite_dry_run(tmp_path, gpu_job_dry):
    """``SUITE=shard`` under ``DRY_RUN=1``: gpu_job.sh starts (dry) the JIT build before the plugin
    install, every stage collects or dry-runs, the wrapped shard's engine has the multimodal
    part off."""
    p, summary = gpu_job_dry(timeout=300, SUITE="shard")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert summary.index("jit at ") < summary.index("install: ")
    assert ("stages: shard_jit=0 shard_e2e_triton=0 shard_wrapped=0 shard_jit_wait=0 shard_e2e_marlin=0"
            in summary)
    assert "-- shard_e2e_triton: 6 tests collected" in summary
    logs = tmp_path / "gpujob" / "logs"
    assert "E2E_SERVER_ARGS='--moe-runner-backend triton" in (logs / "shard_e2e_triton.log").read_text()
    wrapped = (logs / "shard_wrapped.log").read_text()
    assert '"enable_multimodal": false' in wrapped and "kimi-k25-shard-wrapped" in wrapped


def test_the_marlin_jit_modules_travel_in_their_own_file(tmp_path, gpu_job_dry):
    """A bundle's ``marlin_jit.tar.xz`` is restored into the kernel cache; the job returns the
    Marlin .so files as ``marlin_jit.tar.xz`` and keeps them (and JIT build intermediates) out of
    ``jitcache.tar.xz``."""
    import tarfile

    src = tmp_path / "src"
    mod = src / "jitcache" / "sgl_kernel_jit_moe_wna16_marlin_bf16_t_0__arch_9.0a__tvmffi_0.1.11"
    mod.mkdir(parents=True)
    (mod / "sgl_kernel_jit_moe_wna16_marlin_bf16_t_0.so").write_bytes(b"\x7fELF" + b"0" * 4096)
    (mod / "main.o").write_bytes(b"o")
    (src / "jitcache" / "other").mkdir()
    (src / "jitcache" / "other" / "x.so").write_bytes(b"x")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    with tarfile.open(bundle / "marlin_jit.tar.xz", "w:xz") as t:
        t.add(src / "jitcache", arcname="jitcache")
    p, summary = gpu_job_dry(timeout=300, SUITE="kernel", BUNDLE=str(bundle))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "restored the Marlin JIT modules" in summary and "marlin_jit.tar.xz 0 MiB (.so: jitcache/" in summary
    out = tmp_path / "gpujob_out"
    with tarfile.open(out / "marlin_jit.tar.xz") as t:
        assert t.getnames() == [f"jitcache/{mod.name}/sgl_kernel_jit_moe_wna16_marlin_bf16_t_0.so"]
    with tarfile.open(out / "jitcache.tar.xz") as t:
        names = t.getnames()
    assert "jitcache/other/x.so" in names and not [n for n in names if "marlin" in n or n.endswith(".o")]
