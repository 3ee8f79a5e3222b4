"""CPU tier: ``bench/lib/capture_log.py`` reads the verify-graph capture cost of each bench engine
from its log (target: capture time and graph memory no larger than upstream's).

Failure mode guarded: the capture target judged from the wrong line (the draft's graphs, the
plain server's decode graph taken for upstream's verify) or from none. The lines are copied from
real bench engine logs.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lib import capture_log

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
        "seconds": 3.64, "gib": 0.133, "free_after_gib": None}  # a draft capture's end line is no figure
    assert capture_log.target_capture(_log(tmp_path, "upstream", UPSTREAM)) == {
        "kind": "upstream verify", "seconds": 2.27, "gib": 0.21, "free_after_gib": None}
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


def test_format_capture_gives_no_memory_ratio_for_a_negative_reading(tmp_path):
    """Under ``PARALLEL=1`` the free-memory drop can be negative (measured: -0.946 GiB): the time
    ratio stays, the memory ratio is ``-``."""
    caps = {"ours": capture_log.target_capture(_log(tmp_path, "o", OURS.replace("0.133 GiB", "-0.946 GiB"))),
            "upstream": capture_log.target_capture(_log(tmp_path, "u", UPSTREAM))}
    assert caps["ours"]["gib"] == -0.946
    assert "RESULT capture ours / upstream: time 1.60x, memory -" in capture_log.format_capture(caps)


# kimi-small, num_steps 2 (docs/runs/capture_kimi_small_steps2_repeats.json): both drops read
# negative in every start, and the draft's first capture line gives the free memory after the
# target's graphs.
KIMI_OURS = ("[2026-12-01 15:00:55] VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=[1, 2, 3, 4, 5, 6, "
             "7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32], num_draft_tokens=3 tokens/request, attention=chain "
             "split-KV (MLA), 3.93 s, -0.557 GiB\n"
             "[2026-12-01 15:00:55] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, "
             "3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32], avail mem=29.57 GB\n"
             "[2026-12-01 15:00:56] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=3, bs=[1], "
             "avail mem=29.49 GB\n")
KIMI_UPSTREAM = ("[2026-12-01 15:02:15] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=3, "
                 "bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32], avail mem=29.06 GB\n"
                 "[2026-12-01 15:02:18] Capture target verify CUDA graph end. elapsed=3.11 s, mem usage=-0.17 GB, "
                 "avail mem=29.23 GB.\n"
                 "[2026-12-01 15:02:18] Capture draft decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
                 "bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32], avail mem=29.23 GB\n")
# num_steps 1 has no draft decode graph: the draft extend capture is the next line
KIMI_OURS_STEPS1 = ("[2026-12-01 15:10:09] VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=[1, 2], "
                    "num_draft_tokens=2 tokens/request, attention=chain split-KV (MLA), 5.61 s, -0.578 GiB\n"
                    "[2026-12-01 15:10:09] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=2, "
                    "bs=[1, 2], avail mem=29.59 GB\n")


def test_free_memory_after_the_target_graphs_is_the_draft_capture_begin_line(tmp_path):
    """Failure mode: on the Kimi shape the drop reads negative for both modes, and a figure taken
    from the wrong line (the draft's later capture, the target's own begin line) compares two
    different moments of start-up."""
    o = capture_log.target_capture(_log(tmp_path, "ko", KIMI_OURS))
    u = capture_log.target_capture(_log(tmp_path, "ku", KIMI_UPSTREAM))
    assert (o["gib"], o["free_after_gib"]) == (-0.557, 29.57)
    assert (u["gib"], u["free_after_gib"]) == (-0.17, 29.23)
    assert capture_log.target_capture(_log(tmp_path, "k1", KIMI_OURS_STEPS1))["free_after_gib"] == 29.59
    assert capture_log.free_after_diff(o["free_after_gib"], u["free_after_gib"]) == 0.34
    assert capture_log.free_after_diff(o["free_after_gib"], None) is None
    lines = capture_log.format_capture({"ours": o, "upstream": u})
    assert "RESULT capture ours: ours 3.93 s, -0.557 GiB, 29.57 GiB free after" in lines
    assert "RESULT capture ours / upstream: time 1.26x, memory -, free after +0.34 GiB" in lines
    # the free figure must follow the target's line: a draft line before it does not count
    early = KIMI_UPSTREAM.splitlines(True)
    assert capture_log.target_capture(_log(tmp_path, "e", early[2] + early[0] + early[1]))["free_after_gib"] is None
    # only the next capture line counts: a later one (another graph's) is another moment
    later = KIMI_OURS.splitlines(True)
    skipped = later[0] + "[t] Capture draft prefill CUDA graph begin. backend=full, bs=[1], avail mem=30.01 GB\n" + later[1]
    assert capture_log.target_capture(_log(tmp_path, "n", skipped))["free_after_gib"] == 30.01
    no_avail = later[0] + "[t] Capture draft decode CUDA graph begin. backend=full\n" + later[2]
    assert capture_log.target_capture(_log(tmp_path, "na", no_avail))["free_after_gib"] is None
    # a plain server has no capture after its decode graphs; one side missing: no difference printed
    assert capture_log.target_capture(_log(tmp_path, "p", PLAIN))["free_after_gib"] is None
    one = capture_log.format_capture({"ours": o, "upstream": dict(u, free_after_gib=None)})
    assert "RESULT capture ours / upstream: time 1.26x, memory -" in one


def test_bench_table_prints_the_capture_lines(tmp_path):
    """``bench.verify.table.format_table`` (what the GPU job's summary keeps) carries ``meta.capture``."""
    from bench.verify import table as verify_table

    meta = {"model": "llama-8b", "mode_status": {"ours": "ok", "upstream": "ok"}, "hardware": "H200",
            "versions": {}, "flags": "-", "command": "-",
            "capture": {"ours": capture_log.target_capture(_log(tmp_path, "o", OURS)),
                        "upstream": capture_log.target_capture(_log(tmp_path, "u", UPSTREAM))}}
    text = verify_table.format_table([], meta)
    assert "RESULT capture upstream: upstream verify 2.27 s, 0.210 GiB" in text
    assert "RESULT capture ours / upstream: time 1.60x, memory 0.63x" in text
