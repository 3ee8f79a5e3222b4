"""The demo's servers and requests: start the stock server with progress, stop it with its
process tree, send ``/generate`` requests and read the counters (``demo.py`` drives it)."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import List, Optional

from bench.demo.report import (
    _fmt,
    DemoError,
    PROFILE_TAG,
    PROMPT_SEED,
    SPECULATIVE,
    decode_steps,
    median,
    profile_at_batch,
    step_ms,
)


# ----------------------------------------------------------------------------- servers

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def start_server(label: str, cmd: List[str], env: dict, base_url: str, log_path: str,
                 timeout_s: float):
    """Start one server with stdout+stderr to ``log_path``; returns ``(Popen, seconds to
    healthy)``. Polls ``/health_generate`` each second while showing progress. Raises
    :class:`DemoError` (one line with the log path) if it exits or is not healthy within
    ``timeout_s`` seconds (then it is stopped first)."""
    import subprocess

    import requests

    log = open(log_path, "w")
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    finally:
        log.close()  # the child holds its own descriptor
    progress = Progress(label, log_path)
    t0 = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - t0
            rc = proc.poll()
            if rc is not None:
                progress.done(f"  {label}: exited")
                raise DemoError(f"the {label} server exited with code {rc} while starting "
                                f"(last log line: {last_log_line(log_path)[:200]!r}); "
                                f"log: {log_path}")
            if elapsed > timeout_s:
                progress.done(f"  {label}: not ready")
                raise DemoError(f"the {label} server was not healthy after {timeout_s:.0f} s "
                                f"(--start-timeout); log: {log_path}")
            try:
                if requests.get(f"{base_url}/health_generate", timeout=5).status_code == 200:
                    progress.done(f"  {label}: ready in {elapsed:.0f} s")
                    return proc, round(elapsed, 1)
            except requests.RequestException:
                pass
            progress.update(elapsed)
            time.sleep(1.0)
    except BaseException:
        stop_server(proc)
        raise


def stop_server(proc) -> None:
    """Stop a server and every process it started (SGLang's ``kill_process_tree``), and wait
    for them, so the GPU memory is free for the next one."""
    import subprocess

    try:
        from sglang_verify_graph.compat import sglang_adapter

        sglang_adapter.kill_process_tree(proc.pid, wait_timeout=60)
    except Exception as ex:  # fall back to the direct child at least
        print(f"  warning: kill_process_tree({proc.pid}) failed ({ex!r}); killing pid {proc.pid}",
              flush=True)
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# ----------------------------------------------------------------------------- requests

def prompts(context: int, count: int, vocab: int, seed: int = PROMPT_SEED) -> List[List[int]]:
    """``count`` prompts of ``context`` random token ids in ``[10, vocab - 1)`` (the same ones on
    every server)."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 1) for _ in range(context)] for _ in range(count)]


def _generate(base_url: str, ids: List[int], new_tokens: int, timeout_s: float) -> tuple:
    """``(wall seconds, answer JSON)`` of one greedy ``/generate`` request."""
    import requests

    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens,
                                                  "temperature": 0.0, "ignore_eos": True}}
    t = time.perf_counter()
    r = requests.post(f"{base_url}/generate", json=body, timeout=timeout_s)
    wall = time.perf_counter() - t
    if r.status_code != 200:
        raise DemoError(f"/generate answered HTTP {r.status_code}: {r.text[:200]!r}")
    return wall, r.json()


def _concurrent(base_url: str, batch: List[List[int]], new_tokens: int, timeout_s: float) -> tuple:
    """``(wall seconds from the first send to the last answer, answers)`` of one request per
    prompt, all in flight at once."""
    from concurrent.futures import ThreadPoolExecutor

    t = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        answers = [w_out[1] for w_out in pool.map(
            lambda ids: _generate(base_url, ids, new_tokens, timeout_s), batch)]
    return time.perf_counter() - t, answers


def verify_graph_states(base_url: str) -> List[Optional[dict]]:
    """``internal_states[i]["verify_cuda_graph"]`` of every rank (``None`` entries without it)."""
    import requests

    info = requests.get(f"{base_url}/get_server_info", timeout=30).json()
    return [st.get("verify_cuda_graph") for st in info.get("internal_states") or []]


def measure_server(mode: str, base_url: str, a: argparse.Namespace, log_path: str) -> dict:
    """Requests against one running server (module docstring, step 3) and its numbers: times in
    seconds (``*_s``) and milliseconds (``*_ms``), throughput in output tokens per second."""
    c1_prompt, *batch = prompts(a.context, 1 + a.concurrency, a.vocab_size)
    t_out = a.request_timeout
    _generate(base_url, c1_prompt, a.new_tokens, t_out)  # warm-up: prefix cached, graphs warm
    rounds = []
    for _ in range(a.repeats):
        t1, _ = _generate(base_url, c1_prompt, 1, t_out)
        tn, ans = _generate(base_url, c1_prompt, a.new_tokens, t_out)
        meta = ans.get("meta_info", {})
        done = int(meta.get("completion_tokens") or len(ans.get("output_ids") or []))
        steps = decode_steps(mode, meta, done)
        rounds.append({"t1_s": round(t1, 4), "tn_s": round(tn, 4), "steps": steps,
                       "completion_tokens": done, "step_ms": step_ms(t1, tn, steps),
                       "tok_s": done / tn if tn > 0 else None,
                       "accept_length": meta.get("spec_accept_length"),
                       "output_ids": ans.get("output_ids")})
    print(f"  {mode}: c=1 step ms {_fmt([r['step_ms'] for r in rounds])}", flush=True)
    _concurrent(base_url, batch, 4, t_out)  # warm-up: prefixes cached
    rounds_n = []
    for _ in range(a.repeats):
        wall, answers = _concurrent(base_url, batch, a.new_tokens, t_out)
        done = sum(int(x.get("meta_info", {}).get("completion_tokens") or 0) for x in answers)
        rounds_n.append({"wall_s": round(wall, 4), "completion_tokens": done,
                         "tok_s": done / wall if wall > 0 else None})
    print(f"  {mode}: c={a.concurrency} tok/s {_fmt([r['tok_s'] for r in rounds_n], 1)}",
          flush=True)
    out = {"step_ms_c1": median(r["step_ms"] for r in rounds),
           "tok_s_c1": median(r["tok_s"] for r in rounds),
           "tok_s_cN": median(r["tok_s"] for r in rounds_n),
           "accept_length": median(r["accept_length"] for r in rounds),
           "output_ids_c1": rounds[0]["output_ids"],
           "rounds_c1": [{k: v for k, v in r.items() if k != "output_ids"} for r in rounds],
           "rounds_cN": rounds_n,
           "verify_cuda_graph": verify_graph_states(base_url)}
    same = all(r["output_ids"] == rounds[0]["output_ids"] for r in rounds)
    out["c1_outputs_repeatable"] = same
    if mode in SPECULATIVE:
        time.sleep(1.0)  # let the last profile line reach the log
        with open(log_path, errors="replace") as f:
            lines = [ln for ln in f if PROFILE_TAG in ln]
        out["profile_c1"] = profile_at_batch(lines, 1)
        out["profile_cN"] = profile_at_batch(lines, a.concurrency)
        out["profile_lines"] = len(lines)
        out["verify_ms_c1"] = (out["profile_c1"] or {}).get("verify_ms")
    return out
