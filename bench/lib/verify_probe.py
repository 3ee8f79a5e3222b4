"""CUDA-event probe of SGLang's graph runners, installed inside the scheduler process.

``install_probe()`` wraps ``execute`` of DecodeCudaGraphRunner, sglang_verify_graph's
VerifyCudaGraphRunner, EAGLEDraftCudaGraphRunner and EAGLEDraftExtendCudaGraphRunner: CUDA events
are recorded before/after the outermost call per runner instance (a reentrancy guard skips e.g.
our runner's ``super().execute``) and read back later without synchronizing the step; host ms is
taken with ``time.perf_counter``. Keys: ``class|worker|forward mode|raw bs|padded bs``. The lists
are drained (and reset) into ``Scheduler.get_internal_state()["bench_probe"]``, i.e. fetched with
``Engine.get_server_info()["internal_states"][0]["bench_probe"]`` = {key: {"gpu_ms": [...],
"host_ms": [...]}} (ms per replay). ``summarize_probe`` groups them into roles.

``run_scheduler_process`` is what a probed engine (``bench.lib.engine.start_engine``) starts as
its scheduler process instead of SGLang's (``Engine.run_scheduler_process_func``): spawn pickles
it by name, so the scheduler imports this module as ``bench.lib.verify_probe`` (the repository
root on its ``sys.path``, which spawn copies from the engine's process), installs the probe, then
runs SGLang's own function with the same arguments.
"""
from __future__ import annotations

import collections
import os
import statistics
import sys
import time

RUNNERS = [("sglang.srt.model_executor.runner.decode_cuda_graph_runner", "DecodeCudaGraphRunner"),
           ("sglang_verify_graph.runner", "VerifyCudaGraphRunner"),
           ("sglang.srt.speculative.eagle_draft_cuda_graph_runner", "EAGLEDraftCudaGraphRunner"),
           ("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner", "EAGLEDraftExtendCudaGraphRunner")]


def install_probe():
    """Wrap runner ``execute`` with CUDA events; expose drained results in the scheduler's internal state."""
    import functools
    import importlib

    import torch

    pending, gpu, host = [], collections.defaultdict(list), collections.defaultdict(list)

    def flush(final):
        keep = []
        for k, s, e in pending:
            if final:
                e.synchronize()
            if final or e.query():
                gpu[k].append(round(s.elapsed_time(e), 4))
            else:
                keep.append((k, s, e))
        pending[:] = keep

    def drain():
        flush(True)
        out = {k: {"gpu_ms": gpu[k], "host_ms": host.get(k, [])} for k in gpu}
        gpu.clear(), host.clear()
        return out

    def wrap(cls):
        orig = cls.__dict__.get("execute")
        if orig is None:
            return False

        runner_name = cls.__name__  # the class whose execute runs: a subclass that only adds a
        # constructor (our runner as SGLang 0.5.17+ builds it) is counted as its base

        @functools.wraps(orig)
        def execute(self, forward_batch, *a, **k):
            if getattr(self, "_bench_probe_active", False):  # e.g. our runner calling super().execute
                return orig(self, forward_batch, *a, **k)
            self._bench_probe_active = True
            try:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                s.record()
                r = orig(self, forward_batch, *a, **k)
                e.record()
                h = (time.perf_counter() - t0) * 1000.0
            finally:
                self._bench_probe_active = False
            try:
                w = "draft" if self.model_runner.is_draft_worker else "target"
                raw = getattr(self, "raw_bs", None) or forward_batch.batch_size
                key = f"{runner_name}|{w}|{forward_batch.forward_mode.name}|{raw}|{getattr(self, 'bs', '?')}"
            except Exception:
                key = f"{runner_name}|?|?|?|?"
            pending.append((key, s, e))
            host[key].append(round(h, 4))
            if len(pending) >= 512:
                flush(False)
            return r

        cls.execute = execute
        return True

    wrapped = []
    for mod, name in RUNNERS:
        try:
            if wrap(getattr(importlib.import_module(mod), name)):
                wrapped.append(name)
        except Exception as ex:  # e.g. the plugin is not installed
            print(f"PROBE cannot wrap {name}: {type(ex).__name__}: {ex}", file=sys.stderr, flush=True)
    from sglang.srt.managers.scheduler import Scheduler

    orig_gis = Scheduler.get_internal_state

    @functools.wraps(orig_gis)
    def get_internal_state(self, recv_req):
        out = orig_gis(self, recv_req)
        try:
            out.internal_state["bench_probe"] = drain()
        except Exception as ex:
            print(f"PROBE drain failed: {ex!r}", file=sys.stderr, flush=True)
        return out

    Scheduler.get_internal_state = get_internal_state
    print(f"PROBE installed in pid {os.getpid()}: {wrapped}", file=sys.stderr, flush=True)


def run_scheduler_process(*args, **kwargs):
    """The scheduler process of a probed engine: :func:`install_probe` (a failure is printed and
    the engine runs without it), then SGLang's ``run_scheduler_process(*args, **kwargs)``."""
    try:
        install_probe()
    except Exception as ex:  # keep the engine running without the probe
        print(f"PROBE install failed: {ex!r}", file=sys.stderr, flush=True)
    from sglang.srt.managers.scheduler import run_scheduler_process as run

    return run(*args, **kwargs)


ROLES = {"target_decode": ("target", "DECODE"), "target_verify": ("target", "TARGET_VERIFY"),
         "draft_decode": ("draft", "DECODE"), "draft_extend": ("draft", "DRAFT_EXTEND")}
DRAFT_CLASSES = {"EAGLEDraftCudaGraphRunner": "draft_decode", "EAGLEDraftExtendCudaGraphRunner": "draft_extend"}


def role_of(cls: str, worker: str, mode: str):
    """target_decode / target_verify / draft_decode / draft_extend, or None (e.g. IDLE)."""
    if cls in DRAFT_CLASSES:
        return DRAFT_CLASSES[cls]
    return next((r for r, (w, m) in ROLES.items() if w == worker and mode.startswith(m)), None)


def _median(v):
    return round(statistics.median(v), 4) if v else None


def _q(v, p):
    return round(sorted(v)[min(len(v) - 1, int(p * len(v)))], 4) if v else None


def summarize_probe(probe: dict, bs: int) -> dict:
    """Group raw probe lists into roles (only replays at raw batch size ``bs``); ms per replay."""
    roles, other = {}, {}
    for key, v in probe.items():
        cls, worker, mode, raw, pad = (key.split("|") + ["?"] * 5)[:5]
        role = role_of(cls, worker, mode)
        if role is None or raw != str(bs):
            other[key] = len(v["gpu_ms"])
            continue
        d = roles.setdefault(role, {"gpu": [], "host": [], "classes": set(), "padded_bs": set()})
        d["gpu"] += v["gpu_ms"]
        d["host"] += v["host_ms"]
        d["classes"].add(cls)
        d["padded_bs"].add(pad)
    out = {r: {"n": len(d["gpu"]), "gpu_ms": _median(d["gpu"]), "gpu_ms_p10": _q(d["gpu"], 0.1),
               "gpu_ms_p90": _q(d["gpu"], 0.9), "host_ms": _median(d["host"]),
               "classes": sorted(d["classes"]), "padded_bs": sorted(d["padded_bs"])} for r, d in roles.items()}
    return {"roles": out, "other_keys": other}
