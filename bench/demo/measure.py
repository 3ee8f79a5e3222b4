"""The demo's requests against one running server and its numbers (``bench.demo.cli`` drives
it; the server itself comes from ``bench.lib.server``)."""

from __future__ import annotations

import argparse
import random
import time
from typing import List

from bench.demo.report import (
    _fmt,
    DemoError,
    PROMPT_SEED,
    SPECULATIVE,
    decode_steps,
    median,
    profile_at_batch,
    step_ms,
)
from bench.lib.profile_log import read_profile_lines
from bench.lib.server import verify_graph_states


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
        lines = read_profile_lines(log_path)
        out["profile_c1"] = profile_at_batch(lines, 1)
        out["profile_cN"] = profile_at_batch(lines, a.concurrency)
        out["profile_lines"] = len(lines)
        out["verify_ms_c1"] = (out["profile_c1"] or {}).get("verify_ms")
    return out
