"""CPU tier: the GPU suites as declared (``bench/suites``) and the commands that replaced the
one-off suites (``docs/gpu_testing.md``, "Benchmark commands").

Failure modes guarded: a suite without a purpose or an estimated time, or one that names a test
file or lab command that is not there (the GPU call then spends minutes to find out); a suite
running something other than its purpose names; ``all`` missing a suite or running a stage
twice; names after an issue or a run; ``-NAME`` or the suites' own budget not applied; the
declaration importing anything but the standard library (``gpu_job.sh`` checks the names before
its setup, with whatever python3 there is); a documented command that names no suite, sets a
setting the runner refuses, or gives a stage a limit its budget cuts; a former suite or variable
silently ignored instead of pointing to its command.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from bench import suites as su
from bench.suites import plan
from bench.suites import stages as st
from bench.suites.spec import SuiteError, bench_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# what each suite must run: the test files, scripts and lab commands, by purpose
WANT_FILES = {
    "demo": {bench_file("demo")},
    "kernel": {"test/gpu/test_chain_kernel_gpu.py"},
    "selftest": {"test/gpu/test_runner_selftest.py"},
    "e2e": {"test/e2e/test_server_e2e.py"},
    "mla": {"test/gpu/test_runner_selftest.py", "test/gpu/test_kimi_k25_engine.py", "test/e2e/test_server_e2e.py"},
    "reliability": {"test/e2e/test_accept_length_e2e.py", "test/e2e/test_reliability_e2e.py",
                    "test/gpu/test_chain_kernel_gpu.py", "test/gpu/test_runner_selftest.py"},
    "profile": {"test/e2e/test_profile_e2e.py"},
    "accept_attn": {"test/e2e/test_accept_attention_e2e.py", "test/gpu/test_runner_selftest.py",
                    "test/e2e/test_prefix_pair_e2e.py", "test/e2e/test_draft_attention_e2e.py"},
    "scenarios": {"test/e2e/test_serving_scenarios_e2e.py"},
    "soak": {"test/e2e/test_serving_scenarios_e2e.py"},
    "bench": {bench_file("verify")},
    "speedup": {bench_file("speedup")},
    "kbench": {bench_file("kernel")},
    "parts": {bench_file("parts")},
    "capture": {bench_file("capture")},
    "shard_triton": {"scripts/build_marlin_jit.py", "test/e2e/test_server_e2e.py"},
    "shard_marlin": {"scripts/build_marlin_jit.py", "test/e2e/test_server_e2e.py"},
    "shard_wrapped": {bench_file("verify")},
    "shard": {"scripts/build_marlin_jit.py", "test/e2e/test_server_e2e.py", bench_file("verify")},
}
SHARD_SUITES = {n for n in WANT_FILES if n.startswith("shard")}


@pytest.mark.parametrize("name", list(su.SUITES))
def test_every_suite_has_a_purpose_an_estimate_and_existing_files(name):
    suite = su.SUITES[name]
    assert len(suite.purpose) > 20, suite.purpose
    assert suite.est_s > 0
    stages = su.suite_stages(name, {})
    assert stages, name
    for s in stages:
        assert s.est_s > 0 and s.tmo_s > 0 and s.tmo_env.endswith("_TMO"), s.name
        assert s.files, f"{s.name} runs no test file or script"
        for f in s.files:
            assert os.path.isfile(os.path.join(ROOT, f)), f"{name}/{s.name}: {f} does not exist"


def test_the_suites_run_what_their_purpose_names():
    got = {n: {f for s in su.suite_stages(n, {}) for f in s.files} for n in su.SUITES if n != "all"}
    assert got == WANT_FILES
    # the lab's commands through its dispatcher: python3 -m bench <command>
    assert st.BENCH_ST.cmd[:4] == ("python3", "-m", "bench", "verify")
    assert bench_file("nosuch") == "bench/__main__.py:nosuch"
    # the NaN variant of the self-test is in selftest; compute-sanitizer in reliability
    assert [s.name for s in su.suite_stages("selftest", {})] == ["selftest", "nan"]
    assert dict(su.suite_stages("selftest", {})[1].env)["VERIFY_GRAPH_SELFTEST_NAN"] == "1"
    assert {s.memcheck for s in su.suite_stages("reliability", {})} == {"", "kernel", "server"}


def test_all_is_every_suite_but_capture_parts_and_the_shard_one_at_a_time():
    every = [s.name for n in su.SUITES if n not in ("all", "capture", "parts", *SHARD_SUITES)
             for s in su.suite_stages(n, {})]
    got = [s.name for s in su.suite_stages("all", {})]
    assert sorted(got) == sorted(every) and len(set(got)) == len(got)
    assert not su.SUITES["all"].parallel
    assert su.SUITES["all"].est_s == sum(s.est_s for s in su.suite_stages("all", {}))


def test_names_say_what_a_thing_does():
    """Suite and stage names by purpose: none named after an issue or a run."""
    names = list(su.SUITES) + list(su.UNITS) + [s.name for n in su.SUITES for s in su.suite_stages(n, {})]
    bad = [n for n in names if re.search(r"issue|run\d|^\d|#", n)]
    assert not bad, bad
    texts = [open(os.path.join(ROOT, "scripts", "gpu_job.sh")).read()]
    texts += [open(os.path.join(ROOT, "bench", "suites", f)).read()
              for f in os.listdir(os.path.join(ROOT, "bench", "suites")) if f.endswith(".py")]
    for text in texts:
        assert not re.search(r"issue ?#?\d|\brun \d+\b|#\d", text), re.findall(r"issue ?#?\d|\brun \d+\b|#\d", text)


def test_leaving_out_and_the_suite_budget():
    """``reliability`` named whole defaults TOTAL_S to its 1000 s and runs at once; ``-sanitizer``
    leaves compute-sanitizer out (the part that fits one 10-minute call: default budget)."""
    whole = plan.settings(["reliability"], {})
    assert whole.parallel and whole.total_s == 1000
    assert [s.name for s in whole.plan][-2:] == ["sanitizer_kernel", "sanitizer_server"]
    part = plan.settings(["reliability", "-sanitizer"], {})
    assert part.total_s == plan.DEFAULT_TOTAL_S
    assert not any(s.memcheck for s in part.plan) and len(part.plan) == 6
    assert plan.settings(["reliability"], {"TOTAL_S": "565"}).total_s == 565
    assert not plan.settings(["reliability"], {"PARALLEL": "0"}).parallel
    assert not plan.settings(["kernel", "e2e"], {}).parallel
    # a stage named twice runs once
    assert [s.name for s in plan.settings(["kernel", "all"], {}).plan].count("kernel") == 1


def test_shard_suites_one_server_at_a_time_and_their_budget():
    """The shard's stages in order (the Marlin one waits for the JIT build first); each half fits
    one 10-minute call by its own budget; the whole suite is longer than one call."""
    tri = [s.name for s in su.suite_stages("shard_triton", {})]
    mar = [s.name for s in su.suite_stages("shard_marlin", {})]
    assert tri == ["shard_jit", "shard_e2e_triton"] and mar == ["shard_jit_wait", "shard_e2e_marlin"]
    assert [s.name for s in su.suite_stages("shard", {})] == tri + ["shard_wrapped"] + mar
    for name in ("shard_triton", "shard_marlin", "shard_wrapped"):
        s = plan.settings([name], {})
        assert s.total_s <= 595 and plan.estimate_s(s) < s.total_s - s.reserve_s, name
    assert plan.settings(["shard"], {}).total_s > 1000


def test_the_declaration_is_stdlib_only():
    """``python3 -S`` (no site-packages): ``--list`` and ``--check`` still work."""
    for args in (["--list"], ["--check", "all", "shard"]):
        p = subprocess.run([sys.executable, "-S", "-m", "bench.suites", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, env={"PATH": os.environ.get("PATH", "")})
        assert p.returncode == 0, p.stderr
    assert "shard_wrapped" in p.stdout


# ------------------------------------------------------------------------------ the documented commands
def documented_commands() -> dict[str, dict[str, str]]:
    """``docs/gpu_testing.md``'s "Benchmark commands": the first comment line above each
    ``... bash scripts/gpu_job.sh`` -> its variables."""
    text = open(os.path.join(ROOT, "docs", "gpu_testing.md")).read()
    sec = text[text.index("## Benchmark commands"):]
    sec = sec[:sec.index("\n## ", 1)].replace("\\\n", " ")
    out, title = {}, None
    for ln in sec.splitlines():
        ln = ln.strip()
        if ln.startswith("# ") and title is None:
            title = ln[2:]
        elif ln.endswith("bash scripts/gpu_job.sh"):
            words = shlex.split(ln)
            env = dict(w.split("=", 1) for w in words[:-2])
            assert words[-2:] == ["bash", "scripts/gpu_job.sh"] and all(re.match(r"[A-Z_0-9]+$", k) for k in env), ln
            out[title], title = env, None
    return out


def test_every_documented_command_is_a_valid_plan_within_its_budget():
    cmds = documented_commands()
    assert len(cmds) == 8, list(cmds)
    for title, env in cmds.items():
        names = env["SUITE"].split()
        assert set(names) <= {"bench", "parts", "capture"}, title
        s = plan.settings(names, env)
        for x in s.plan:
            assert s.limits.get(x.name, x.tmo_s) <= s.total_s - s.reserve_s, f"{title}: the budget cuts {x.tmo_env}"
            assert x.extra.var in env, f"{title}: {x.name} runs with its own default arguments"
        assert "--model kimi-k25-shard" in env.get("BENCH_ARGS", env.get("CAPTURE_ARGS")), title
    sweep = next(e for t, e in cmds.items() if t.startswith("the full per-phase sweep"))
    assert int(sweep["TOTAL_S"]) > 1000 and "--steps 2,3" in sweep["BENCH_ARGS"]


@pytest.mark.parametrize("name", sorted(su.MOVED))
def test_a_former_suite_points_to_its_command(name):
    with pytest.raises(SuiteError) as ei:
        plan.settings([name], {})
    assert str(ei.value) == f"'{name}' is no longer a suite: it is a command of {su.SHARD_BENCH_DOC}"
    doc = open(os.path.join(ROOT, "docs", "gpu_testing.md")).read()
    assert "## Benchmark commands" in doc and f"`{name}`" in doc


@pytest.mark.parametrize("var, instead", [("SHARD_REST_WIDE_ARGS", "BENCH_ARGS with SUITE=bench"),
                                          ("SHARD_PARTS_ARGS", "PARTS_ARGS with SUITE=parts"),
                                          ("SHARD_CAPTURE_ARGS", "CAPTURE_ARGS with SUITE=capture")])
def test_a_former_variable_names_its_replacement(var, instead):
    with pytest.raises(SuiteError, match=f"{var} is no longer read: use {instead}"):
        plan.settings(["bench"], {var: "--steps 2"})
