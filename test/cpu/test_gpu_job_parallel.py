"""CPU tier: the shared-GPU mode of the GPU job (``scripts/gpu_job.sh`` -> ``python3 -m bench.suites``,
``PARALLEL=1``).

Failure modes guarded: stages run at once on the one H200 each start servers that size their KV
pool from the memory free at start-up (SGLang 0.5.16), so a second server profiling at the same
moment stops with "Not enough memory" unless every test server gets the capped pool flags, and
they must come *after* the test's own ``--mem-fraction-static`` (argparse keeps the last one);
the parallel suites and the ``wait`` barrier must run what they name.
"""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "test"))
import server_utils  # noqa: E402


def test_shared_gpu_args_off_by_default(monkeypatch):
    monkeypatch.delenv(server_utils.SHARED_GPU_ENV, raising=False)
    assert server_utils.shared_gpu_args() == [] and server_utils.shared_gpu_kwargs() == {}


def test_shared_gpu_args_and_kwargs(monkeypatch):
    monkeypatch.setenv(server_utils.SHARED_GPU_ENV, "65536")
    assert server_utils.shared_gpu_args() == ["--mem-fraction-static", "0.95", "--max-total-tokens", "65536"]
    assert server_utils.shared_gpu_kwargs() == {"mem_fraction_static": 0.95, "max_total_tokens": 65536}


@pytest.mark.parametrize("bad", ["0", "-5", "many"])
def test_shared_gpu_tokens_must_be_positive(monkeypatch, bad):
    monkeypatch.setenv(server_utils.SHARED_GPU_ENV, bad)
    with pytest.raises(ValueError):
        server_utils.shared_gpu_args()


def test_launch_server_puts_the_shared_flags_last(monkeypatch):
    monkeypatch.setenv(server_utils.SHARED_GPU_ENV, "1024")
    seen = {}

    class Exited:
        returncode = 3

        def __init__(self, cmd, **kw):
            seen["cmd"] = cmd

        def poll(self):
            return 3

    monkeypatch.setattr(server_utils.subprocess, "Popen", Exited)
    with pytest.raises(RuntimeError, match="exited with 3"):
        server_utils.launch_server("/m", "http://127.0.0.1:1", ["--mem-fraction-static", "0.4"])
    cmd = seen["cmd"]
    assert cmd[-4:] == ["--mem-fraction-static", "0.95", "--max-total-tokens", "1024"]
    assert cmd.index("0.4") < cmd.index("0.95")


def test_parallel_dry_run_runs_each_stage_and_the_barrier(gpu_job_dry):
    """``DRY_RUN=1`` (collect-only) of two stages at once, a barrier, then one more stage."""
    p, summary = gpu_job_dry(PARALLEL="1", PARALLEL_STAGGER_S="0",
                             SUITE="reliab_mix accept_shape wait reliab_kv64")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "== PARALLEL=1: 2 stages running at once (KV pools capped at 65536 tokens per server)" in summary
    assert "stages: reliab_mix=0 accept_shape=0 reliab_kv64=0" in summary
    assert "-- accept_shape: 5 tests collected" in summary
    assert "-- reliab_kv64: 1/4 tests collected (3 deselected)" in summary
    # the barrier: both parallel stages had finished before the last one started
    start = p.stdout.index("== stage reliab_kv64 (limit")
    assert p.stdout.index("== stage reliab_mix: rc=0") < start
    assert p.stdout.index("== stage accept_shape: rc=0") < start


def test_mla_suite_expands_in_place_and_defaults_to_parallel(gpu_job_dry):
    """Suite ``mla`` inside a longer SUITE list expands to its stages (here one case each) and
    turns on PARALLEL; an e2e_mla case with a draft backend gets its own stage name (own logs)."""
    p, summary = gpu_job_dry(PARALLEL_STAGGER_S="0", SUITE="mla reliab_mix", MLA_MODELS="kimi-small-mla",
                             NATIVE_CASES="kimi-small-mla:flashmla", E2E_MLA_CASES="kimi-small:flashmla:triton")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "== PARALLEL=1: 4 stages running at once" in summary
    assert ("stages: mla_kimi-small-mla=0 native_kimi-small-mla_flashmla=0 "
            "e2e_kimi-small_flashmla_draft_triton=0 reliab_mix=0") in summary
    assert "-- e2e_kimi-small_flashmla_draft_triton: 6 tests collected" in summary


def test_parallel_suite_defaults_the_stage_limits(gpu_job_dry):
    """The reliability suite runs its stages at once, each slowed by the others (up to 415 s
    measured), so they default to PARALLEL_TMO (520 s); a limit given in the environment still
    wins, and a stage after the barrier gets its own default. Guards the one-command run of the
    reliability suite timing out on the 180-300 s single-stage defaults."""
    p, _ = gpu_job_dry(unset=("PARALLEL", "SUITE", "STAGES", "ACCEPT_TMO", "RELIAB_TMO", "KERNEL_TMO", "PARALLEL_TMO"),
                       PARALLEL_STAGGER_S="0", SUITE="reliability -sanitizer wait kernel", RELIAB_TMO="100",
                       TOTAL_S="900")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for st in ("reliab_kv1", "reliab_kv64", "reliab_mix", "reliab_sampling"):
        assert f"== stage {st} (limit 100s)" in p.stdout, st
    for st in ("accept", "accept_shape"):
        assert f"== stage {st} (limit 520s)" in p.stdout, st
    assert "== stage kernel (limit 150s)" in p.stdout
    assert "== stage sanitizer" not in p.stdout and "stages: accept=0 accept_shape=0 " in p.stdout


def test_kbench_stage_dry_run(gpu_job_dry):
    """Suite ``kbench`` under ``DRY_RUN=1``: ``python -m bench kernel --dry-run`` (no GPU) with
    KBENCH_ARGS, its lines in summary.txt, no empty pytest-result line for it."""
    p, summary = gpu_job_dry(SUITE="kbench", KBENCH_ARGS="--shapes kimi_tp8_mla --ndt 6 --block-rows 16 32")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "stages: kbench=0" in summary
    assert "KERNEL dry-run kimi_tp8_mla ndt=6 policy block_r=16" in summary and "forced=[16, 32]" in summary
    assert "-- kbench:" not in summary
