"""CPU tier: bench/verify.py's profile mode bookkeeping: the overhead column
(``ours_profile`` decode time of the same generation over ``ours``'s) and the phase-sum check
parsed from the profiler's log lines (cycle_mean_ms over the device span per cycle); the engine
arguments and per-phase rows of a Kimi-K2.5 shard run, and ``--require-replays``."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.lib import results
from bench.verify import child as verify_child
from bench.verify import cli as verify_cli
from bench.verify import parent as verify_parent
from bench.verify import table as verify_table

LINE = ("[2026-11-29 10:00:00 TP0] verify_graph_profile rank=0 cycles=20 tokens=80 bs=1 num_steps=2 "
        "cycle_ms=9.10 cycle_mean_ms=9.5 draft_ms=1.2 verify_ms=6.3 draft_extend_ms=0.9 "
        "other_ms=0.7 verify_pct=69.2 accept_length=4.000 tok_s=400.0 replay_pct=100.0 "
        "fallbacks=none\n")


def test_profile_lines_phase_sum_vs_span(tmp_path):
    log = tmp_path / "bench_ours_profile.log"
    log.write_text("noise\n" + LINE + "verify_graph_profile: profiling EAGLE cycles\n")
    (p,) = verify_parent.profile_lines(str(log))
    # span = 1000 * 80 tokens / 400 tok/s / 20 cycles = 10 ms per cycle; 9.5 / 10
    assert p["span_per_cycle_ms"] == 10.0 and p["phase_sum_vs_span"] == 0.95
    assert p["verify_pct"] == "69.2"


def test_overhead_column():
    """prof_ovh% compares the decode part of the same N-token generation (same verify steps):
    ``tn`` minus the two engines' mean 1-token time. Each engine's own ``t1`` is one noisy request
    (the H200 run of 2026-12-01: 0.0323 vs 0.0287 s turned +0.58% into +1.6%); no ``t1`` at all
    would leave prefill in and dilute the ratio."""
    a = verify_cli.parse_args(["--contexts", "1024", "--batch-sizes", "1",
                       "--modes", "plain,upstream,ours,ours_profile"])
    phase = lambda e2e, tn, t1, steps=63: {"context": 1024, "bs": 1, "e2e_ms_per_step": e2e,  # noqa: E731
                                           "tn_s": tn, "t1_s": t1, "steps": steps, "roles": {}}
    modes = {"ours": {"phases": [phase(5.9928, 0.4099, 0.0323)]},
             "ours_profile": {"phases": [phase(6.0859, 0.4121, 0.0287)]}}
    (row,) = verify_table.build_rows(a, modes)
    t1 = (0.0323 + 0.0287) / 2
    assert row["profile_overhead"] == round((0.4121 - t1) / (0.4099 - t1) - 1, 4) == 0.0058
    assert row["profile_overhead_pct"] == 0.58
    assert row["profile_overhead_per_step"] == 0.016  # what the per-step figure said
    meta = {"model": "m", "mode_status": {}, "hardware": "h", "versions": {}, "flags": "",
            "command": "c", "profile_lines": []}
    table = verify_table.format_table([row], meta)
    assert "prof_ovh%" in table and "0.58" in table
    # different step counts (e.g. accepted drafts): per-step decode times
    modes["ours_profile"]["phases"] = [phase(6.0, 0.4400, 0.03, steps=66)]
    (row,) = verify_table.build_rows(a, modes)
    t1 = (0.0323 + 0.03) / 2
    assert row["profile_overhead"] == round(((0.44 - t1) / 66) / ((0.4099 - t1) / 63) - 1, 4)
    # missing t1 or a non-positive decode time: no figure rather than a wrong one
    assert verify_table.profile_overhead((0.4, None, 63), (0.4, 0.03, 63)) is None
    assert verify_table.profile_overhead((0.02, 0.03, 63), (0.4, 0.03, 63)) is None


def test_unknown_mode_is_a_usage_error(capsys):
    import pytest

    with pytest.raises(SystemExit):
        verify_cli.parse_args(["--modes", "ours,fast"])
    assert "unknown mode" in capsys.readouterr().err


def test_num_steps_sweep_keys_and_rows():
    """``--steps 1,3``: one engine per (mode, num_steps) keyed ``mode@k``, plain decode once, one
    row per (num_steps, context, bs) with the shared decode baseline."""
    a = verify_cli.parse_args(["--contexts", "1024", "--batch-sizes", "1", "--steps", "1,3,3",
                       "--modes", "plain,ours,upstream"])
    assert a.steps_list == [1, 3] and a.steps == 3
    assert [verify_table.mode_key(a, "plain", k) for k in (1, 3)] == ["plain", "plain"]
    assert verify_table.mode_key(a, "ours", 3) == "ours@3"
    phase = lambda verify: {"context": 1024, "bs": 1, "e2e_ms_per_step": 1.0,  # noqa: E731
                            "roles": {"target_verify": {"gpu_ms": verify},
                                      "target_decode": {"gpu_ms": 2.0}}}
    modes = {"plain": {"phases": [phase(None)]}, "ours@1": {"phases": [phase(2.2)]},
             "ours@3": {"phases": [phase(2.6)]}, "upstream@3": {"phases": [phase(5.2)]}}
    rows = verify_table.build_rows(a, modes)
    assert [(r["num_steps"], r["decode_ms"], r["ours_verify_ms"]) for r in rows] == [
        (1, 2.0, 2.2), (3, 2.0, 2.6)]
    assert rows[1]["ours_per_upstream_verify"] == 0.5 and rows[0]["upstream_verify_ms"] is None
    single = verify_cli.parse_args(["--steps", "2"])
    assert single.steps_list == [2] and verify_table.mode_key(single, "ours", 2) == "ours"


def test_prefix_cache_prompts_are_shared_across_batch_sizes():
    """``--prefix-cache``: prompt i of a context is the same at every batch size (so the radix
    cache serves the larger batch's first prompts) and differs between contexts and indices;
    without it each (context, bs) point draws its own prompts."""
    small, big = verify_child.bench_prompts(256, 2, 32000, True), verify_child.bench_prompts(256, 8, 32000, True)
    assert big[:2] == small and len(big) == 8 and all(len(p) == 256 for p in big)
    assert len({tuple(p) for p in big}) == 8
    assert verify_child.bench_prompts(512, 1, 32000, True)[0][:256] != small[0]
    assert all(10 <= t < 31999 for p in big for t in p)
    old2, old8 = verify_child.bench_prompts(256, 2, 32000, False), verify_child.bench_prompts(256, 8, 32000, False)
    assert old8[:2] != old2 and len(old8) == 8


def test_prefix_cache_turns_the_radix_cache_on(tmp_path):
    on = verify_cli.parse_args(["--prefix-cache", "--models-dir", str(tmp_path), "--model", "llama-small"])
    off = verify_cli.parse_args(["--models-dir", str(tmp_path), "--model", "llama-small"])
    assert verify_child.engine_kwargs(on, "ours")["disable_radix_cache"] is False
    assert verify_child.engine_kwargs(off, "plain")["disable_radix_cache"] is True


def test_shard_engine_kwargs(tmp_path):
    """``kimi-k25-shard``: ``--moe-runner-backend`` reaches every engine, ``--cuda-graph-bs``
    captures exactly the listed decode buckets (its max is the max bs), the context length
    comes from the target's config; the KimiK25 wrapper's fields from its ``text_config``, with
    ``enable_multimodal=False``; a batch size above the largest bucket is refused."""
    argv = ["--models-dir", str(tmp_path), "--model", "kimi-k25-shard", "--steps", "2,3", "--contexts",
            "1024,16384", "--batch-sizes", "1,32", "--moe-runner-backend", "triton", "--cuda-graph-bs", "32,1,8"]
    a = verify_cli.parse_args(argv)
    plain, ours = verify_child.engine_kwargs(a, "plain"), verify_child.engine_kwargs(a, "ours")
    for kw in (plain, ours):
        assert kw["moe_runner_backend"] == "triton"
        assert kw["cuda_graph_bs_decode"] == [1, 8, 32] and kw["cuda_graph_max_bs_decode"] == 32
        assert kw["context_length"] == 16384 + 256 and "enable_multimodal" not in kw
    assert ours["speculative_num_steps"] == 3 and "speculative_algorithm" not in plain
    w = verify_cli.parse_args(["--models-dir", str(tmp_path), "--model", "kimi-k25-shard-wrapped", "--batch-sizes", "1,8"])
    kw = verify_child.engine_kwargs(w, "ours")
    assert kw["enable_multimodal"] is False and "moe_runner_backend" not in kw  # SGLang's default (Marlin)
    assert kw["cuda_graph_max_bs_decode"] == 8 and "cuda_graph_bs_decode" not in kw
    assert verify_child.target_config(w)["vocab_size"] == 20480
    with pytest.raises(SystemExit):
        verify_cli.parse_args(argv[:-1] + ["1,8"])


def test_rows_carry_each_phase_and_the_cycle():
    """Per (steps, ctx, bs) row: draft, verify, draft-extend GPU ms per replay for upstream and
    ours, their sum as the cycle, and the table lists them."""
    a = verify_cli.parse_args(["--contexts", "1024", "--batch-sizes", "1", "--steps", "3"])
    roles = lambda d, v, x: {"draft_decode": {"gpu_ms": d}, "target_verify": {"gpu_ms": v},  # noqa: E731
                             "draft_extend": {"gpu_ms": x}}
    modes = {"plain": {"phases": [{"context": 1024, "bs": 1, "e2e_ms_per_step": 9.0,
                                   "roles": {"target_decode": {"gpu_ms": 10.0}}}]},
             "ours": {"phases": [{"context": 1024, "bs": 1, "e2e_ms_per_step": 20.0, "roles": roles(1.5, 11.0, 2.0)}]},
             "upstream": {"phases": [{"context": 1024, "bs": 1, "e2e_ms_per_step": 30.0, "roles": roles(1.5, 20.0, 2.5)}]}}
    (r,) = verify_table.build_rows(a, modes)
    assert (r["ours_draft_ms"], r["ours_verify_ms"], r["ours_draft_extend_ms"], r["ours_cycle_ms"]) == (1.5, 11.0, 2.0, 14.5)
    assert (r["upstream_draft_extend_ms"], r["upstream_cycle_ms"], r["ours_per_upstream_cycle"]) == (2.5, 24.0, 0.604)
    meta = {"model": "kimi-k25-shard", "mode_status": {}, "hardware": "h", "versions": {}, "flags": "", "command": "c"}
    table = verify_table.format_table([r], meta)
    head = next(ln for ln in table.splitlines() if "our_verify" in ln).split()
    assert {"up_draft", "our_draft", "up_dext", "our_dext", "up_cycle", "our_cycle"} <= set(head)


def test_require_replays_names_each_engine_that_fell_short():
    ok = {"mode": "ours", "ok": True, "plugin_after": {"replays": 9, "verify_steps": 9, "fallback_total": 0},
          "phases": [{"roles": {"target_verify": {"classes": ["VerifyCudaGraphRunner"]}}}]}
    assert results.replay_failures({"ours": ok, "plain": {"mode": "plain", "ok": True}}) == []
    short = dict(ok, plugin_after={"replays": 8, "verify_steps": 9, "fallback_total": 1, "fallbacks": {"bs": 1}})
    eager = dict(ok, phases=[{"roles": {"target_verify": {"classes": ["CudaGraphRunner"]}}}])
    out = results.replay_failures({"ours@3": short, "ours@2": eager, "ours": {"mode": "ours", "ok": False, "error": "OOM"}})
    assert len(out) == 3 and out[0].startswith("ours@3: replays=8 verify_steps=9 fallbacks=1")
    assert "CudaGraphRunner" in out[1] and "OOM" in out[2]
