"""Capture cost of the target's verify graphs, read from a bench engine's log (target:
capture time and graph memory no larger than upstream's).

Two log lines, both measured around the whole runner construction (buffers + every bucket's
warm-up and ``torch.cuda.graph`` capture), memory as the drop in free GPU memory
(``sglang.srt.utils.get_available_gpu_memory``, GiB = 2**30 bytes, which SGLang prints as "GB"):

* ours: ``VerifyCudaGraphRunner captured TARGET_VERIFY graphs: ... <s> s, <gib> GiB``
  (``sglang_verify_graph.capture.capture_verify_runner``);
* upstream / plain: ``Capture target verify|decode CUDA graph end. elapsed=<s> s, mem usage=<gib> GB``
  (SGLang 0.5.16 ``model_runner_components/cuda_graph_setup.capture_decode_graph``).

The drop can read negative (Kimi shape at num_steps 2: -0.557 GiB for ours, -0.17 GiB
for upstream's graph in every start; upstream's reads -0.32 to +0.29 GiB at other draft lengths):
the target's construction frees memory that was held before it, so the drop is no graph-memory
figure there. What both modes can be compared on is the free GPU memory once the target's graphs
exist (``free_after_gib``): the ``avail mem=<GiB> GB`` of the next SGLang ``Capture ... CUDA graph
begin`` line after the target's (the EAGLE-3 draft's first graph, captured right after the
target's; on the Kimi shape it equals the ``avail mem`` of upstream's own capture end line). None
when the next capture line is missing (a plain server, the draft's graphs disabled). Like the drop
it is GPU-wide: meaningless while another process shares the GPU (``PARALLEL=1``).
"""

from __future__ import annotations

import re

OURS = re.compile(r"VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=(\[[^\]]*\]).*?"
                  r"([0-9.]+) s, (-?[0-9.]+) GiB")
MODE_KIND = {"ours": "ours", "upstream": "upstream verify", "plain": "plain decode"}  # bench mode -> kind
SGLANG = re.compile(r"Capture target (verify|decode) CUDA graph end\. elapsed=([0-9.]+) s, "
                    r"mem usage=(-?[0-9.]+) GB")
NEXT_BEGIN = re.compile(r"Capture [^\n]*? CUDA graph begin\.[^\n]*")
AVAIL = re.compile(r"avail mem=([0-9.]+) GB")


def _free_after(text: str, pos: int) -> float | None:
    """``avail mem`` (GiB) of the first capture-begin line after ``pos``, or None."""
    line = NEXT_BEGIN.search(text, pos)
    m = AVAIL.search(line.group(0)) if line else None
    return float(m.group(1)) if m else None


def target_capture(log_path: str) -> dict | None:
    """``{"kind": "ours"|"upstream verify"|"plain decode", "seconds": s, "gib": GiB,
    "free_after_gib": GiB or None}`` of the target's decode/verify graph capture in ``log_path``
    (the first such line; ours adds ``capture_bs``), or None."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return None
    m = OURS.search(text)
    if m:
        return {"kind": MODE_KIND["ours"], "capture_bs": m.group(1), "seconds": float(m.group(2)),
                "gib": float(m.group(3)), "free_after_gib": _free_after(text, m.end())}
    m = SGLANG.search(text)
    if m:
        kind = MODE_KIND["upstream"] if m.group(1) == "verify" else MODE_KIND["plain"]
        return {"kind": kind, "seconds": float(m.group(2)), "gib": float(m.group(3)),
                "free_after_gib": _free_after(text, m.end())}
    return None


def free_after_diff(ours_gib: float | None, upstream_gib: float | None) -> float | None:
    """GiB more free GPU memory after ours' target graphs than after upstream's (negative: less),
    from two ``free_after_gib`` figures (one log's, or a median); None unless both exist."""
    return None if ours_gib is None or upstream_gib is None else round(ours_gib - upstream_gib, 3)


def memory_ratio(ours_gib: float, upstream_gib: float, digits: int = 2) -> float | None:
    """Ours / upstream graph memory, or None unless both are positive drops (a server sharing the
    GPU can read negative, e.g. -0.946 GiB)."""
    return round(ours_gib / upstream_gib, digits) if ours_gib > 0 and upstream_gib > 0 else None


def format_capture(captures: dict) -> list[str]:
    """``RESULT capture`` lines, one per engine, plus ours / upstream per step count: time ratio,
    memory-drop ratio (``-`` unless both drops are positive) and the free-memory difference after
    the target's graphs (``free_after_diff``, when both logs have it)."""
    lines = []
    for key, c in captures.items():
        if c:
            free = c.get("free_after_gib")
            lines.append(f"RESULT capture {key}: {c['kind']} {c['seconds']:.2f} s, {c['gib']:.3f} GiB"
                         + ("" if free is None else f", {free:.2f} GiB free after"))
    for key, c in captures.items():
        up = captures.get(key.replace("ours", "upstream", 1)) if key.startswith("ours") else None
        if not (c and up and c["kind"] == MODE_KIND["ours"] and up["seconds"] > 0):
            continue
        mem, diff = memory_ratio(c["gib"], up["gib"]), free_after_diff(c.get("free_after_gib"), up.get("free_after_gib"))
        lines.append(f"RESULT capture {key} / upstream: time {c['seconds'] / up['seconds']:.2f}x, "
                     f"memory {'-' if mem is None else f'{mem:.2f}x'}"
                     + ("" if diff is None else f", free after {diff:+.2f} GiB"))
    return lines
