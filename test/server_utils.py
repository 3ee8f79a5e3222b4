"""Launch / stop a real SGLang server for the GPU-machine tests.

Always the stock ``python -m sglang.launch_server`` (the command users run; SGLang's
``popen_launch_server`` starts the ``sglang serve`` console script instead, which a PYTHONPATH
install such as the GPU machine's bundle does not have), polled on ``/health_generate``, and
stopped with SGLang's ``kill_process_tree``.

Shared-GPU mode (``scripts/gpu_job.sh`` with ``PARALLEL=1`` runs several test stages at once on
the one H200): with ``VERIFY_GRAPH_SHARED_GPU_TOKENS=N`` every test server gets
:func:`shared_gpu_args` after its own flags, so its KV pool holds at most N tokens instead of a
fraction of whatever memory is free when it starts (SGLang 0.5.16 sizes the pool as free memory
minus ``(1 - mem_fraction_static)`` x the free memory before model load,
``mem_cache/kv_cache_configurator.py::_profile_available_bytes``; two servers profiling at the
same moment would each count the other's memory as theirs, and the second would stop with "Not
enough memory").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import requests

ACCEPT_PAIR_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                    "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache",
                    "--skip-tokenizer-init", "--grammar-backend", "none", "--mem-fraction-static", "0.4",
                    "--cuda-graph-max-bs-decode", "8", "--context-length", "4096", "--random-seed", "0"]
"""The server flags of the accept-pair e2e tests (``bench/models/accept_pair.py``'s pairs): triton,
greedy over token ids (no tokenizer, no radix cache), decode buckets up to 8 requests."""

SHARED_GPU_ENV = "VERIFY_GRAPH_SHARED_GPU_TOKENS"
SHARED_GPU_MEM_FRACTION = 0.95
"""``--mem-fraction-static`` in shared-GPU mode: the budget check passes whatever the other
servers hold (their pools are capped), and ``--max-total-tokens`` caps this one's."""


def shared_gpu_args() -> list[str]:
    """``["--mem-fraction-static", "0.95", "--max-total-tokens", N]`` when
    ``VERIFY_GRAPH_SHARED_GPU_TOKENS=N`` (tokens per server KV pool) is set, else ``[]``.
    Raises ValueError when N is not a positive integer."""
    raw = os.environ.get(SHARED_GPU_ENV, "").strip()
    if not raw:
        return []
    n = int(raw)
    if n <= 0:
        raise ValueError(f"{SHARED_GPU_ENV}={raw!r}: want a positive token count")
    return ["--mem-fraction-static", str(SHARED_GPU_MEM_FRACTION), "--max-total-tokens", str(n)]


def shared_gpu_kwargs() -> dict:
    """:func:`shared_gpu_args` as ``sglang.Engine`` keyword arguments (``{}`` when unset)."""
    a = shared_gpu_args()
    return {"mem_fraction_static": float(a[1]), "max_total_tokens": int(a[3])} if a else {}


def launch_server(model: str, base_url: str, args: list[str], env: dict | None = None,
                  log_path: str | None = None, timeout: float = 600):
    """Start the stock server; returns the Popen. Raises RuntimeError if not healthy in time.

    ``VERIFY_GRAPH_SERVER_WRAPPER`` (env of the test process), e.g. ``"compute-sanitizer --tool
    memcheck --target-processes all"``, is put in front of the command; ``VERIFY_GRAPH_SERVER_TIMEOUT``
    (s) then overrides ``timeout``. :func:`shared_gpu_args` go last (argparse: the last value
    wins)."""
    import shlex

    out = open(log_path, "w") if log_path else None
    host, port = base_url.rsplit(":", 1)
    wrapper = shlex.split(os.environ.get("VERIFY_GRAPH_SERVER_WRAPPER", ""))
    if wrapper:
        timeout = float(os.environ.get("VERIFY_GRAPH_SERVER_TIMEOUT", timeout))
    cmd = [*wrapper, sys.executable, "-m", "sglang.launch_server", "--model-path", model,
           "--host", host.split("//")[-1], "--port", port, *args, *shared_gpu_args()]
    proc = subprocess.Popen(cmd, env=env or dict(os.environ), stdout=out or subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    proc.verify_graph_wrapped = bool(wrapper)  # stop_server: let the wrapper exit by itself
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} (log: {log_path})")
        try:
            if requests.get(f"{base_url}/health_generate", timeout=5).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        time.sleep(2)
    stop_server(proc)
    raise RuntimeError(f"server not healthy after {timeout}s (log: {log_path})")


STOP_GRACE_ENV = "VERIFY_GRAPH_SERVER_STOP_GRACE_S"


def _server_under_wrapper(wrapper, tree):
    """The ``sglang.launch_server`` process under ``wrapper`` (a ``psutil.Process``; ``tree``:
    its descendants): the one whose command line names it and under which no other does (a
    launcher that compute-sanitizer may put in between carries the same words in its arguments;
    the server's own spawned schedulers do not), else the wrapper's first direct child, else None."""
    import psutil

    def names_server(p):
        try:
            return "sglang.launch_server" in " ".join(p.cmdline())
        except psutil.Error:
            return False

    matches = [p for p in tree if names_server(p)]
    for m in matches:
        try:
            below = {d.pid for d in m.children(recursive=True)}
        except psutil.Error:
            continue
        if not any(o.pid in below for o in matches):
            return m
    direct = wrapper.children()
    return direct[0] if direct else None


def stop_server(proc) -> None:
    """Stop a server from :func:`launch_server` and everything it started.

    Started under ``VERIFY_GRAPH_SERVER_WRAPPER`` (compute-sanitizer), the server process under the
    wrapper first gets SIGTERM, SGLang's graceful stop (``tokenizer_manager.sigterm_watchdog``: a
    ``ShutdownReq`` lets the schedulers exit in user space), and the wrapper gets up to
    ``VERIFY_GRAPH_SERVER_STOP_GRACE_S`` seconds (default 120) to exit by itself: compute-sanitizer
    writes its ``ERROR SUMMARY`` only when its targets have exited, and a SIGKILLed frontend leaves
    a report with no summary. If the server has already exited, the wrapper is only
    waited for. Then every process of the tree still alive (listed before the signal, so that none
    is lost when the wrapper is reaped) is killed, and the wrapper with SGLang's
    ``kill_process_tree``; unwrapped servers get that at once."""
    from sglang.srt.utils import kill_process_tree

    if not getattr(proc, "verify_graph_wrapped", False) or proc.poll() is not None:
        kill_process_tree(proc.pid)
        return
    import signal

    import psutil

    try:
        wrapper = psutil.Process(proc.pid)
        tree = wrapper.children(recursive=True)
        server = _server_under_wrapper(wrapper, tree)
        if server is not None:
            print(f"stop_server: SIGTERM to pid {server.pid} ({' '.join(server.cmdline()[:3])} ...) "
                  f"under wrapper pid {proc.pid}", flush=True)
            server.send_signal(signal.SIGTERM)
    except psutil.Error:
        tree = []
    try:
        proc.wait(timeout=float(os.environ.get(STOP_GRACE_ENV, "120")))
    except subprocess.TimeoutExpired:
        pass
    for p in tree:  # survivors of the graceful stop (the wrapper's own tree is gone once reaped)
        try:
            p.kill()
        except psutil.Error:
            pass
    kill_process_tree(proc.pid)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(base_url: str, body: dict, timeout: float = 300) -> dict:
    """POST ``body`` to ``/generate``; returns the JSON answer. Raises AssertionError on non-200."""
    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout)
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:500]}"
    return r.json()


def plugin_state(base_url: str, rank: int = 0):
    """``/get_server_info`` ``internal_states[rank]["verify_cuda_graph"]`` (None without the flag)."""
    st = requests.get(f"{base_url}/get_server_info", timeout=30).json()["internal_states"]
    return st[rank].get("verify_cuda_graph")
