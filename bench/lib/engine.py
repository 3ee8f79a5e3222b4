"""The lab's engine harness: one ``sglang.Engine`` per mode, each in its own child process.

The parent runs ``[sys.executable, "-m", "bench", <command>, ..., "--child", MODE, "--child-out",
FILE]`` (:func:`child_command`) with stdout+stderr to a log (:func:`run_logged`; the repository
root on the child's ``PYTHONPATH``, :func:`child_env`); the child builds the Engine's keyword
arguments (:func:`engine_kwargs`), starts it with the per-replay probe in its scheduler
(:func:`start_engine`), reads the probe and the plugin's counters (:func:`engine_state`) and
writes its result as JSON whatever happens (:func:`child_main`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root (the folder holding ``bench/``)."""
PLUGIN_ENV = "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
PROFILE_ENV = "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"
VERSION_PACKAGES = ("torch", "sglang", "triton", "sglang-kernel", "flashinfer-python", "transformers",
                    "sglang-verify-graph")


def engine_kwargs(mode: str, target: str, draft: str, cfg: dict, *, max_context: int, new_tokens: int,
                  warmup_tokens: int, steps: int, max_bs: int, cuda_graph_bs: list | None = None,
                  attention_backend: str = "triton", draft_attention_backend: str | None = None,
                  mem: float = 0.6, prefix_cache: bool = False, log_level: str = "info",
                  moe_runner_backend: str | None = None, engine_extra: str = "{}",
                  load_format: str = "dummy") -> dict:
    """``sglang.Engine`` keyword arguments of one mode (``plain``: no speculation; any other:
    EAGLE3, top-k 1, ``steps`` draft steps and ``steps + 1`` draft tokens with the draft at
    ``draft``). ``cfg``: the target's text config (``max_position_embeddings``; ``"wrapper": True``
    for a multimodal wrapper, run with ``enable_multimodal=False``). The context length is the
    longest request (``max_context + new_tokens + warmup_tokens + 2 * (steps + 1) + 64`` tokens)
    rounded up to 256, at most ``max_position_embeddings``. Decode graphs are captured for
    ``cuda_graph_bs`` (their max is the max bs) or every default bucket up to ``max(8, max_bs)``.
    ``engine_extra``: a JSON object of further keyword arguments, applied last."""
    max_pos = cfg["max_position_embeddings"]
    need = max_context + new_tokens + warmup_tokens + 2 * (steps + 1) + 64
    capture = dict(cuda_graph_bs_decode=cuda_graph_bs) if cuda_graph_bs else {}
    kw = dict(model_path=target, load_format=load_format, attention_backend=attention_backend,
              sampling_backend="pytorch", mem_fraction_static=mem,
              cuda_graph_max_bs_decode=max(cuda_graph_bs) if cuda_graph_bs else max(8, max_bs),
              **capture, cuda_graph_backend_prefill="disabled", disable_radix_cache=not prefix_cache,
              skip_tokenizer_init=True,
              grammar_backend="none", log_level=log_level, random_seed=0,
              context_length=min(max_pos, -(-need // 256) * 256))
    if cfg.get("wrapper"):  # e.g. KimiK25ForConditionalGeneration: the text model alone (no HF processor)
        kw["enable_multimodal"] = False
    if moe_runner_backend:
        kw["moe_runner_backend"] = moe_runner_backend
    if mode != "plain":
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_eagle_topk=1,
                  speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1)
        if draft_attention_backend:
            kw["speculative_draft_attention_backend"] = draft_attention_backend
    kw.update(json.loads(engine_extra))
    return kw


def probed_engine_class():
    """``sglang.Engine`` whose scheduler process installs the per-replay probe first
    (``bench.lib.verify_probe.run_scheduler_process``); SGLang's own ``Engine`` (no probe, a
    line on stderr) when it has no ``run_scheduler_process_func`` to override."""
    from sglang.srt.entrypoints.engine import Engine

    from bench.lib import verify_probe

    if not hasattr(Engine, "run_scheduler_process_func"):
        print("PROBE unavailable: this sglang.Engine has no run_scheduler_process_func", file=sys.stderr, flush=True)
        return Engine

    class ProbedEngine(Engine):
        run_scheduler_process_func = staticmethod(verify_probe.run_scheduler_process)

    return ProbedEngine


def engine_state(eng) -> dict:
    """``{"probe": drained per-replay lists, "plugin": the plugin's counters or None}`` of rank 0
    (``Engine.get_server_info()``); reading drains the probe."""
    st = eng.get_server_info()["internal_states"][0]
    return {"probe": st.get("bench_probe", {}), "plugin": st.get("verify_cuda_graph")}


def start_engine(kw: dict, res: dict, mode: str, plugin: bool, profile_every: int = 0):
    """``sglang.Engine(**kw)`` for one mode's child process, with the per-replay probe in its
    scheduler, the plugin's flag set only when ``plugin`` and its profile every ``profile_every``
    cycles (0: off); ``mode``, ``engine_kwargs``, ``startup_s`` (s), an empty ``phases`` and
    ``plugin_before`` (the plugin's counters, None without it) go into ``res``. Returns the engine."""
    os.environ.pop(PLUGIN_ENV, None)
    os.environ.pop(PROFILE_ENV, None)
    if plugin:
        os.environ[PLUGIN_ENV] = "1"
    if profile_every:
        os.environ[PROFILE_ENV] = str(profile_every)
    print("BENCH engine_kwargs " + json.dumps(kw), flush=True)
    engine_cls = probed_engine_class()
    t0 = time.perf_counter()
    eng = engine_cls(**kw)
    res.update(mode=mode, engine_kwargs=kw, startup_s=round(time.perf_counter() - t0, 1), phases=[])
    print(f"BENCH startup {res['startup_s']}s", flush=True)
    res["plugin_before"] = engine_state(eng)["plugin"]
    return eng


def child_main(a, run, json_default=None) -> int:
    """One mode's engine subprocess: ``run(a, res)`` fills ``res`` (``{"mode", "ok", "phases"}``
    to start); ``res`` is written to ``a.child_out`` (JSON, ``json_default`` for what json cannot
    encode) whatever happens, an exception's type and message in ``res["error"]`` (its traceback
    on stderr). Returns 0 when ``res["ok"]``, else 1."""
    res = {"mode": a.child, "ok": False, "phases": []}
    try:
        run(a, res)
    except BaseException as ex:
        import traceback

        res["error"] = f"{type(ex).__name__}: {str(ex)[:400]}"
        traceback.print_exc()
    finally:
        with open(a.child_out, "w") as f:
            json.dump(res, f, indent=1, default=json_default)
    return 0 if res.get("ok") else 1


def child_command(command: str, argv: list, mode: str, child_out: str, *extra: str) -> list:
    """``[python, -m, bench, command, *argv, *extra, --child, mode, --child-out, child_out]``:
    the parent's own flags again (argparse: a flag given twice keeps the last value)."""
    return ([sys.executable, "-m", "bench", command] + list(argv) + list(extra)
            + ["--child", mode, "--child-out", child_out])


def child_env(base: dict | None = None) -> dict:
    """``base`` (default ``os.environ``) with the repository root first on ``PYTHONPATH``, so the
    child and the scheduler processes it spawns import ``bench`` from any working directory."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_logged(cmd: list, log: str, timeout: float, child: dict):
    """Run one engine subprocess with stdout+stderr to ``log`` (env: :func:`child_env`);
    ``child["p"]`` holds it meanwhile (for a SIGTERM handler to kill). Returns its exit code, or
    ``"timeout"`` after ``timeout`` s (its process tree killed)."""
    with open(log, "w") as lf:
        child["p"] = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=child_env())
        try:
            rc = child["p"].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(child["p"])
            rc = "timeout"
    child["p"] = None
    return rc


def stop_on_sigterm(child: dict, meta: dict, finish) -> None:
    """On SIGTERM (a suite's time limit): kill the running engine child (``child["p"]``), record
    ``meta["mode_status"]["interrupted"]`` and exit with ``finish(124)`` (the parent's partial
    results written)."""
    import signal

    def on_term(signum, frame):
        if child["p"] is not None:
            kill_tree(child["p"])
        meta["mode_status"].setdefault("interrupted", f"signal {signum}")
        sys.exit(finish(124))

    signal.signal(signal.SIGTERM, on_term)


def kill_tree(p) -> None:
    """SIGKILL a child and all its descendants (the Engine's scheduler/detokenizer processes), by pid."""
    try:
        import psutil

        procs = psutil.Process(p.pid).children(recursive=True)
    except Exception:
        procs = []
    for q in procs:
        try:
            q.kill()
        except Exception:
            pass
    if p.poll() is None:
        p.kill()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def read_child(path: str, mode: str) -> dict:
    """A child's result file, or ``{"mode": mode, "ok": False}`` when it is missing or cut short
    (a child killed while writing it): the parent then keeps what the child's log holds."""
    try:
        with open(path) as f:
            res = json.load(f)
        return res if isinstance(res, dict) else {"mode": mode, "ok": False}
    except (OSError, ValueError):
        return {"mode": mode, "ok": False}


def versions() -> dict:
    """``{package: version or None}`` of :data:`VERSION_PACKAGES`, and ``python``."""
    from importlib import metadata

    out = {}
    for p in VERSION_PACKAGES:
        try:
            out[p] = metadata.version(p)
        except Exception:
            out[p] = None
    out["python"] = sys.version.split()[0]
    return out


def hardware() -> str:
    """``nvidia-smi``'s GPU name, driver and memory line(s), or why it could not be read."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or "?"
    except Exception as ex:
        return f"nvidia-smi unavailable: {ex}"
