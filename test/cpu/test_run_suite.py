"""CPU tier: the runner of the GPU suites (``python3 -m bench.suites``, ``bench/suites/runner.py``,
called by ``scripts/gpu_job.sh``; ``test/run_suite.py`` forwards to it).

Failure modes guarded: a typo in ``SUITE`` running nothing, or something else, instead of
stopping with one line naming the valid suites; a bad number in a limit variable; a stage that
outlives its limit, or leaves processes behind that hold the GPU for the next stage; a stage
started with less budget than it needs left, so packing runs past the 10-minute call; a stage
without the repo root on ``PYTHONPATH`` (``bench`` not importable in a server's children); the
lab commands' dry runs and their summary lines.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from bench.suites import UNITS, plan, runner
from bench.suites import stages as st
from bench.suites.spec import Stage, SuiteError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _suites(*args, **env):
    return subprocess.run([sys.executable, "-m", "bench.suites", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env))


def test_unknown_suite_is_one_line_naming_the_valid_suites():
    r = _suites("kernel", "e2ee", DRY_RUN="1")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unknown suite 'e2ee'" in lines[0]
    for name in plan.SUITES:
        assert name in lines[0], name
    # the old path forwards to the same runner
    old = subprocess.run([sys.executable, os.path.join(ROOT, "test", "run_suite.py"), "kernel", "e2ee"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, DRY_RUN="1"))
    assert (old.returncode, old.stdout, old.stderr) == (2, "", r.stderr)


def test_list_and_check():
    """``--list``: every suite with its estimate and every stage with its limit variable;
    ``--check``: the plan in one line (gpu_job.sh greps it for shard_jit), nothing run."""
    r = _suites("--list")
    assert r.returncode == 0, r.stderr
    for name, suite in plan.SUITES.items():
        assert re.search(rf"^{name} +{re.escape(plan.minutes(suite.est_s))}  ", r.stdout, re.M), name
    for name in ("nan", "sanitizer_server", "shard_jit", "parts"):
        assert re.search(rf"^ +{name}: .*\(\w+_TMO \d+; est \d+ s\)$", r.stdout, re.M), name
    c = _suites("--check", "shard_triton", "kernel")
    assert c.returncode == 0 and c.stdout.startswith("suites shard_triton kernel -> stages shard_jit shard_e2e_triton kernel ")


def test_gpu_job_stops_on_an_unknown_suite_before_the_setup(tmp_path):
    """gpu_job.sh refuses a name that is not a suite or stage with the runner's one line, before
    it untars or installs anything."""
    env = dict(os.environ, DRY_RUN="1", BASE=str(tmp_path), SUITE="selftests",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_job.sh")], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == [
        f"bench.suites: unknown suite 'selftests' (SUITE=\"selftests\"): {plan.valid_names_line()}"]
    assert not (tmp_path / "gpujob").exists() and not (tmp_path / "site").exists()


@pytest.mark.parametrize("env, fragment", [
    ({"TOTAL_S": "ten"}, "TOTAL_S='ten': want a whole number >= 1"),
    ({"E2E_TMO": "-3"}, "E2E_TMO='-3': want a whole number >= 1"),
    ({"PARALLEL": "yes"}, "PARALLEL='yes': want 1"),
    ({"GPU_TMO": "100"}, "GPU_TMO is no longer read: use KERNEL_TMO and SELFTEST_TMO"),
])
def test_bad_setting_is_one_line_naming_it(env, fragment):
    with pytest.raises(SuiteError) as ei:
        plan.settings(["e2e"], env)
    assert fragment in str(ei.value) and "\n" not in str(ei.value)


def test_bench_is_quick_unless_bench_args_is_set():
    bench = UNITS["bench"]
    r = runner.Runner.__new__(runner.Runner)
    r.st, r.logs, r.work, r.models, r.jit = plan.settings(["bench"], {}), "/l", "/w", "/m", "/j"
    r.environ = {}
    assert r.argv(bench)[-1] == "--quick"
    r.environ = {"BENCH_ARGS": "--contexts 1024 --modes ours,upstream"}
    assert r.argv(bench)[-4:] == ["--contexts", "1024", "--modes", "ours,upstream"] and "--quick" not in r.argv(bench)
    r.environ = {"BENCH_ARGS": ""}  # set and empty: the bench verify's own full default
    assert r.argv(bench)[-1] == "150"
    assert r.argv(bench)[:6] == ["python3", "-m", "bench", "verify", "--out", "/w/bench_results.json"]


def _runner(tmp_path, stage, total_s=500, reserve_s=0):
    st = plan.Settings([stage.name], [stage], dry=False, parallel=False, total_s=total_s, reserve_s=reserve_s,
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


# the stage's command: starts a grandchild (ignores SIGTERM, sleeps 120 s), writes its pid, then
# sleeps SECONDS itself
_SPAWN = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
          "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)']); "
          "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(float(sys.argv[2]))")


def test_leftovers_of_a_stage_are_killed(tmp_path):
    """A stage that exits 0 but leaves a process running: the process group is killed after it."""
    pidfile = tmp_path / "pid"
    stage = Stage("leaves", ("python3", "-c", _SPAWN, str(pidfile), "0"), "LEAVES_TMO", 60, 1, kind="bench")
    r = _runner(tmp_path, stage)
    assert r.run() == 0
    assert r.rc["leaves"] == 0
    assert not _alive(int(pidfile.read_text()))


def test_a_stage_past_its_limit_is_stopped(tmp_path):
    pidfile = tmp_path / "pid"
    stage = Stage("hangs", ("python3", "-c", _SPAWN, str(pidfile), "120"), "HANGS_TMO", 2, 1, kind="bench")
    r = _runner(tmp_path, stage)
    t0 = time.time()
    assert r.run() == 1
    assert r.rc["hangs"] == 124 and time.time() - t0 < 60
    assert not _alive(int(pidfile.read_text()))
    assert re.search(r"== stage hangs: rc=124 in \d+s \(limit 2s\) TIMED OUT", (tmp_path / "w" / "summary.txt").read_text())


def test_the_budget_caps_limits_and_skips_stages(tmp_path):
    """No stage runs past TOTAL_S - RESERVE_S: the limit is cut to what is left, and a stage with
    under 30 s left is skipped, which fails the job."""
    stage = Stage("quick", ("python3", "-c", "pass"), "QUICK_TMO", 500, 1, kind="bench")
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


def test_every_stage_has_the_repo_root_on_pythonpath(tmp_path):
    """``python -m bench`` resolves from any folder a stage's servers start in: the repo root
    first on PYTHONPATH, once, before what was there."""
    r = _runner(tmp_path, st.KERNEL_ST)
    r.environ["PYTHONPATH"] = os.pathsep.join(["/site", ROOT])
    env = r.stage_env(st.SHARD_E2E_MARLIN_ST, shared=False)
    assert env["PYTHONPATH"].split(os.pathsep) == [ROOT, "/site"]
    child = "import bench.suites; print(bench.suites.__file__)"  # as a server's child: another folder
    probe = Stage("probe", ("python3", "-c", f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, "
                            f"'-c', {child!r}], cwd='/'))"), "PROBE_TMO", 60, 1, kind="bench")
    r = _runner(tmp_path, probe)
    r.environ.pop("PYTHONPATH", None)
    r.environ["OUT"] = str(tmp_path / "out")
    assert r.run() == 0
    assert (tmp_path / "w" / "logs" / "probe.log").read_text().strip() == os.path.join(ROOT, "bench", "suites",
                                                                                       "__init__.py")


def test_shard_stages_set_the_shard_server(tmp_path):
    """The shard's e2e stages run alone (72 GiB per server), with the shard's model, vocabulary,
    num_steps 3, 16 x 64-token parity and the MoE backend each names."""
    r = runner.Runner.__new__(runner.Runner)
    r.st, r.environ = plan.settings(["shard_triton"], {}), {}
    r.logs, r.work, r.models, r.jit = "/l", "/w", "/m", "/j"
    for stage, moe in ((st.SHARD_E2E_TRITON_ST, "--moe-runner-backend triton"), (st.SHARD_E2E_MARLIN_ST, "")):
        env = r.stage_env(stage, shared=False)
        assert stage.alone and stage.e2e_report
        assert (env["E2E_MODEL"], env["E2E_VOCAB"], env["E2E_STEPS"], env["E2E_PARITY_TOKENS"]) == (
            "kimi-k25-shard", "20480", "3", "64")
        args = env["E2E_SERVER_ARGS"].split()
        assert ("--moe-runner-backend" in args) == bool(moe) and "--mem-fraction-static" in args
        assert args[args.index("--cuda-graph-bs-decode") + 1:][:3] == ["1", "4", "8"]
    r.environ = {"SHARD_E2E_MARLIN_ARGS": "--mem-fraction-static 0.75", "SHARD_TOKENS": "32"}
    env = r.stage_env(st.SHARD_E2E_MARLIN_ST, shared=False)
    assert env["E2E_SERVER_ARGS"] == "--mem-fraction-static 0.75" and env["E2E_PARITY_TOKENS"] == "32"
    assert r.argv(st.SHARD_JIT_ST) == ["python3", "scripts/build_marlin_jit.py", "start", "/j"]


def test_speedup_suite_dry_run_plans_three_engines_and_builds_no_pair(tmp_path, gpu_job_dry):
    """``SUITE=speedup`` under ``DRY_RUN=1``: ``python -m bench speedup --dry-run`` prints its plan, its
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


def test_the_documented_shard_sweep_dry_run_plans_it(tmp_path, gpu_job_dry):
    """The full shard sweep of ``docs/gpu_testing.md`` (once suite ``shard_bench``) under
    ``DRY_RUN=1``: five engines, triton MoE, the sweep's five decode buckets."""
    from test_suite_declarations import documented_commands

    env = next(e for t, e in documented_commands().items() if t.startswith("the full per-phase sweep"))
    p, summary = gpu_job_dry(timeout=300, **env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "stages: bench=0" in summary
    log = (tmp_path / "gpujob" / "logs" / "bench.log").read_text()
    assert "BENCH plan: ours@2, upstream@2, plain, ours@3, upstream@3" in log
    assert '"moe_runner_backend": "triton"' in log and '"cuda_graph_bs_decode": [1, 4, 8, 16, 32]' in log
