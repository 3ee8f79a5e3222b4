"""The lab's server harness: start the stock ``python -m sglang.launch_server``, wait for it to
be healthy (optionally with a progress line), stop it with its process tree, send ``/generate``
and read the plugin's counters (every tensor-parallel rank's too). The demo, the e2e tests and the GPU tests all use it.

Always the stock ``python -m sglang.launch_server`` (the command users run; SGLang's
``popen_launch_server`` starts the ``sglang serve`` console script instead, which a PYTHONPATH
install such as the GPU machine's bundle does not have), polled on ``/health_generate``, and
stopped with SGLang's ``kill_process_tree``.

Shared-GPU mode (``scripts/gpu_job.sh`` with ``PARALLEL=1`` runs several test stages at once on
one GPU): with ``VERIFY_GRAPH_SHARED_GPU_TOKENS=N`` every server from :func:`launch_server` gets
:func:`shared_gpu_args` after its own flags, so its KV pool holds at most N tokens instead of a
fraction of whatever memory is free when it starts (SGLang sizes the pool from the free memory
it profiles at start-up; two servers profiling at the same moment would each count the other's
memory as theirs, and the second would stop with "Not enough memory").
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ACCEPT_PAIR_ARGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch",
                    "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache",
                    "--skip-tokenizer-init", "--grammar-backend", "none", "--mem-fraction-static", "0.4",
                    "--cuda-graph-max-bs-decode", "8", "--context-length", "4096", "--random-seed", "0"]
"""The server flags of the accept-pair e2e tests (``bench.models.accept_pair``'s pairs): triton,
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


class ServerStartError(RuntimeError):
    """A server that exited or was not healthy in time while starting; the message is one line
    naming the exit code or the timeout and the log."""


_NOISE = ("warnings.warn(", "UserWarning", "FutureWarning", "DeprecationWarning")


def last_log_line(path: str, limit: int = 4096) -> str:
    """The last non-empty line of a log file that is not a Python warning's echo ("" when there
    is none yet)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in tail.replace("\r", "\n").split("\n")
             if ln.strip() and not any(n in ln for n in _NOISE)]
    return lines[-1] if lines else ""


class Progress:
    """Start-up progress: one updating line on a terminal, else a line every ``every_s``."""

    def __init__(self, label: str, log_path: str, every_s: float = 5.0, stream=None):
        self.label, self.log_path, self.every_s = label, log_path, every_s
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last = -every_s
        self.width = 0

    def update(self, elapsed: float) -> None:
        if not self.tty and elapsed - self.last < self.every_s:
            return
        self.last = elapsed
        text = (f"  {self.label}: starting, {elapsed:4.0f} s | "
                f"{last_log_line(self.log_path) or '(log empty so far)'}")
        if self.tty:
            import shutil

            cols = shutil.get_terminal_size((120, 20)).columns - 1
            text = text[:cols]
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text[:200] + "\n")
        self.stream.flush()

    def done(self, message: str) -> None:
        if self.tty:
            self.stream.write("\r" + message.ljust(self.width) + "\n")
        else:
            self.stream.write(message + "\n")
        self.stream.flush()


def wait_healthy(proc, base_url: str, timeout_s: float, label: str = "", log_path: str | None = None,
                 poll_s: float = 2.0, progress: Progress | None = None, timeout_flag: str = "") -> float:
    """Poll ``base_url/health_generate`` every ``poll_s`` s until it answers 200; returns the
    seconds it took. ``progress`` (a :class:`Progress`) shows the wait; ``timeout_flag`` names the
    flag that set ``timeout_s`` in the timeout message. Raises
    :class:`ServerStartError` when ``proc`` exits first or after ``timeout_s`` s (the caller stops
    the server)."""
    import requests

    name = f"the {label} server" if label else "server"
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        rc = proc.poll()
        if rc is not None:
            if progress:
                progress.done(f"  {label}: exited")
            last = f" (last log line: {last_log_line(log_path)[:200]!r})" if log_path else ""
            raise ServerStartError(f"{name} exited with {rc} while starting{last}; log: {log_path}")
        if elapsed > timeout_s:
            if progress:
                progress.done(f"  {label}: not ready")
            flag = f" ({timeout_flag})" if timeout_flag else ""
            raise ServerStartError(f"{name} was not healthy after {timeout_s:.0f} s{flag}; log: {log_path}")
        try:
            if requests.get(f"{base_url}/health_generate", timeout=5).status_code == 200:
                if progress:
                    progress.done(f"  {label}: ready in {elapsed:.0f} s")
                return round(elapsed, 1)
        except requests.RequestException:
            pass
        if progress:
            progress.update(elapsed)
        time.sleep(poll_s)


def start_server(label: str, cmd: list[str], env: dict, base_url: str, log_path: str,
                 timeout_s: float, poll_s: float = 1.0, timeout_flag: str = ""):
    """Start one server from its full ``cmd`` with stdout+stderr to ``log_path`` and a progress
    line while it starts; returns ``(Popen, seconds to healthy)``. Raises
    :class:`ServerStartError` (one line with the log path) if it exits or is not healthy within
    ``timeout_s`` seconds (then it is stopped first; ``timeout_flag``: as for :func:`wait_healthy`)."""
    log = open(log_path, "w")
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()  # the child holds its own descriptor
    try:
        return proc, wait_healthy(proc, base_url, timeout_s, label, log_path, poll_s, Progress(label, log_path),
                                  timeout_flag)
    except BaseException:
        stop_server(proc)
        raise


def launch_server(model: str, base_url: str, args: list[str], env: dict | None = None,
                  log_path: str | None = None, timeout: float = 600):
    """Start the stock server for ``model`` with ``args``; returns the Popen. Raises
    :class:`ServerStartError` (a RuntimeError) if it exits or is not healthy in time.

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
    try:
        wait_healthy(proc, base_url, timeout, log_path=log_path)
    except ServerStartError:
        if proc.poll() is None:
            stop_server(proc)
        raise
    return proc


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
    ``kill_process_tree``; unwrapped servers get that at once. Then the tree is waited for (up
    to 60 s, and the server process 30 s more), so its GPU memory is free for the next one."""
    if not getattr(proc, "verify_graph_wrapped", False) or proc.poll() is not None:
        _kill_and_wait(proc)
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
    _kill_and_wait(proc)


def _kill_and_wait(proc) -> None:
    """SGLang's ``kill_process_tree`` on ``proc`` with a wait of up to 60 s (on failure, the
    direct child is killed), then ``proc`` reaped (up to 30 s)."""
    try:
        from sglang_verify_graph.compat import sglang_adapter

        sglang_adapter.kill_process_tree(proc.pid, wait_timeout=60)
    except Exception as ex:  # fall back to the direct child at least
        print(f"stop_server: kill_process_tree({proc.pid}) failed ({ex!r}); killing pid {proc.pid}", flush=True)
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def generate(base_url: str, body: dict, timeout: float = 300) -> dict:
    """POST ``body`` to ``/generate``; returns the JSON answer. Raises AssertionError on non-200."""
    import requests

    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout)
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:500]}"
    return r.json()


def plugin_state(base_url: str, rank: int = 0):
    """``/get_server_info`` ``internal_states[rank]["verify_cuda_graph"]`` (None without the flag)."""
    import requests

    st = requests.get(f"{base_url}/get_server_info", timeout=30).json()["internal_states"]
    return st[rank].get("verify_cuda_graph")


def verify_graph_states(base_url: str) -> list:
    """``internal_states[i]["verify_cuda_graph"]`` of every rank (``None`` entries without it)."""
    import requests

    info = requests.get(f"{base_url}/get_server_info", timeout=30).json()
    return [st.get("verify_cuda_graph") for st in info.get("internal_states") or []]


RANK_SHARED_COUNTERS = ("verify_steps", "verify_requests", "replays", "replayed_requests", "padded_rows",
                        "eager_requests", "fallbacks")
"""The verify counters every TP rank of one DP rank must hold alike: each runs the same verify steps
over the same batches and must take the same path (our graph or eager) with the same bucket, else
the all-reduces inside the step wait on each other (NCCL hang). Capture seconds and graph memory
are the rank's own."""


def tp_rank_counters(internal_states: list) -> list:
    """Every TP rank's verify counters from ``/get_server_info``'s ``internal_states`` (one dict per
    DP rank, TP rank 0's): a list per DP rank, indexed by TP rank, of ``verify_cuda_graph``
    snapshots (``None`` for a rank without them). Under TP the plugin gathers them as
    ``verify_cuda_graph_tp_ranks``; at TP 1 the list is ``[verify_cuda_graph]``."""
    return [list(st.get("verify_cuda_graph_tp_ranks") or [st.get("verify_cuda_graph")])
            for st in internal_states]


def rank_disagreement(ranks: list) -> "str | None":
    """``None`` when every TP rank of ``ranks`` (one DP rank's snapshots, as
    :func:`tp_rank_counters` lists them) has counters and holds rank 0's ``RANK_SHARED_COUNTERS``
    and draft-extend replays / padded rows / eager forwards; else one line naming the first rank
    that has none or differs, and how."""
    def shared(c):
        de = c.get("draft_extend") or {}
        return {**{k: c.get(k) for k in RANK_SHARED_COUNTERS},
                **{f"draft_extend_{k}": de.get(k) for k in ("replays", "padded_rows", "eager")}}

    for rank, c in enumerate(ranks):
        if c is None:
            return f"TP rank {rank} reports no verify counters (verify runner not installed there)"
    ref = shared(ranks[0]) if ranks else {}
    for rank, c in enumerate(ranks[1:], 1):
        diff = {k: (ref[k], v) for k, v in shared(c).items() if v != ref[k]}
        if diff:
            return f"TP rank {rank} differs from rank 0 (rank 0, rank {rank}): {diff}"
    return None


def verify_graph_tp_states(base_url: str) -> list:
    """:func:`tp_rank_counters` of the server at ``base_url`` (``/get_server_info``)."""
    import requests

    info = requests.get(f"{base_url}/get_server_info", timeout=30).json()
    return tp_rank_counters(info.get("internal_states") or [])
