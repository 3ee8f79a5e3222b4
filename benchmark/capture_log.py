"""Capture cost of the target's verify graphs, read from a bench engine's log (issue #4 target:
capture time and graph memory no larger than upstream's).

Two log lines, both measured around the whole runner construction (buffers + every bucket's
warm-up and ``torch.cuda.graph`` capture), memory as the drop in free GPU memory
(``sglang.srt.utils.get_available_gpu_memory``, GiB = 2**30 bytes, which SGLang prints as "GB"):

* ours: ``VerifyCudaGraphRunner captured TARGET_VERIFY graphs: ... <s> s, <gib> GiB``
  (``sglang_verify_graph.sglang_adapter.capture_verify_runner``);
* upstream / plain: ``Capture target verify|decode CUDA graph end. elapsed=<s> s, mem usage=<gib> GB``
  (SGLang 0.5.16 ``model_runner_components/cuda_graph_setup.capture_decode_graph``).
"""

from __future__ import annotations

import re

OURS = re.compile(r"VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=(\[[^\]]*\]).*?"
                  r"([0-9.]+) s, (-?[0-9.]+) GiB")
MODE_KIND = {"ours": "ours", "upstream": "upstream verify", "plain": "plain decode"}  # bench mode -> kind
SGLANG = re.compile(r"Capture target (verify|decode) CUDA graph end\. elapsed=([0-9.]+) s, "
                    r"mem usage=(-?[0-9.]+) GB")


def target_capture(log_path: str) -> dict | None:
    """``{"kind": "ours"|"upstream verify"|"plain decode", "seconds": s, "gib": GiB}`` of the
    target's decode/verify graph capture in ``log_path`` (the first such line), or None."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return None
    m = OURS.search(text)
    if m:
        return {"kind": MODE_KIND["ours"], "capture_bs": m.group(1), "seconds": float(m.group(2)), "gib": float(m.group(3))}
    m = SGLANG.search(text)
    if m:
        kind = MODE_KIND["upstream"] if m.group(1) == "verify" else MODE_KIND["plain"]
        return {"kind": kind, "seconds": float(m.group(2)), "gib": float(m.group(3))}
    return None


def memory_ratio(ours_gib: float, upstream_gib: float, digits: int = 2) -> float | None:
    """Ours / upstream graph memory, or None unless both are positive drops (a server sharing the
    GPU can read negative, run 10: -0.946 GiB)."""
    return round(ours_gib / upstream_gib, digits) if ours_gib > 0 and upstream_gib > 0 else None


def format_capture(captures: dict) -> list[str]:
    """``RESULT capture`` lines, one per engine, plus ours / upstream ratios per step count."""
    lines = []
    for key, c in captures.items():
        if c:
            lines.append(f"RESULT capture {key}: {c['kind']} {c['seconds']:.2f} s, {c['gib']:.3f} GiB")
    for key, c in captures.items():
        up = captures.get(key.replace("ours", "upstream", 1)) if key.startswith("ours") else None
        mem = memory_ratio(c["gib"], up["gib"]) if c and up else None
        if mem is not None and c["kind"] == MODE_KIND["ours"] and up["seconds"] > 0:
            lines.append(f"RESULT capture {key} / upstream: time {c['seconds'] / up['seconds']:.2f}x, "
                         f"memory {mem:.2f}x")
    return lines
