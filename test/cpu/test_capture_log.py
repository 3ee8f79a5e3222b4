"""CPU tier: ``benchmark/capture_log.py`` reads the verify-graph capture cost of each bench engine
from its log (issue #4 target: capture time and graph memory no larger than upstream's).

Failure mode guarded: the capture target judged from the wrong line (the draft's graphs, the
plain server's decode graph taken for upstream's verify) or from none. The lines are copied from
run 10's engine logs (``docs/runs/run10_log_excerpts.txt``).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import capture_log  # noqa: E402

OURS = ("[2026-12-01 11:14:17] VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=[1, 2, 3, 4, 5, 6, 7, 8, "
        "10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32], num_draft_tokens=4 tokens/request, attention=chain "
        "split-KV (MHA), 3.64 s, 0.133 GiB\n"
        "[2026-12-01 11:14:19] Capture draft decode CUDA graph end. elapsed=2.33 s, mem usage=0.10 GB, avail mem=28.66 GB.\n")
UPSTREAM = ("[2026-12-01 11:16:21] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1], avail mem=28.94 GB\n"
            "[2026-12-01 11:16:23] Capture target verify CUDA graph end. elapsed=2.27 s, mem usage=0.21 GB, avail mem=28.72 GB.\n"
            "[2026-12-01 11:16:24] Capture draft decode CUDA graph end. elapsed=1.07 s, mem usage=0.11 GB, avail mem=28.62 GB.\n")
PLAIN = "[x] Capture target decode CUDA graph end. elapsed=2.56 s, mem usage=0.08 GB, avail mem=28.86 GB.\n"


def _log(tmp_path, name, text):
    p = tmp_path / f"bench_{name}.log"
    p.write_text(text)
    return str(p)


def test_target_capture_reads_the_target_line_of_each_engine(tmp_path):
    assert capture_log.target_capture(_log(tmp_path, "ours", OURS)) == {
        "kind": "ours", "capture_bs": "[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32]",
        "seconds": 3.64, "gib": 0.133}
    assert capture_log.target_capture(_log(tmp_path, "upstream", UPSTREAM)) == {
        "kind": "upstream verify", "seconds": 2.27, "gib": 0.21}
    assert capture_log.target_capture(_log(tmp_path, "plain", PLAIN))["kind"] == "plain decode"
    assert capture_log.target_capture(_log(tmp_path, "draft_only", OURS.splitlines()[1])) is None
    assert capture_log.target_capture(str(tmp_path / "missing.log")) is None


def test_format_capture_ratios_pair_ours_with_upstream_of_the_same_steps(tmp_path):
    caps = {"ours@3": capture_log.target_capture(_log(tmp_path, "o", OURS)),
            "upstream@3": capture_log.target_capture(_log(tmp_path, "u", UPSTREAM)),
            "plain": capture_log.target_capture(_log(tmp_path, "p", PLAIN)),
            "ours@2": None}
    lines = capture_log.format_capture(caps)
    assert "RESULT capture ours@3: ours 3.64 s, 0.133 GiB" in lines
    assert "RESULT capture ours@3 / upstream: time 1.60x, memory 0.63x" in lines
    assert not any(ln.startswith("RESULT capture ours@2") for ln in lines)
    assert len(lines) == 4


def test_format_capture_gives_no_ratio_for_a_negative_memory_reading(tmp_path):
    """Under ``PARALLEL=1`` the free-memory drop can be negative (run 10: -0.946 GiB)."""
    caps = {"ours": capture_log.target_capture(_log(tmp_path, "o", OURS.replace("0.133 GiB", "-0.946 GiB"))),
            "upstream": capture_log.target_capture(_log(tmp_path, "u", UPSTREAM))}
    assert caps["ours"]["gib"] == -0.946
    assert not any("/ upstream" in ln for ln in capture_log.format_capture(caps))


def test_bench_table_prints_the_capture_lines(tmp_path):
    """``bench_verify.format_table`` (what the GPU job's summary keeps) carries ``meta.capture``."""
    import bench_verify as bv

    meta = {"model": "llama-8b", "mode_status": {"ours": "ok", "upstream": "ok"}, "hardware": "H200",
            "versions": {}, "flags": "-", "command": "-",
            "capture": {"ours": capture_log.target_capture(_log(tmp_path, "o", OURS)),
                        "upstream": capture_log.target_capture(_log(tmp_path, "u", UPSTREAM))}}
    text = bv.format_table([], meta)
    assert "RESULT capture upstream: upstream verify 2.27 s, 0.210 GiB" in text
    assert "RESULT capture ours / upstream: time 1.60x, memory 0.63x" in text
