"""``python -m bench kernel``: its dry run names the kernel's row-block policy per shape and draft
length, takes ``--block-rows`` of the kernel's choices and refuses others (exit 2); the tuning
grid is the bench's own (no kernel knob), and its split count is a power of two within the cap."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def _kernel(*args):
    return subprocess.run([sys.executable, "-m", "bench", "kernel", *args], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=str(ROOT))


def test_bench_kernel_dry_run_and_block_rows_check():
    r = _kernel("--dry-run", "--shapes", "kimi_tp8_mla", "--ndt", "3", "6", "--block-rows", "16", "32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kimi_tp8_mla ndt=3 policy block_r=32" in r.stdout
    assert "kimi_tp8_mla ndt=6 policy block_r=16" in r.stdout and "forced=[16, 32]" in r.stdout
    bad = _kernel("--dry-run", "--block-rows", "24")
    assert bad.returncode == 2 and "--block-rows [24]" in bad.stderr


def test_tune_grid_and_split_count():
    from bench import kernel
    from sglang_verify_graph.kernel import ChainVerifyShape

    cands = kernel.tune_candidates()
    assert len(cands) == 36 and all(set(c) == set(kernel.TUNE_GRID) for c in cands)
    shape = ChainVerifyShape(8, 1, 576, 512, 3, 64)
    for pps in (2, 4, 8):
        n = kernel.tune_splits(shape, 8, 132, pps, 256)
        assert n & (n - 1) == 0 and 1 <= n <= 256
    assert kernel.tune_splits(shape, 1, 132, 8, 16) == 16  # capped
    assert kernel.tune_splits(shape, 1, 132, 2, 256) == 256  # 2 * 132 / 1 = 264 -> 512, capped at 256
