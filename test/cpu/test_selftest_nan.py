"""CPU tier: the NaN-in-padded-rows mode of the in-server self-test.

Failure mode guarded (on the GPU by ``test/gpu/test_nan_guard.py``): a NaN in a padded row of a
verify replay reaching real rows (e.g. through a cross-row reduction), which SGLang's
``--enable-nan-detection`` would then report as a model failure. Here: the switch is parsed in
``read_env`` and reaches the config only with the self-test; the row is NaN from ``load_batch``
of a padded bucket until the replay is enqueued and restored afterwards; an unpadded batch is
left alone; error maxima keep NaN instead of dropping it.
"""

import math
import types

import pytest
import torch

from sglang_verify_graph import selftest as st
from sglang_verify_graph import sglang_adapter
from sglang_verify_graph.config import (ENV_SELFTEST, ENV_SELFTEST_NAN, EnvSettings,
                                        VerifyGraphConfigError, build_config, read_env)


def test_worst_keeps_nan():
    assert st.worst(0.0, 0.5) == 0.5
    assert math.isnan(st.worst(0.1, math.nan))
    assert math.isnan(st.worst(math.nan, 0.1))
    assert max(0.0, math.nan) == 0.0  # the trap worst() avoids


def test_env_parsing():
    assert read_env({ENV_SELFTEST_NAN: "1"}).selftest_nan is True
    assert read_env({}).selftest_nan is False
    with pytest.raises(VerifyGraphConfigError):
        read_env({ENV_SELFTEST_NAN: "maybe"})


def test_config_needs_the_selftest(make_args):
    args = make_args()
    assert build_config(args, EnvSettings(enable=True, selftest_nan=True)).selftest_nan is False
    cfg = build_config(args, EnvSettings(enable=True, selftest=True, selftest_nan=True))
    assert cfg.selftest and cfg.selftest_nan


def _runner(bs, raw_bs):
    bufs = types.SimpleNamespace(**{n: torch.zeros(8, dtype=torch.int64) for n in st._POISONED})
    return types.SimpleNamespace(buffers=bufs, counters=types.SimpleNamespace(selftest={}),
                                 model_runner=object(), bs=bs, raw_bs=raw_bs, raw_num_token=raw_bs)


def _batch(*ids):
    return types.SimpleNamespace(input_ids=torch.tensor(ids, dtype=torch.int64))


REAL = _batch(5, 6, 7)


@pytest.fixture
def embedding(monkeypatch):
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    monkeypatch.setattr(sglang_adapter, "local_embedding_row", lambda mr, token_id: weight[token_id])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return weight


def test_nan_only_during_padded_replays(embedding):
    original = embedding.clone()
    runner = _runner(bs=4, raw_bs=3)
    test = st.GraphSelfTest(runner, inject_nan=True)
    test.inject_nan(runner, REAL)
    assert torch.isnan(embedding[0]).all() and torch.equal(embedding[1:], original[1:])
    test.restore_nan()
    assert torch.equal(embedding, original)
    assert runner.counters.selftest["nan_injected_replays"] == 1
    runner.bs = runner.raw_bs = runner.raw_num_token = 4  # no padded rows: nothing to inject
    test.inject_nan(runner, _batch(5, 6, 7, 8))
    assert torch.equal(embedding, original)
    test.restore_nan()
    assert runner.counters.selftest["nan_injected_replays"] == 1


def test_no_injection_unless_asked(embedding):
    original = embedding.clone()
    runner = _runner(bs=4, raw_bs=1)
    test = st.GraphSelfTest(runner)
    test.inject_nan(runner, REAL)
    assert torch.equal(embedding, original)
    assert runner.counters.selftest["nonfinite_rows"] == 0


def test_no_injection_when_a_real_row_holds_the_pad_token(embedding):
    original = embedding.clone()
    runner = _runner(bs=4, raw_bs=3)
    test = st.GraphSelfTest(runner, inject_nan=True)
    test.inject_nan(runner, _batch(5, 0, 7))
    assert torch.equal(embedding, original)
    assert runner.counters.selftest["nan_skipped_real_pad_token"] == 1
    assert runner.counters.selftest["nan_injected_replays"] == 0


def test_poison_fills_every_static_input_and_checks_addresses():
    runner = _runner(bs=4, raw_bs=3)
    test = st.GraphSelfTest(runner)
    test.poison(runner)
    assert all(bool((getattr(runner.buffers, n) == st.POISON).all()) for n in st._POISONED)
    assert runner.counters.selftest["addresses_stable"] is True
    runner.buffers.seq_lens = torch.zeros(8, dtype=torch.int64)  # re-allocated after capture
    test.poison(runner)
    assert runner.counters.selftest["addresses_stable"] is False


def test_every_probe_method_the_runner_calls_exists_and_the_selftest_overrides_it():
    """The runner calls its probe (``NO_PROBE`` by default, ``GraphSelfTest`` under
    SGLANG_VERIFY_GRAPH_SELFTEST, GPU only); a renamed or dropped method would first fail inside
    the scheduler. Read the calls from the source."""
    import inspect
    import re

    from sglang_verify_graph import runner

    called = set(re.findall(r"self\.probe\.(\w+)\(", inspect.getsource(runner)))
    assert called == {"before_load", "after_load", "after_enqueue", "after_replay"}
    for name in called:
        assert callable(getattr(st.VerifyProbe, name, None)), name
        assert getattr(st.GraphSelfTest, name) is not getattr(st.VerifyProbe, name), name
