"""VerifyCudaGraphRunner's own mechanics around SGLang's: ``load_batch`` neutralises the padded
rows' ``input_ids`` (SGLang leaves the stale tail there) once per batch and calls the probe around
a full fill only; ``execute`` counts each TARGET_VERIFY replay with its ``bs`` / ``raw_bs`` and calls
the probe after the enqueue even when the replay raises. SGLang's own ``load_batch`` / ``execute``
are replaced by stand-ins that do what they do to the runner's state (bucket choice, copies)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import counters as C
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.buffers import PAD_TOKEN_ID
from sglang_verify_graph.runner import VerifyCudaGraphRunner

from cpu_stubs import forward_mode as _mode

WIDTH, CAPTURE_BS, STALE = 4, (1, 2, 4, 8), 777


class RecordingProbe:
    def __init__(self):
        self.calls = []

    def before_load(self, runner, forward_batch):
        self.calls.append("before_load")

    def after_load(self, runner, forward_batch):
        self.calls.append("after_load")

    def after_enqueue(self, runner):
        self.calls.append("after_enqueue")

    def after_replay(self, runner, forward_batch, graph_out):
        self.calls.append("after_replay")


@pytest.fixture
def runner(monkeypatch):
    """A runner without capture, over stand-ins for SGLang's ``load_batch`` (pads ``raw_bs`` to
    the next bucket, copies the live ``input_ids`` over a buffer whose every slot is stale) and
    ``execute`` (loads, then returns the replay's output or raises ``batch.fail``)."""
    parent = adapter.decode_cuda_graph_runner_cls()

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        self.raw_bs = forward_batch.batch_size
        self.bs = next(b for b in self.capture_bs if b >= self.raw_bs)
        self.raw_num_token = self.raw_bs * self.captured_req_width
        if forward_batch.needs_forward_metadata_init():
            self.buffers.input_ids.fill_(STALE)
        self.buffers.input_ids[:self.raw_num_token].copy_(forward_batch.input_ids)

    def execute(self, forward_batch, pp_proxy_tensors=None):
        self.load_batch(forward_batch, pp_proxy_tensors)
        if getattr(forward_batch, "fail", None):
            raise forward_batch.fail
        return "graph output"

    monkeypatch.setattr(parent, "load_batch", load_batch)
    monkeypatch.setattr(parent, "execute", execute)
    r = VerifyCudaGraphRunner.__new__(VerifyCudaGraphRunner)
    r.__dict__.update(capture_bs=list(CAPTURE_BS), captured_req_width=WIDTH, counters=C.VerifyCounters(),
                      probe=RecordingProbe(),
                      buffers=SimpleNamespace(input_ids=torch.zeros(max(CAPTURE_BS) * WIDTH, dtype=torch.int64)))
    return r


def _batch(raw_bs, mode="TARGET_VERIFY", full_fill=True, **kw):
    ids = torch.arange(1, raw_bs * WIDTH + 1, dtype=torch.int64)
    return SimpleNamespace(batch_size=raw_bs, input_ids=ids, forward_mode=_mode(mode),
                           needs_forward_metadata_init=lambda: full_fill, **kw)


@pytest.mark.parametrize("raw_bs, bs", [(3, 4), (5, 8), (1, 1)], ids=["3->4", "5->8", "unpadded"])
def test_padded_rows_get_the_pad_token_and_live_rows_keep_theirs(runner, raw_bs, bs):
    batch = _batch(raw_bs)
    runner.load_batch(batch)
    ids = runner.buffers.input_ids
    n = raw_bs * WIDTH
    assert runner.bs == bs
    assert torch.equal(ids[:n], batch.input_ids)
    assert torch.all(ids[n:bs * WIDTH] == PAD_TOKEN_ID)
    assert torch.all(ids[bs * WIDTH:] == STALE)  # past the bucket: not read by this replay
    assert runner.probe.calls == ["before_load", "after_load"]


def test_a_pre_planned_re_entry_leaves_the_tail_and_skips_the_probe(runner):
    """The re-entry (``needs_forward_metadata_init()`` False) copies only the live ids: the tail the
    full fill neutralised stays, and the probe, which saw the full fill, is not called again."""
    runner.load_batch(_batch(3))
    runner.buffers.input_ids[3 * WIDTH:4 * WIDTH].fill_(STALE)  # would be wiped by a second fill
    runner.load_batch(_batch(3, full_fill=False))
    assert torch.all(runner.buffers.input_ids[3 * WIDTH:4 * WIDTH] == STALE)
    assert runner.probe.calls == ["before_load", "after_load"]


def test_each_verify_replay_is_counted_with_its_padding(runner):
    assert runner.execute(_batch(3)) == "graph output"
    assert runner.execute(_batch(8)) == "graph output"
    assert (runner.counters.replays, runner.counters.padded_rows) == (2, 1)
    assert runner.probe.calls == ["before_load", "after_load", "after_enqueue", "after_replay"] * 2


def test_a_decode_replay_is_neither_counted_nor_probed(runner):
    assert runner.execute(_batch(3, mode="DECODE")) == "graph output"
    assert runner.counters.replays == 0
    assert "after_enqueue" not in runner.probe.calls and "after_replay" not in runner.probe.calls


def test_a_failed_replay_reaches_the_probe_and_is_not_counted(runner):
    with pytest.raises(RuntimeError, match="replay failed"):
        runner.execute(_batch(3, fail=RuntimeError("replay failed")))
    assert runner.counters.replays == 0
    assert runner.probe.calls[-1] == "after_enqueue"


class ArgsProbe(RecordingProbe):
    """Records what each probe call is handed (the runner, the batch, the replay's output)."""

    def before_load(self, runner, forward_batch):
        self.calls.append(("before_load", runner, forward_batch))

    def after_load(self, runner, forward_batch):
        self.calls.append(("after_load", runner, forward_batch))

    def after_enqueue(self, runner):
        self.calls.append(("after_enqueue", runner))

    def after_replay(self, runner, forward_batch, graph_out):
        self.calls.append(("after_replay", runner, forward_batch, graph_out))


@pytest.mark.parametrize("mode", ["TARGET_VERIFY", "DECODE"])
def test_execute_hands_sglang_the_pp_proxy_tensors_and_the_probe_its_objects(runner, monkeypatch, mode):
    """SGLang's ``execute`` gets the pipeline proxy tensors it was called with (both modes); the
    probe gets this runner, this batch and this replay's output."""
    parent = adapter.decode_cuda_graph_runner_cls()
    seen = []

    def execute(self, forward_batch, pp_proxy_tensors=None):
        seen.append(pp_proxy_tensors)
        self.load_batch(forward_batch, pp_proxy_tensors)
        return ("graph output", forward_batch.batch_size)

    stand_in_load = parent.load_batch

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        seen.append(("load", pp_proxy_tensors))
        stand_in_load(self, forward_batch, pp_proxy_tensors)

    monkeypatch.setattr(parent, "execute", execute)
    monkeypatch.setattr(parent, "load_batch", load_batch)
    runner.probe = ArgsProbe()
    batch = _batch(3, mode=mode)
    out = runner.execute(batch, pp_proxy_tensors="PP")
    assert out == ("graph output", 3) and seen == ["PP", ("load", "PP")]
    if mode == "TARGET_VERIFY":
        assert runner.probe.calls == [("before_load", runner, batch), ("after_load", runner, batch),
                                      ("after_enqueue", runner), ("after_replay", runner, batch, out)]
