"""``VerifyCounters``: what ``/get_server_info`` serves per rank (the snapshot), each count's
arithmetic, the fallback reason a refusal leaves for exactly one eager verify, the rate-limited
warnings (the first per reason and every 1000th), the periodic counter log line, the
draft-extend attention carried into counters installed later, and the start-up eager-cliff line
at its boundary."""

from __future__ import annotations

import logging

import pytest

from sglang_verify_graph import counters as C

LOGGER = "sglang_verify_graph"


@pytest.fixture
def fresh_globals(monkeypatch):
    """No counters installed and no draft-extend attention noted (undone after the test)."""
    monkeypatch.setattr(C, "_COUNTERS", None)
    monkeypatch.setattr(C, "_DRAFT_EXTEND_ATTENTION", "")


def _messages(caplog, level):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_fresh_counters_serve_zeros_and_the_runner_name():
    """A rank that captured but ran no verify step serves this exact dict (no self-test and no
    draft-extend section while those are off)."""
    assert C.VerifyCounters().snapshot() == {
        "runner": "VerifyCudaGraphRunner", "attention": "", "capture_bs": [], "num_draft_tokens": 0,
        "capture_seconds": 0.0, "graph_mem_gib": 0.0, "replays": 0, "replayed_requests": 0,
        "padded_rows": 0, "verify_steps": 0, "verify_requests": 0, "eager_requests": 0,
        "fallbacks": {}, "fallback_total": 0,
    }


def test_snapshot_rounds_times_and_memory_and_copies_the_buckets():
    c = C.VerifyCounters(capture_bs=[1, 2, 4], num_draft_tokens=4, capture_seconds=1.23456,
                         graph_mem_gib=0.123456, attention="chain split-KV (MHA)")
    snap = c.snapshot()
    assert (snap["capture_seconds"], snap["graph_mem_gib"]) == (1.235, 0.1235)
    assert snap["capture_bs"] == [1, 2, 4] and snap["num_draft_tokens"] == 4
    assert snap["attention"] == "chain split-KV (MHA)"
    snap["capture_bs"].append(8)  # the served list is a copy
    assert c.capture_bs == [1, 2, 4]


def test_snapshot_adds_the_selftest_and_draft_extend_sections_only_when_on():
    c = C.VerifyCounters()
    c.selftest["replays_checked"] = 3
    c.draft_extend_attention = "chain split-KV (MHA)"
    c.count_draft_extend_replay(4, 3)
    c.count_draft_extend_replay(2, 2)
    c.count_draft_extend_eager()
    snap = c.snapshot()
    assert snap["selftest"] == {"replays_checked": 3}
    assert snap["draft_extend"] == {"attention": "chain split-KV (MHA)", "replays": 2, "padded_rows": 1,
                                    "eager": 1}


def test_replays_count_requests_and_padded_rows():
    c = C.VerifyCounters()
    c.count_replay(8, 5)
    c.count_replay(4, 4)
    assert (c.replays, c.replayed_requests, c.padded_rows) == (2, 9, 3)
    c.count_verify_step(5)
    c.count_verify_step(4)
    assert (c.verify_steps, c.verify_requests) == (2, 9)


def test_a_refusal_names_exactly_one_eager_verify_then_other(caplog):
    """The reason ``can_run_graph`` recorded is used by the next eager verify only; an eager
    verify with no refusal before it (another graph runner, a path we did not see) is
    ``not_graphable_other``."""
    c = C.VerifyCounters()
    c.note_refusal(C.REASON_WIDTH, "3 != 4")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c.count_eager_verify(2)
        c.count_eager_verify(3)
    assert dict(c.fallbacks) == {C.REASON_WIDTH: 1, C.REASON_OTHER: 1}
    assert c.eager_requests == 5 and c.fallback_total == 2
    assert c.snapshot()["fallbacks"] == {C.REASON_WIDTH: 1, C.REASON_OTHER: 1}
    assert _messages(caplog, logging.WARNING) == [
        f"verify CUDA graph fallback #1 ({C.REASON_WIDTH}: 3 != 4): this verify step ran eagerly",
        f"verify CUDA graph fallback #1 ({C.REASON_OTHER}): this verify step ran eagerly",
    ]


def test_fallback_warnings_are_the_first_per_reason_and_every_thousandth(caplog):
    c = C.VerifyCounters()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2000):
            c.note_refusal(C.REASON_BS_ABOVE_MAX)
            c.count_eager_verify(1)
        c.note_refusal(C.REASON_TBO, "")
        c.count_eager_verify(1)
    messages = _messages(caplog, logging.WARNING)
    numbers = [m.split("#")[1].split(" ")[0] for m in messages]
    assert numbers == ["1", "1000", "2000", "1"]
    # a refusal noted without a detail (and one with an empty detail) logs the reason alone
    assert messages[0] == f"verify CUDA graph fallback #1 ({C.REASON_BS_ABOVE_MAX}): this verify step ran eagerly"
    assert messages[3] == f"verify CUDA graph fallback #1 ({C.REASON_TBO}): this verify step ran eagerly"
    assert c.fallbacks[C.REASON_BS_ABOVE_MAX] == 2000 and c.fallback_total == 2001


def test_draft_extend_eager_warnings_are_the_first_and_every_thousandth(caplog):
    c = C.VerifyCounters()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(1000):
            c.count_draft_extend_eager()
    assert _messages(caplog, logging.WARNING) == [
        "draft-extend CUDA graph fallback #1: this draft extend ran eagerly",
        "draft-extend CUDA graph fallback #1000: this draft extend ran eagerly",
    ]
    assert c.draft_extend_eager == 1000


@pytest.mark.parametrize("log_every, logged_at", [(0, []), (2, [2, 4])])
def test_counters_are_logged_every_log_every_verify_steps(caplog, log_every, logged_at):
    c = C.VerifyCounters(log_every=log_every)
    seen = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for step in range(1, 5):
            before = len(_messages(caplog, logging.INFO))
            c.count_verify_step(1)
            if len(_messages(caplog, logging.INFO)) > before:
                seen.append(step)
    assert seen == logged_at
    if logged_at:
        assert _messages(caplog, logging.INFO)[-1].startswith("verify CUDA graph counters: {'runner'")
        assert "'verify_steps': 4" in _messages(caplog, logging.INFO)[-1]


def test_draft_extend_attention_noted_before_install_is_carried(fresh_globals):
    """SGLang builds the draft's backends before the target's capture installs the counters."""
    assert C.get_counters() is None
    C.note_draft_extend_attention("chain split-KV (MHA)")
    installed = C.install_counters(C.VerifyCounters())
    assert C.get_counters() is installed
    assert installed.draft_extend_attention == "chain split-KV (MHA)"
    assert installed.snapshot()["draft_extend"]["attention"] == "chain split-KV (MHA)"


def test_attention_set_on_the_counters_wins_and_a_later_note_updates_them(fresh_globals):
    C.note_draft_extend_attention("chain split-KV (MHA)")
    installed = C.install_counters(C.VerifyCounters(draft_extend_attention="chain split-KV (MLA)"))
    assert installed.draft_extend_attention == "chain split-KV (MLA)"
    C.note_draft_extend_attention("chain split-KV (MHA), draft 2")
    assert installed.draft_extend_attention == "chain split-KV (MHA), draft 2"


def test_nothing_noted_leaves_the_draft_extend_section_out(fresh_globals):
    installed = C.install_counters(C.VerifyCounters())
    assert installed.draft_extend_attention == "" and "draft_extend" not in installed.snapshot()


def test_eager_cliff_starts_one_above_the_largest_bucket():
    assert C.eager_cliff_warning(8, [8, 1, 4]) is None
    line = C.eager_cliff_warning(9, [8, 1, 4])
    assert line == ("--enable-verify-cuda-graph: verify batches of 9..9 requests will run eagerly "
                    f"(largest captured bucket 8; counted as {C.REASON_BS_ABOVE_MAX}). To graph them: "
                    "--cuda-graph-max-bs-decode 9, or --max-running-requests 8.")
    assert C.eager_cliff_warning(0, [1]) is None


def test_an_eager_verify_on_counters_that_never_saw_a_refusal_logs_other_alone(caplog):
    c = C.VerifyCounters()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        c.count_eager_verify(1)
    assert _messages(caplog, logging.WARNING) == [
        f"verify CUDA graph fallback #1 ({C.REASON_OTHER}): this verify step ran eagerly"]
