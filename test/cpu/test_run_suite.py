"""CPU tier: the GPU suite declaration and its runner (``test/run_suite.py``, called by
``scripts/gpu_job.sh``).

Failure modes guarded: a suite without a purpose or an estimated time, or one that names a test
file or script that is not there (the GPU call then spends minutes to find out); a typo in
``SUITE`` running nothing, or something else, instead of stopping with one line naming the valid
suites; a bad number in a limit variable; a stage that outlives its limit, or leaves processes
behind that hold the GPU for the next stage; a stage started with less budget than it needs
left, so packing runs past the 10-minute call; ``-NAME`` or the suites' own budget not applied.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test"))
import run_suite as rs  # noqa: E402

# what each suite must run: the test files and scripts, by purpose
WANT_FILES = {
    "demo": {"bench/demo/cli.py"},
    "kernel": {"test/gpu/test_chain_kernel_gpu.py"},
    "selftest": {"test/gpu/test_runner_selftest.py"},
    "e2e": {"test/e2e/test_server_e2e.py"},
    "mla": {"test/gpu/test_runner_selftest.py", "test/gpu/test_kimi_k25_engine.py", "test/e2e/test_server_e2e.py"},
    "reliability": {"test/e2e/test_accept_length_e2e.py", "test/e2e/test_reliability_e2e.py",
                    "test/gpu/test_chain_kernel_gpu.py", "test/gpu/test_runner_selftest.py"},
    "profile": {"test/e2e/test_profile_e2e.py"},
    "accept_attn": {"test/e2e/test_accept_attention_e2e.py", "test/gpu/test_runner_selftest.py"},
    "bench": {"bench/verify.py"},
    "speedup": {"bench/speedup.py"},
    "kbench": {"bench/kernel.py"},
    "capture": {"bench/capture.py"},
    "shard_triton": {"test/run_suite.py", "test/e2e/test_server_e2e.py"},
    "shard_marlin": {"test/run_suite.py", "test/e2e/test_server_e2e.py"},
    "shard_wrapped": {"bench/verify.py"},
    "shard": {"test/run_suite.py", "test/e2e/test_server_e2e.py", "bench/verify.py"},
    "shard_bench": {"bench/verify.py"},
    "shard_bench_lean": {"bench/verify.py"},
    "shard_floor": {"bench/verify.py", "bench/parts.py"},
    "shard_capture": {"bench/capture.py"},
    "shard_rest_wide": {"bench/verify.py"},
    "shard_rest_16k": {"bench/verify.py"},
    "shard_rest_16k_up": {"bench/verify.py"},
}
SHARD_SUITES = {n for n in WANT_FILES if n.startswith("shard")}


@pytest.mark.parametrize("name", list(rs.SUITES))
def test_every_suite_has_a_purpose_an_estimate_and_existing_files(name):
    suite = rs.SUITES[name]
    assert len(suite.purpose) > 20, suite.purpose
    assert suite.est_s > 0
    stages = rs._suite_stages(name, {})
    assert stages, name
    for s in stages:
        assert s.est_s > 0 and s.tmo_s > 0 and s.tmo_env.endswith("_TMO"), s.name
        assert s.files, f"{s.name} runs no test file or script"
        for f in s.files:
            assert os.path.isfile(os.path.join(ROOT, f)), f"{name}/{s.name}: {f} does not exist"


def test_the_suites_run_what_their_purpose_names():
    got = {n: {f for s in rs._suite_stages(n, {}) for f in s.files} for n in rs.SUITES if n != "all"}
    assert got == WANT_FILES
    # the NaN variant of the self-test is in selftest; compute-sanitizer in reliability
    assert [s.name for s in rs._suite_stages("selftest", {})] == ["selftest", "nan"]
    assert dict(rs._suite_stages("selftest", {})[1].env)["VERIFY_GRAPH_SELFTEST_NAN"] == "1"
    assert {s.memcheck for s in rs._suite_stages("reliability", {})} == {"", "kernel", "server"}


def test_all_is_every_suite_but_capture_one_at_a_time():
    every = [s.name for n in rs.SUITES if n not in ("all", "capture", *SHARD_SUITES) for s in rs._suite_stages(n, {})]
    got = [s.name for s in rs._suite_stages("all", {})]
    assert sorted(got) == sorted(every) and len(set(got)) == len(got)
    assert not rs.SUITES["all"].parallel
    assert rs.SUITES["all"].est_s == sum(s.est_s for s in rs._suite_stages("all", {}))


def test_names_say_what_a_thing_does():
    """Suite and stage names by purpose: none named after an issue or a run."""
    names = list(rs.SUITES) + list(rs._UNITS) + [s.name for n in rs.SUITES for s in rs._suite_stages(n, {})]
    bad = [n for n in names if re.search(r"issue|run\d|^\d|#", n)]
    assert not bad, bad
    with open(os.path.join(ROOT, "scripts", "gpu_job.sh")) as f:
        job = f.read()
    with open(os.path.join(ROOT, "test", "run_suite.py")) as f:
        runner = f.read()
    for text in (job, runner):
        assert not re.search(r"issue ?#?\d|\brun \d+\b|#\d", text), re.findall(r"issue ?#?\d|\brun \d+\b|#\d", text)


def test_unknown_suite_is_one_line_naming_the_valid_suites():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "test", "run_suite.py"), "kernel", "e2ee"],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, DRY_RUN="1"))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unknown suite 'e2ee'" in lines[0]
    for name in rs.SUITES:
        assert name in lines[0], name


def test_gpu_job_stops_on_an_unknown_suite_before_the_setup(tmp_path):
    """gpu_job.sh refuses a name that is not a suite or stage with the runner's one line, before
    it untars or installs anything."""
    env = dict(os.environ, DRY_RUN="1", BASE=str(tmp_path), SUITE="selftests",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_job.sh")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        f"run_suite.py: unknown suite 'selftests' (SUITE=\"selftests\"): {rs.valid_names_line()}"]
    assert not (tmp_path / "gpujob").exists() and not (tmp_path / "site").exists()


@pytest.mark.parametrize("env, fragment", [
    ({"TOTAL_S": "ten"}, "TOTAL_S='ten': want a whole number >= 1"),
    ({"E2E_TMO": "-3"}, "E2E_TMO='-3': want a whole number >= 1"),
    ({"PARALLEL": "yes"}, "PARALLEL='yes': want 1"),
    ({"GPU_TMO": "100"}, "GPU_TMO is no longer read: use KERNEL_TMO and SELFTEST_TMO"),
])
def test_bad_setting_is_one_line_naming_it(env, fragment):
    with pytest.raises(rs.SuiteError) as ei:
        rs.settings(["e2e"], env)
    assert fragment in str(ei.value) and "\n" not in str(ei.value)


def test_leaving_out_and_the_suite_budget():
    """``reliability`` named whole defaults TOTAL_S to its 1000 s and runs at once; ``-sanitizer``
    leaves compute-sanitizer out (the part that fits one 10-minute call: default budget)."""
    whole = rs.settings(["reliability"], {})
    assert whole.parallel and whole.total_s == 1000
    assert [s.name for s in whole.plan][-2:] == ["sanitizer_kernel", "sanitizer_server"]
    part = rs.settings(["reliability", "-sanitizer"], {})
    assert part.total_s == rs.DEFAULT_TOTAL_S
    assert not any(s.memcheck for s in part.plan) and len(part.plan) == 6
    assert rs.settings(["reliability"], {"TOTAL_S": "565"}).total_s == 565
    assert not rs.settings(["reliability"], {"PARALLEL": "0"}).parallel
    assert not rs.settings(["kernel", "e2e"], {}).parallel
    # a stage named twice runs once
    assert [s.name for s in rs.settings(["kernel", "all"], {}).plan].count("kernel") == 1


def test_bench_is_quick_unless_bench_args_is_set():
    bench = rs._UNITS["bench"]
    r = rs.Runner.__new__(rs.Runner)
    r.st, r.logs, r.work, r.models, r.jit = rs.settings(["bench"], {}), "/l", "/w", "/m", "/j"
    r.environ = {}
    assert r.argv(bench)[-1] == "--quick"
    r.environ = {"BENCH_ARGS": "--contexts 1024 --modes ours,upstream"}
    assert r.argv(bench)[-4:] == ["--contexts", "1024", "--modes", "ours,upstream"] and "--quick" not in r.argv(bench)
    r.environ = {"BENCH_ARGS": ""}  # set and empty: bench_verify.py's own full default
    assert r.argv(bench)[-1] == "150"


def _runner(tmp_path, stage, total_s=500, reserve_s=0):
    st = rs.Settings([stage.name], [stage], dry=False, parallel=False, total_s=total_s, reserve_s=reserve_s,
                     parallel_tmo=520, stagger_s=0, shared_tokens=65536)
    env = dict(os.environ, GPUJOB_DIR=str(tmp_path / "w"), OUT=str(tmp_path / "out"), GPUJOB_T0=str(time.time()))
    return rs.Runner(st, env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


# the stage's command: starts a grandchild (ignores SIGTERM, sleeps 120 s), writes its pid, then
# sleeps SECONDS itself
_SPAWN = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
          "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']); "
          "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(float(sys.argv[2]))")


def test_leftovers_of_a_stage_are_killed(tmp_path):
    """A stage that exits 0 but leaves a process running: the process group is killed after it."""
    pidfile = tmp_path / "pid"
    stage = rs.Stage("leaves", ("python3", "-c", _SPAWN, str(pidfile), "0"), "LEAVES_TMO", 60, 1, kind="bench")
    r = _runner(tmp_path, stage)
    assert r.run() == 0
    assert r.rc["leaves"] == 0
    assert not _alive(int(pidfile.read_text()))


def test_a_stage_past_its_limit_is_stopped(tmp_path):
    pidfile = tmp_path / "pid"
    stage = rs.Stage("hangs", ("python3", "-c", _SPAWN, str(pidfile), "120"), "HANGS_TMO", 2, 1, kind="bench")
    r = _runner(tmp_path, stage)
    t0 = time.time()
    assert r.run() == 1
    assert r.rc["hangs"] == 124 and time.time() - t0 < 60
    assert not _alive(int(pidfile.read_text()))
    assert re.search(r"== stage hangs: rc=124 in \d+s \(limit 2s\) TIMED OUT", (tmp_path / "w" / "summary.txt").read_text())


def test_the_budget_caps_limits_and_skips_stages(tmp_path):
    """No stage runs past TOTAL_S - RESERVE_S: the limit is cut to what is left, and a stage with
    under 30 s left is skipped, which fails the job."""
    stage = rs.Stage("quick", ("python3", "-c", "pass"), "QUICK_TMO", 500, 1, kind="bench")
    r = _runner(tmp_path, stage, total_s=100, reserve_s=10)
    assert r.run() == 0
    assert "== stage quick: rc=0" in (tmp_path / "w" / "summary.txt").read_text()
    assert any(f"(limit {n}s)" in (tmp_path / "w" / "summary.txt").read_text() for n in (88, 89, 90))
    r = _runner(tmp_path, stage, total_s=100, reserve_s=75)
    assert r.run() == 1
    assert r.rc["quick"] == "skipped"
    assert re.search(r"== stage quick: SKIPPED \(2[45]s left of TOTAL_S=100\)", (tmp_path / "w" / "summary.txt").read_text())


def test_bench_suite_dry_run_is_quick(tmp_path, gpu_job_dry):
    """``SUITE=bench`` under ``DRY_RUN=1``: bench_verify.py --dry-run --quick prints the three
    engines' kwargs on the small model; no pytest-result line for it."""
    p, summary = gpu_job_dry(timeout=300, SUITE="bench")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "stages: bench=0" in summary and "-- bench:" not in summary
    log = (tmp_path / "gpujob" / "logs" / "bench.log").read_text()
    lines = [ln for ln in log.splitlines() if ln.startswith("DRYRUN ")]
    assert [ln.split(":")[0] for ln in lines] == ["DRYRUN ours", "DRYRUN upstream", "DRYRUN plain"], log
    assert all("llama-small" in ln for ln in lines), log


# ------------------------------------------------------------------------------ the shard suites
def test_shard_suites_one_server_at_a_time_and_what_they_set():
    """The shard's e2e stages run alone (72 GiB per server), with the shard's model, vocabulary,
    num_steps 3, 16 x 64-token parity and the MoE backend each names; the Marlin one waits for the
    JIT build first; each two-call half fits one 10-minute call by its own budget."""
    tri = [s.name for s in rs._suite_stages("shard_triton", {})]
    mar = [s.name for s in rs._suite_stages("shard_marlin", {})]
    assert tri == ["shard_jit", "shard_e2e_triton"] and mar == ["shard_jit_wait", "shard_e2e_marlin"]
    assert [s.name for s in rs._suite_stages("shard", {})] == tri + ["shard_wrapped"] + mar
    r = rs.Runner.__new__(rs.Runner)
    r.st, r.environ = rs.settings(["shard_triton"], {}), {}
    r.logs, r.work, r.models, r.jit = "/l", "/w", "/m", "/j"
    for st, moe in ((rs.SHARD_E2E_TRITON_ST, "--moe-runner-backend triton"), (rs.SHARD_E2E_MARLIN_ST, "")):
        env = r.stage_env(st, shared=False)
        assert st.alone and st.e2e_report
        assert (env["E2E_MODEL"], env["E2E_VOCAB"], env["E2E_STEPS"], env["E2E_PARITY_TOKENS"]) == (
            "kimi-k25-shard", "20480", "3", "64")
        args = env["E2E_SERVER_ARGS"].split()
        assert ("--moe-runner-backend" in args) == bool(moe) and "--mem-fraction-static" in args
        assert args[args.index("--cuda-graph-bs-decode") + 1:][:3] == ["1", "4", "8"]
    r.environ = {"SHARD_E2E_MARLIN_ARGS": "--mem-fraction-static 0.75", "SHARD_TOKENS": "32"}
    env = r.stage_env(rs.SHARD_E2E_MARLIN_ST, shared=False)
    assert env["E2E_SERVER_ARGS"] == "--mem-fraction-static 0.75" and env["E2E_PARITY_TOKENS"] == "32"
    assert r.argv(rs.SHARD_JIT_ST)[-2:] == ["start", "/j"]
    for name in ("shard_triton", "shard_marlin", "shard_bench_lean", "shard_rest_wide", "shard_rest_16k",
                 "shard_rest_16k_up"):
        st = rs.settings([name], {})
        assert st.total_s <= 595 and rs.estimate_s(st) < st.total_s - st.reserve_s, name
    assert rs.settings(["shard"], {}).total_s > 1000  # the whole suite is longer than one call


def _jit(*args, **kw):
    return subprocess.run([sys.executable, os.path.join(ROOT, "test", "run_suite.py"), "--jit-build", *args],
                          capture_output=True, text=True, timeout=180, **kw)


def test_jit_build_start_outlives_its_stage_and_wait_reads_the_marker(tmp_path):
    """``start`` returns at once and leaves the builder in its own session, so the stage's
    process-group kill (and the end of the command) does not stop it; the builder writes its
    marker last; ``wait`` reports it and fails for a failed build; a second ``start`` with a good
    marker builds nothing; ``wait`` with neither marker nor builder builds in the foreground."""
    d = tmp_path / "jit"
    stage = rs.Stage("jitstart", ("python3", "test/run_suite.py", "--jit-build", "start", str(d), "nosuch"),
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
        f"JIT {m}" for m in rs.JIT_MODULES]
    assert not list(tmp_path.glob("*.pid"))
    assert _jit("build", str(tmp_path)).returncode == 2


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


def test_shard_bench_dry_run_plans_the_sweep(tmp_path, gpu_job_dry):
    p, summary = gpu_job_dry(timeout=300, SUITE="shard_bench")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (tmp_path / "gpujob" / "logs" / "shard_bench.log").read_text()
    assert "BENCH plan: ours@2, upstream@2, plain, ours@3, upstream@3" in log
    assert '"moe_runner_backend": "triton"' in log and '"cuda_graph_bs_decode": [1, 4, 8, 16, 32]' in log


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


def test_speedup_suite_dry_run_plans_three_engines_and_builds_no_pair(tmp_path, gpu_job_dry):
    """``SUITE=speedup`` under ``DRY_RUN=1``: bench_speedup.py --dry-run prints its plan, its
    estimate (into the summary) and the three engines' kwargs on the pair's folders under
    ``$MODELS``, and writes no pair weights there."""
    p, summary = gpu_job_dry(timeout=300, SUITE="speedup")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "stages: speedup=0" in summary and "ESTIMATE ~" in summary
    log = (tmp_path / "gpujob" / "logs" / "speedup.log").read_text()
    assert "BENCH plan: plain: 6 points; upstream: 24 points; ours: 24 points" in log
    kws = [ln for ln in log.splitlines() if ln.startswith("DRYRUN ") and "{" in ln]
    assert [ln.split(":")[0] for ln in kws] == ["DRYRUN plain", "DRYRUN upstream", "DRYRUN ours"]
    assert all('"load_format": "auto"' in ln and str(tmp_path / "models" / "llama8b-pair-attn") in ln for ln in kws)
    assert not list((tmp_path / "models").glob("llama8b-pair*"))
