"""Per-phase profile (profile.py, profile_hooks.py and their table in plugin.py, the flag and the env) on
CPU, with fake events whose elapsed times and query() results the tests control."""

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import cli, profile
from sglang_verify_graph.advisor import inputs as advisor_inputs
from sglang_verify_graph import metrics as prom
from sglang_verify_graph import profile_hooks as ph
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import ENV_PROFILE_EVERY, VerifyGraphConfigError, read_env
from sglang_verify_graph.counters import VerifyCounters


class FakeGPU:
    """A device clock (ms) and the events recorded on it; ``auto`` completes them at once."""

    def __init__(self, auto=True):
        self.now = 0.0
        self.auto = auto
        self.events = []

    def factory(self):
        return FakeEvent(self)

    def advance(self, ms):
        self.now += ms

    def complete(self):
        for e in self.events:
            e.done = True


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.t, self.done = gpu, None, False

    def record(self, stream=None):
        self.t = self.gpu.now
        self.done = self.gpu.auto
        self.gpu.events.append(self)

    def query(self):
        return self.done

    def elapsed_time(self, other):
        assert self.done and other.done, "elapsed_time on an incomplete event"
        return other.t - self.t

    def synchronize(self):
        raise AssertionError("event.synchronize() called")

    def wait(self, stream=None):
        raise AssertionError("event.wait() called")


@pytest.fixture(autouse=True)
def _no_sync(monkeypatch):
    """Any torch.cuda.synchronize (or a real CUDA event) in a profile code path fails the test."""
    def boom(*a, **k):
        raise AssertionError("torch.cuda.synchronize called")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    monkeypatch.setattr(torch.cuda, "Event", boom)
    monkeypatch.setattr(ph, "_PROFILER", None)
    yield
    profile.set_event_factory(None)


def run_cycle(prof, gpu, draft=2.0, verify=6.0, extend=1.0, gap=0.5, lens=(2, 2), steps=3):
    prof.cycle_begin(num_steps=steps)
    gpu.advance(gap)
    for phase, ms in (("draft", draft), ("verify", verify), ("draft_extend", extend)):
        prof.begin(phase)
        gpu.advance(ms)
        prof.end(phase)
    gpu.advance(gap)
    prof.cycle_end(list(lens) if lens is not None else None)


def make(every=3, auto=True, **kw):
    gpu = FakeGPU(auto)
    lines = []
    prof = profile.PhaseProfiler(every, rank=kw.pop("rank", 0), event_factory=gpu.factory,
                                 log=lines.append, **kw)
    return prof, gpu, lines


def fields(line):
    return dict(w.split("=", 1) for w in line.split()[1:])


def test_window_line_parses_with_advisor_medians():
    prof, gpu, lines = make(every=3, rank=1)
    for verify, lens in ((5.0, (2, 3)), (9.0, (1, 2)), (6.0, (4, 1))):
        run_cycle(prof, gpu, verify=verify, lens=lens)
    assert len(lines) == 1
    f = fields(lines[0])
    assert f["rank"] == "1" and f["cycles"] == "3" and f["tokens"] == "13"
    summary = advisor_inputs.parse_profile_log(["I1129 12:00:00 scheduler " + lines[0]])
    got = summary.by_steps[3]
    assert got["verify_ms"] == pytest.approx(6.0)           # median of 5, 9, 6
    assert got["draft_ms"] == pytest.approx(2.0)
    assert got["draft_extend_ms"] == pytest.approx(1.0)
    assert got["other_ms"] == pytest.approx(1.0)            # two 0.5 ms gaps
    assert got["accept_length"] == pytest.approx(13 / 6, abs=1e-3)  # tokens / request-cycles
    assert got["accepted_drafts"] == pytest.approx(13 / 6 - 1, abs=1e-3)
    assert float(f["cycle_ms"]) == pytest.approx(10.0)      # median of 9, 13, 10
    span = 9 + 13 + 10
    assert float(f["tok_s"]) == pytest.approx(13 / span * 1e3, rel=1e-3)
    for key in ("host_cycle_ms", "host_draft_ms", "host_verify_ms", "host_draft_extend_ms"):
        assert float(f[key]) >= 0


class StepClock:
    """A host clock (s) that advances ``step`` on every read: each read stands for work done."""

    def __init__(self, step=1e-5):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def test_profiler_reports_its_own_host_time_per_cycle():
    """prof_self_ms is the host time spent inside the profiler's methods per cycle (here every
    clock read stands for 10 us of the profiler's own work) and prof_self_pct its share of the
    mean cycle; each line covers only its own window (the call that writes a line counts
    toward the next one)."""
    clock = StepClock(1e-5)
    prof, gpu, lines = make(every=2, clock=clock)
    for _ in range(2):
        run_cycle(prof, gpu, verify=6.0)  # cycle = 0.5 + 2 + 6 + 1 + 0.5 = 10 ms
    for _ in range(2):
        run_cycle(prof, gpu, verify=6.0)
    # per cycle the profiler's own spans are cycle_begin 1, begin 3, end 3, cycle_end 1: 8 clock
    # steps of 10 us = 0.08 ms; the cycle_end that writes a line is counted in the next window
    first, second = (fields(line) for line in lines)
    assert float(first["prof_self_ms"]) == pytest.approx(7.5 * 1e-2, rel=1e-6)
    assert float(second["prof_self_ms"]) == pytest.approx(8 * 1e-2, rel=1e-6)
    assert float(second["prof_self_pct"]) == pytest.approx(100 * 0.08 / 10.0, abs=0.01)
    summary = advisor_inputs.parse_profile_log(lines)
    assert summary.by_steps[3]["verify_ms"] == pytest.approx(6.0)  # the advisor still reads it


def test_phase_percentages_sum_to_100_and_match_means():
    prof, gpu, lines = make(every=4)
    for verify in (4.0, 5.0, 6.0, 25.0):
        run_cycle(prof, gpu, verify=verify, draft=3.0, extend=2.0, gap=1.0)
    f = fields(lines[0])
    pcts = {p: float(f[f"{p}_pct"]) for p in profile.ALL_PHASES}
    assert sum(pcts.values()) == pytest.approx(100.0, abs=0.3)
    mean_cycle = sum(v + 3 + 2 + 2 for v in (4.0, 5.0, 6.0, 25.0)) / 4
    assert pcts["verify"] == pytest.approx(100 * 10.0 / mean_cycle, abs=0.1)
    assert pcts["other"] == pytest.approx(100 * 2.0 / mean_cycle, abs=0.1)


def test_pending_events_are_drained_later_without_blocking():
    prof, gpu, lines = make(every=2, auto=False)
    run_cycle(prof, gpu)
    run_cycle(prof, gpu)
    assert len(prof.pending) == 2 and lines == []  # query() False: still pending, not waited on
    gpu.complete()
    assert prof.drain() == 2
    assert len(lines) == 1 and fields(lines[0])["cycles"] == "2"


def test_incomplete_event_blocks_only_later_cycles():
    prof, gpu, lines = make(every=1, auto=False)
    run_cycle(prof, gpu)
    first = list(gpu.events)
    run_cycle(prof, gpu)
    for e in gpu.events[len(first):]:
        e.done = True  # the second cycle completed, the first did not (in-order drain)
    assert prof.drain() == 0 and len(prof.pending) == 2
    for e in first:
        e.done = True
    run_cycle(prof, gpu)  # its own events pending; the two earlier ones are folded now
    assert len(lines) == 2 and len(prof.pending) == 1


def test_tokens_reader_waits_then_gives_up():
    prof, gpu, lines = make(every=1)
    ready = {"v": None}
    prof.cycle_begin(num_steps=2)
    gpu.advance(1)
    prof.cycle_end(lambda: ready["v"])
    assert len(prof.pending) == 1 and lines == []  # host copy not done yet
    ready["v"] = [3, 2]
    prof.drain()
    assert fields(lines[0])["tokens"] == "5"
    prof.cycle_begin(num_steps=2)
    prof.cycle_end(lambda: None)  # never ready: timed anyway after TOKEN_WAIT_DRAINS drains
    for _ in range(profile.TOKEN_WAIT_DRAINS - 1):  # cycle_end drained once already
        prof.drain()
    assert len(lines) == 1
    prof.drain()
    assert len(lines) == 2 and fields(lines[1])["tokens"] == "0"
    assert "accept_length" not in fields(lines[1])


def test_replay_pct_and_fallbacks_from_counters():
    counters = VerifyCounters()
    counters.replays = 5  # before the profiler: not in its window
    counters.fallbacks["replace_embeds"] = 1
    prof, gpu, lines = make(every=2, counters=lambda: counters)
    run_cycle(prof, gpu)
    counters.replays += 3
    counters.fallbacks["batch_size_above_max_captured"] += 1
    run_cycle(prof, gpu)
    f = fields(lines[0])
    assert f["replay_pct"] == "75.0"  # window deltas: 3 replays, 1 fallback
    assert f["fallbacks"] == "batch_size_above_max_captured:1"
    prof2, gpu2, lines2 = make(every=1)  # no counters (verify graph off): na
    run_cycle(prof2, gpu2)
    assert fields(lines2[0])["replay_pct"] == "na" and fields(lines2[0])["fallbacks"] == "na"


def test_prometheus_metrics_histograms_and_counter_deltas():
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    metrics = prom.PrometheusMetrics(registry=registry)
    counters = VerifyCounters()
    prof, gpu, _ = make(every=10, counters=lambda: counters, metrics=metrics)
    counters.replays = 4
    run_cycle(prof, gpu, verify=6.0)
    counters.replays = 6
    counters.fallbacks["replace_embeds"] = 2
    run_cycle(prof, gpu, verify=8.0)
    get = registry.get_sample_value
    assert get("sglang_verify_graph_phase_ms_count", {"phase": "verify"}) == 2
    assert get("sglang_verify_graph_phase_ms_sum", {"phase": "verify"}) == pytest.approx(14.0)
    assert get("sglang_verify_graph_phase_ms_count", {"phase": "cycle"}) == 2
    assert get("sglang_verify_graph_replays_total") == 6
    assert get("sglang_verify_graph_fallbacks_total", {"reason": "replace_embeds"}) == 2


# ---- flag and environment -------------------------------------------------------------------
@pytest.mark.parametrize("raw,want", [(None, 0), ("", 0), ("0", 0), ("50", 50), (" 7 ", 7)])
def test_env_profile_every(raw, want):
    env = {} if raw is None else {ENV_PROFILE_EVERY: raw}
    assert read_env(env).profile_every == want


@pytest.mark.parametrize("raw", ["-1", "x", "1.5"])
def test_env_profile_every_rejects(raw):
    with pytest.raises(VerifyGraphConfigError, match=ENV_PROFILE_EVERY):
        read_env({ENV_PROFILE_EVERY: raw})


def test_flag_parses_and_is_exported(monkeypatch):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    cli.add_cli_args_hook(None, parser)
    cli.add_cli_args_hook(None, parser)  # idempotent
    assert parser.parse_args(["--model-path", "m"]).verify_graph_profile_every is None  # not given
    args = parser.parse_args(["--model-path", "m", cli.PROFILE_FLAG, "25"])
    assert args.verify_graph_profile_every == 25
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-path", "m", cli.PROFILE_FLAG, "-3"])
    seen = {}

    def original(cls, a):
        seen["env"] = os.environ.get(ENV_PROFILE_EVERY)
        return SimpleNamespace()

    cli.from_cli_args_hook(original, ServerArgs, args)
    assert seen["env"] == "25" and read_env().profile_every == 25
    monkeypatch.delenv(ENV_PROFILE_EVERY)
    cli.from_cli_args_hook(original, ServerArgs, parser.parse_args(["--model-path", "m"]))
    assert seen["env"] is None


def test_profile_flag_and_env_must_agree(monkeypatch, capsys):
    """``SGLANG_VERIFY_GRAPH_PROFILE_EVERY=7`` with ``--verify-graph-profile-every 0`` (or 5): two
    sources that disagree stop the launch instead of one silently winning; equal values pass,
    and an explicit 0 alone turns the profile off."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    cli.add_cli_args_hook(None, parser)
    original = lambda cls, a: SimpleNamespace()  # noqa: E731
    monkeypatch.setenv(ENV_PROFILE_EVERY, "7")
    for given in ("0", "5"):
        with pytest.raises(SystemExit) as info:
            cli.from_cli_args_hook(original, ServerArgs,
                                   parser.parse_args(["--model-path", "m", cli.PROFILE_FLAG, given]))
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"but 7 in {ENV_PROFILE_EVERY}" in err
        assert f"({cli.PROFILE_FLAG} = {given})" in err
    cli.from_cli_args_hook(original, ServerArgs,
                           parser.parse_args(["--model-path", "m", cli.PROFILE_FLAG, "7"]))
    monkeypatch.delenv(ENV_PROFILE_EVERY)
    cli.from_cli_args_hook(original, ServerArgs,
                           parser.parse_args(["--model-path", "m", cli.PROFILE_FLAG, "0"]))
    assert read_env().profile_every == 0


_DRIVER = r"""
import json, sys
from sglang_verify_graph import plugin
from sglang_verify_graph.compat import sglang_adapter as a
plugin.register()
from sglang_verify_graph import hooks
print("RESULT " + json.dumps({h.target: a._is_applied(h.target, h.body) for h in hooks.table(("profile",))}))
"""


@pytest.mark.parametrize("every", ["0", "5"])
def test_profile_hooks_install_only_when_env_on(every):
    env = dict(os.environ, **{ENV_PROFILE_EVERY: every})
    proc = subprocess.run([sys.executable, "-c", _DRIVER], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    applied = json.loads(line[len("RESULT "):])
    assert set(applied) == {adapter.CYCLE, adapter.DRAFT, adapter.VERIFY, adapter.DRAFT_EXTEND}
    assert all(applied.values()) if every == "5" else not any(applied.values())


def test_hooked_targets_exist_with_batch_argument():
    import inspect
    import pkgutil

    for target in (adapter.CYCLE, adapter.DRAFT, adapter.VERIFY, adapter.DRAFT_EXTEND):
        owner, attr = target.rsplit(".", 1)
        fn = getattr(pkgutil.resolve_name(owner), attr)
        params = list(inspect.signature(inspect.unwrap(fn)).parameters)
        assert params[:2] == ["self", "batch"], (target, params)


# ---- adapter hooks, driven like EAGLEWorkerV2 would -----------------------------------------
class Mode:
    def __init__(self, kind):
        self.kind = kind

    def is_extend(self):
        return self.kind == "extend"

    def is_idle(self):
        return self.kind == "idle"


class CopyDone:
    def __init__(self, done):
        self.done = done

    def query(self):
        return self.done

    def synchronize(self):
        raise AssertionError("copy_done.synchronize() called")


def _fake_worker(gpu, result):
    def draft(dw, batch):
        gpu.advance(2.0)

    def verify(w, batch):
        gpu.advance(6.0)
        return result

    def extend(dw, batch, res):
        gpu.advance(1.0)

    def forward(w, batch):
        ph.profile_draft_hook(draft, w.draft_worker, batch)
        out = ph.profile_verify_hook(verify, w, batch)
        ph.profile_draft_extend_hook(extend, w.draft_worker, batch, out)
        return out

    worker = SimpleNamespace(speculative_num_steps=3, ps=SimpleNamespace(tp_rank=2),
                             server_args=SimpleNamespace(enable_metrics=False),
                             draft_worker=SimpleNamespace())
    return worker, forward


def test_adapter_hooks_profile_decode_cycles_only(monkeypatch):
    monkeypatch.setenv(ENV_PROFILE_EVERY, "2")
    gpu = FakeGPU()
    profile.set_event_factory(gpu.factory)
    result = SimpleNamespace(accept_lens=torch.tensor([3, 2]), copy_done=CopyDone(True))
    worker, forward = _fake_worker(gpu, result)
    for kind in ("extend", "idle"):
        batch = SimpleNamespace(forward_mode=Mode(kind), is_extend_in_batch=False)
        assert ph.profile_cycle_hook(forward, worker, batch) is result
    assert gpu.events == [] and ph._PROFILER is None  # nothing profiled, nothing made
    batch = SimpleNamespace(forward_mode=Mode("decode"), is_extend_in_batch=True)
    ph.profile_cycle_hook(forward, worker, batch)
    assert gpu.events == []
    batch = SimpleNamespace(forward_mode=Mode("decode"), is_extend_in_batch=False)
    lines = []
    for _ in range(2):
        ph.profile_cycle_hook(forward, worker, batch=batch)
        ph._PROFILER.log = lines.append
    assert len(gpu.events) == 2 * 8  # cycle pair + three phase pairs, per cycle
    f = fields(ph._PROFILER.lines[-1])
    assert f["rank"] == "2" and f["num_steps"] == "3" and f["tokens"] == "10"
    assert float(f["verify_ms"]) == 6.0 and float(f["draft_ms"]) == 2.0
    assert float(f["draft_extend_ms"]) == 1.0 and float(f["other_ms"]) == 0.0


def test_host_accept_lens_waits_for_the_host_copy():
    done = CopyDone(False)
    result = SimpleNamespace(accept_lens=torch.tensor([2, 4]), copy_done=done)
    read = ph.host_accept_lens(result)
    assert read() is None  # copy event not complete: not read, not waited for
    done.done = True
    assert read() == [2, 4]

    class DeviceTensor:  # what accept_lens is before copy_to_cpu replaced it
        is_cuda = True

        def tolist(self):
            raise AssertionError("read a device tensor (would synchronize)")

    assert ph.host_accept_lens(SimpleNamespace(accept_lens=DeviceTensor()))() is None
    assert ph.host_accept_lens(SimpleNamespace(accept_lens=None))() == ()


def test_reader_drops_the_result_once_copied():
    import weakref

    class Result:  # a GenerationBatchResult stand-in whose accept_lens is still on the device
        pass

    class DeviceTensor:
        is_cuda = True

    result = Result()
    result.accept_lens, result.copy_done = DeviceTensor(), None
    prof, gpu, lines = make(every=1, auto=False)
    prof.cycle_begin(num_steps=3)
    prof.cycle_end(ph.host_accept_lens(result))
    ref = weakref.ref(result)
    result.accept_lens, result.copy_done = torch.tensor([1, 3]), CopyDone(False)  # copy_to_cpu
    del result
    prof.cycle_begin(num_steps=3)  # settles the pending reader: the result is let go
    assert ref() is None
    gpu.complete()
    prof.drain()
    assert lines == []  # copy_done not complete yet
    prof.pending[0].tokens_reader._done.done = True
    prof.drain()
    assert fields(lines[0])["tokens"] == "4"


def test_phase_hooks_pass_through_outside_a_cycle():
    calls = []
    assert ph.profile_verify_hook(lambda *a, **k: calls.append((a, k)) or "r", 1, x=2) == "r"
    assert calls == [((1,), {"x": 2})]


def test_cycle_aborted_when_forward_raises(monkeypatch):
    monkeypatch.setenv(ENV_PROFILE_EVERY, "1")
    gpu = FakeGPU()
    profile.set_event_factory(gpu.factory)

    def boom(w, batch):
        raise RuntimeError("forward failed")

    worker, _ = _fake_worker(gpu, None)
    batch = SimpleNamespace(forward_mode=Mode("decode"), is_extend_in_batch=False)
    with pytest.raises(RuntimeError):
        ph.profile_cycle_hook(boom, worker, batch)
    assert not ph._PROFILER.in_cycle and not ph._PROFILER.pending


def test_profile_line_drives_the_advisor_cli(tmp_path):
    prof, gpu, lines = make(every=3)
    for verify in (5.0, 6.0, 7.0):
        run_cycle(prof, gpu, verify=verify, lens=(2, 3))
    log = tmp_path / "profile.log"
    log.write_text("[2026-11-29 12:00:00 TP0] " + lines[0] + "\n")
    proc = subprocess.run([sys.executable, "-m", "sglang_verify_graph.advisor", "--from-log",
                           str(log), "--decode-ms", "6"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "num_steps 3" in proc.stdout
    assert "verify 6.000" in proc.stdout and "accept_length  2.500" in proc.stdout


@pytest.mark.parametrize("enable_metrics", [False, True])
def test_metrics_only_with_enable_metrics(monkeypatch, enable_metrics):
    monkeypatch.setenv(ENV_PROFILE_EVERY, "4")
    sentinel = object()
    monkeypatch.setattr(prom, "prometheus_metrics", lambda: sentinel)
    profile.set_event_factory(FakeGPU().factory)
    worker = SimpleNamespace(server_args=SimpleNamespace(enable_metrics=enable_metrics),
                             ps=SimpleNamespace(tp_rank=0))
    prof = ph.profiler_for(worker)
    assert prof.every == 4
    assert prof.metrics is (sentinel if enable_metrics else None)


_REAL_CLI = r"""
import argparse, os
from sglang_verify_graph import plugin
plugin.register()
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
ServerArgs.from_cli_args(p.parse_args(["--model-path", "dummy", "--verify-graph-profile-every", "7"]))
print("RESULT", os.environ.get("SGLANG_VERIFY_GRAPH_PROFILE_EVERY"))
"""


def test_real_cli_exports_profile_env():
    env = {k: v for k, v in os.environ.items() if k != ENV_PROFILE_EVERY}
    proc = subprocess.run([sys.executable, "-c", _REAL_CLI], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT 7" in proc.stdout
