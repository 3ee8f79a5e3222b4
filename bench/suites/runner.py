"""The runner of the GPU suites (``python3 -m bench.suites``; ``scripts/gpu_job.sh`` calls it).

    python3 -m bench.suites --list | --check NAME... | NAME...
    python3 -m bench.suites --jit-build start|wait|run DIR     # = scripts/build_marlin_jit.py

A stage is one command. Each runs in its own process group under ``timeout`` with its own limit
(its ``*_TMO`` variable, default in the declaration); whatever it leaves running is killed after
it. No stage runs past ``TOTAL_S - RESERVE_S`` seconds after the job started (``GPUJOB_T0``); a
stage with under 30 s left is skipped (which fails the job). Parallel mode (``PARALLEL=1``; the
default when a named suite is declared ``parallel``) starts stages in the background, 4 s apart
(``PARALLEL_STAGGER_S``), with every test server's KV pool capped at ``SHARED_GPU_TOKENS`` (65536)
tokens and a limit of ``PARALLEL_TMO`` (520 s, for the contention) unless the stage's own variable
is set; a stage declared ``alone`` (timing, compute-sanitizer) first waits for them, and everything
after it runs one at a time. ``DRY_RUN=1``: pytest stages only collect (``--collect-only``), lab
commands print what they would run (``--dry-run``). Every stage has the repo root on
``PYTHONPATH`` (``bench`` imports in the servers' children too).

Results: ``$GPUJOB_DIR/logs/<stage>.log`` per stage, ``logs/e2e/<stage>/`` (``E2E_LOG_DIR``) with
its servers' logs and results JSON; lines appended to ``$GPUJOB_DIR/summary.txt``; into ``$OUT``:
each stage's declared results JSON (``bench_results.json``, ``speedup_results.json``, ...),
``e2e_results.json`` (stage ``e2e``), ``stage_results.tar.gz`` (every stage's ``*_results.json``).
Exit status 0 only when every stage ran and returned 0 (or had nothing to run); 2 for a bad name
or setting. Stdlib only.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from typing import Mapping

from . import DEFAULT_SUITE
from .plan import Settings, estimate_s, minutes, settings, table
from .report_lines import bench_lines, e2e_lines, pytest_lines
from .spec import WAIT, Arg, Stage, SuiteError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIN_LEFT_S = 30  # a stage with less than this left of the budget is skipped


def _import_script(name: str):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


class Runner:
    def __init__(self, st: Settings, environ: Mapping[str, str]):
        self.st, self.environ = st, dict(environ)
        self.work = environ.get("GPUJOB_DIR") or "/tmp/gpujob"
        self.logs = os.path.join(self.work, "logs")
        self.out = environ.get("OUT") or "/tmp/gpujob_out"
        self.models = environ.get("MODELS_DIR") or "/tmp/models"
        self.jit = environ.get("JIT_BUILD_DIR") or os.path.join(os.path.dirname(self.work), "jitbuild")
        self.t0 = float(environ.get("GPUJOB_T0") or time.time())
        self.summary = os.path.join(self.work, "summary.txt")
        self.rc: dict[str, object] = {}
        self.order: list[str] = []
        self.background: list[threading.Thread] = []
        self.parallel = st.parallel
        self.lock = threading.Lock()
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.out, exist_ok=True)

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            with open(self.summary, "a") as f:
                f.write(text + "\n")

    def quiet(self, lines: list[str]) -> None:
        """Lines for the summary only."""
        with self.lock, open(self.summary, "a") as f:
            f.writelines(ln + "\n" for ln in lines)

    def elapsed(self) -> int:
        return int(time.time() - self.t0)

    def fmt(self, s: str) -> str:
        return s.format(logs=self.logs, work=self.work, models=self.models, jit=self.jit)

    def argv(self, s: Stage) -> list[str]:
        out: list[str] = []
        for c in s.cmd:
            out += c.expand(self.environ) if isinstance(c, Arg) else [self.fmt(c)]
        if self.st.dry:
            out.append("--collect-only" if s.kind == "pytest" else "--dry-run")
        return out + (s.extra.expand(self.environ) if s.extra else [])

    def base_env(self) -> dict[str, str]:
        """The environment with the repo root first on ``PYTHONPATH`` (``python -m bench`` anywhere)."""
        paths = [p for p in self.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT]
        return dict(self.environ, PYTHONPATH=os.pathsep.join([ROOT, *paths]))

    def stage_env(self, s: Stage, shared: bool) -> dict[str, str]:
        env = dict(self.base_env(), E2E_LOG_DIR=os.path.join(self.logs, "e2e", s.name), PYTHONUNBUFFERED="1")
        env.pop("VERIFY_GRAPH_SHARED_GPU_TOKENS", None)
        if shared:  # stages share the GPU: cap each test server's KV pool (test/server_utils.py)
            env["VERIFY_GRAPH_SHARED_GPU_TOKENS"] = str(self.st.shared_tokens)
        for k, v in s.env:
            env[k] = self.fmt(v) if isinstance(v, str) else " ".join(v.expand(self.environ))
        return env

    # -- one stage
    def _body(self, s: Stage, argv: list[str], env: dict, tmo: int) -> None:
        t1 = time.time()
        set_env = " ".join(f"{k}={shlex.quote(env.get(k, ''))}" for k, _ in s.env)
        print(f"== stage {s.name} (limit {tmo}s): {set_env + ' ' if set_env else ''}{' '.join(argv)}", flush=True)
        with open(os.path.join(self.logs, f"{s.name}.log"), "w") as log:
            if set_env:  # what the stage's own variables came to (the tests read them)
                log.write(f"env: {set_env}\n")
                log.flush()
            p = subprocess.Popen(["timeout", "-k", "15", str(tmo), *argv], stdout=log, stderr=subprocess.STDOUT,
                                 env=env, cwd=ROOT, start_new_session=True)  # own process group
            rc = p.wait()
        try:  # whatever the stage left running (its process group)
            os.killpg(p.pid, signal.SIGKILL)
            time.sleep(3)
        except (ProcessLookupError, PermissionError):
            pass
        self.rc[s.name] = rc
        self.say(f"== stage {s.name}: rc={rc} in {int(time.time() - t1)}s (limit {tmo}s)"
                 + (" TIMED OUT" if rc == 124 else ""))

    def run_stage(self, s: Stage) -> None:
        self.order.append(s.name)
        if s.alone:
            self.barrier()
        missing = [f for f in s.files if not os.path.exists(os.path.join(ROOT, f))]
        if missing:
            self.rc[s.name] = "absent"
            self.say(f"== stage {s.name}: SKIPPED (no {', '.join(missing)})")
            return
        argv = self.argv(s)
        if s.memcheck:
            san = shutil.which("compute-sanitizer") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))), "")
            if not san:
                self.rc[s.name] = "absent"
                self.say(f"== stage {s.name}: SKIPPED (compute-sanitizer not found)")
                return
            wrap = [san, "--tool", "memcheck", "--target-processes", "all", "--error-exitcode", "99",
                    "--log-file", os.path.join(self.logs, f"memcheck_{s.memcheck}.%p.txt")]
        left = int(self.t0 + self.st.total_s - self.st.reserve_s - time.time())
        if left < MIN_LEFT_S:
            self.rc[s.name] = "skipped"
            self.say(f"== stage {s.name}: SKIPPED ({left}s left of TOTAL_S={self.st.total_s})")
            return
        tmo = self.st.limits.get(s.name) or (self.st.parallel_tmo if self.parallel else s.tmo_s)
        tmo = min(tmo, left)
        env = self.stage_env(s, shared=self.parallel)
        if s.memcheck == "kernel":
            argv = wrap + argv
        elif s.memcheck == "server":
            env["VERIFY_GRAPH_SERVER_WRAPPER"] = " ".join(wrap)
        if self.parallel:
            t = threading.Thread(target=self._body, args=(s, argv, env, tmo))
            t.start()
            self.background.append(t)
            time.sleep(self.st.stagger_s)
        else:
            self._body(s, argv, env, tmo)

    def barrier(self) -> None:
        """Wait for the stages running at once; every later stage runs alone."""
        if not self.parallel:
            return
        self.say(f"== PARALLEL=1: {len(self.background)} stages running at once "
                 f"(KV pools capped at {self.st.shared_tokens} tokens per server)")
        for t in self.background:
            t.join()
        self.background, self.parallel = [], False

    # -- the whole plan
    def make_pair(self) -> None:
        """The constructed-agreement pairs (real weights, ~100 MB each) for the stages that need
        them: the plain pair, the attention pair (``--attention``), the prefix-reading pair
        (``--prefix``, its default span: ``test_prefix_pair_e2e.py``'s)."""
        for flag, extra in (("needs_pair", []), ("needs_attn_pair", ["--attention"]),
                            ("needs_prefix_pair", ["--prefix"])):
            if not any(s != WAIT and getattr(s, flag) for s in self.st.plan):
                continue
            path = os.path.join(self.logs, "make_models.txt")
            with open(path, "a") as log:
                r = subprocess.run([sys.executable, "-m", "bench", "models", "pair", self.models, *extra],
                                   stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.base_env())
            if r.returncode:
                tail = open(path, errors="replace").read().splitlines()[-3:]
                self.say(f"bench models pair {' '.join(extra)} FAILED: {' '.join(tail)}".replace("  ", " "))

    def run(self) -> int:
        st = self.st
        left = int(self.t0 + st.total_s - st.reserve_s - time.time())
        est = estimate_s(st)
        stages = [s.name for s in st.plan if s != WAIT]
        self.say(f"== suites {' '.join(st.names)}: {len(stages)} stages, estimated {minutes(est)} ({est} s, warm "
                 f"kernel cache); {left}s left of TOTAL_S={st.total_s} - RESERVE_S={st.reserve_s}"
                 + ("; stages at once (PARALLEL=1)" if st.parallel else ""))
        if est > left:
            self.say("   WARNING: the estimate exceeds the budget: stages past it are skipped; raise TOTAL_S or "
                     "run fewer suites")
        self.make_pair()
        for s in st.plan:
            if s == WAIT:
                self.barrier()
            else:
                self.run_stage(s)
        self.barrier()
        self.memcheck_verdicts()
        self.report()
        self.say(f"== {' '.join(st.names)}: done at {self.elapsed()}s; stages: "
                 + " ".join(f"{k}={self.rc.get(k)}" for k in self.order))
        return 0 if all(self.rc.get(k) in (0, "absent") for k in self.order) else 1

    def memcheck_verdicts(self) -> None:
        """A passing sanitizer stage also needs every memcheck report to hold ``ERROR SUMMARY: 0
        errors``: a frontend killed with its server writes none."""
        memcheck_verdict = _import_script("memcheck_verdict")
        for s in (x for x in self.st.plan if x != WAIT and x.memcheck):
            if self.rc.get(s.name) != 0:
                continue
            v, detail = memcheck_verdict.verdict(os.path.join(self.logs, f"memcheck_{s.memcheck}"))
            self.say(f"-- {s.name} memcheck: {v}: {detail}")
            if v == "absent" and self.st.dry:  # a dry run starts no server
                continue
            if v != "ok":
                self.rc[s.name] = f"memcheck_{v}"

    def _emit(self, said_quiet: tuple[list[str], list[str]]) -> None:
        said, quiet = said_quiet
        for ln in said:
            self.say(ln)
        if quiet:
            self.quiet(quiet)

    def report(self) -> None:
        byname = {s.name: s for s in self.st.plan if s != WAIT}
        logs = {n: os.path.join(self.logs, f"{n}.log") for n in self.order}
        read = lambda n: open(logs[n], errors="replace").read().splitlines()  # noqa: E731
        for name in self.order:
            if byname[name].kind == "pytest" and os.path.exists(logs[name]):
                self._emit(pytest_lines(name, read(name)))
        e2e_dir = os.path.join(self.logs, "e2e")
        for name in self.order:
            path = os.path.join(e2e_dir, name, "e2e_results.json")
            if not (byname[name].e2e_report and os.path.exists(path)):
                continue
            if name == "e2e":
                shutil.copy(path, self.out)
            self.say("\n".join(e2e_lines(path, name)[:12]))
        results = sorted(glob.glob(os.path.join(e2e_dir, "*", "*_results.json")))
        if results:  # every stage's results in one file ($OUT takes 8)
            with tarfile.open(os.path.join(self.out, "stage_results.tar.gz"), "w:gz") as tar:
                for r in results:
                    tar.add(r, arcname=os.path.relpath(r, e2e_dir))
        for name in self.order:
            s = byname[name]
            if s.report and os.path.exists(logs[name]):
                self._emit(bench_lines(s.report, read(name)))
            if s.results and os.path.exists(os.path.join(self.work, s.results)):
                shutil.copy(os.path.join(self.work, s.results), self.out)


def main(argv: list[str]) -> int:
    args = list(argv)
    if args[:1] == ["--jit-build"]:
        return _import_script("build_marlin_jit").main(args[1:])
    if args[:1] == ["--list"]:
        print(table())
        return 0
    check = args[:1] == ["--check"]
    names = (args[1:] if check else args) or DEFAULT_SUITE.split()
    try:
        st = settings(names, os.environ)
    except SuiteError as ex:
        print(f"bench.suites: {ex}", file=sys.stderr)
        return 2
    if check:
        print(f"suites {' '.join(names)} -> stages {' '.join(s if s == WAIT else s.name for s in st.plan)} "
              f"(estimated {minutes(estimate_s(st))})")
        return 0
    return Runner(st, os.environ).run()
