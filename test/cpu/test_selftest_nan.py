"""CPU tier: the NaN-in-padded-rows mode of the in-server self-test.

Failure mode guarded (on the GPU by ``test/gpu/test_nan_guard.py``): a NaN in a padded row of a
verify replay reaching real rows (e.g. through a cross-row reduction), which SGLang's
``--enable-nan-detection`` would then report as a model failure. Here: the switch is parsed in
``read_env`` and reaches the config only with the self-test; the row is NaN from ``load_batch``
of a padded bucket until the replay is enqueued and restored afterwards; an unpadded batch is
left alone; error maxima keep NaN instead of dropping it.

The self-test's independent references, with the real chain backends (kernel and SGLang's parent
methods replaced by recorders): ``GraphSelfTest`` and ``DraftExtendSelfTest`` set ``reference`` so
that their reference forward takes SGLang's own TARGET_VERIFY / DRAFT_EXTEND_V2 attention, not the
chain kernel under test, and put the switch back afterwards.
"""

import math
import types

import pytest
import torch

from sglang_verify_graph.debug import selftest as st
from sglang_verify_graph.compat import sglang_adapter
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
                                 model_runner=object(), bs=bs, raw_bs=raw_bs, raw_num_token=raw_bs,
                                 verify_cfg=types.SimpleNamespace(num_draft_tokens=1))


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


def test_chain_tree_mask_is_sglangs_full_mask_of_a_chain():
    """Per request ``ndt`` rows of ``seq_len + ndt``: the prefix visible, the drafts causal."""
    mask = st.chain_tree_mask(torch.tensor([2, 0]), 3)
    assert mask.dtype == torch.bool and mask.numel() == 3 * (2 + 3) + 3 * (0 + 3)
    first = mask[:15].view(3, 5).int().tolist()
    assert first == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert mask[15:].view(3, 3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_upstream_reference_runs_sglangs_path_and_reports_each_draft_position():
    """``compare_upstream`` runs the batch with the backend in ``reference`` mode (SGLang's own
    TARGET_VERIFY attention) and the chain's full tree mask in ``spec_info``, puts both back, and
    reports the per-row error per draft position: a wrong row at draft position 1 shows there."""
    ndt, raw_bs, vocab = 3, 2, 5
    ours = torch.randn(raw_bs * ndt, vocab)
    seen = {}

    class Backend:
        reference = False

        def init_forward_metadata(self, fb):
            seen["reference_at_init"] = self.reference
            seen["mask"] = fb.spec_info.custom_mask.clone()

    backend = Backend()

    def forward(input_ids, positions, fb):
        seen["reference_at_forward"] = backend.reference
        ref = ours.clone()
        ref[1 * ndt + 1] += 1.0  # request 1, draft position 1
        return types.SimpleNamespace(next_token_logits=ref, hidden_states=None)

    qlen_only = torch.ones(raw_bs * ndt * ndt, dtype=torch.bool)
    fb = types.SimpleNamespace(spec_info=types.SimpleNamespace(custom_mask=qlen_only),
                               seq_lens=torch.tensor([4, 7, 1 << 40]), input_ids=None, positions=None)
    runner = _runner(4, raw_bs)
    runner.verify_cfg = types.SimpleNamespace(num_draft_tokens=ndt)
    runner.model_runner = types.SimpleNamespace(attn_backend=backend,
                                                model=types.SimpleNamespace(forward=forward))
    probe = st.GraphSelfTest(runner)
    probe.compare_upstream(runner, fb, ours, None)
    assert seen["reference_at_init"] and seen["reference_at_forward"] and not backend.reference
    assert torch.equal(seen["mask"], st.chain_tree_mask(torch.tensor([4, 7]), ndt))  # real rows only
    assert fb.spec_info.custom_mask is qlen_only
    u = runner.counters.selftest["upstream"]
    assert u["checks"] == 1 and u["rows"] == raw_bs * ndt and u["nonfinite_rows"] == 0
    err = u["logits_row_max_rel_err"]
    assert err[0] == 0.0 and err[2] == 0.0 and err[1] > 0.05, err


# ---- the self-tests' reference switch, on the real chain backends --------------------------------
@pytest.fixture
def attention_paths(monkeypatch):
    """The attention each forward reached, in order: ``"chain"`` (the chain kernel's launch),
    ``"sglang"`` (SGLang's triton ``forward_extend``, the backends' parent), ``"sglang metadata"``
    (the parent's ``init_forward_metadata``)."""
    from sglang_verify_graph import chain_backend as cb

    paths = []
    parent = sglang_adapter.triton_attn_backend_cls()
    monkeypatch.setattr(sglang_adapter, "kv_write_loc", lambda *a, **k: None)
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: paths.append("chain"))
    monkeypatch.setattr(parent, "forward_extend", lambda self, *a, **k: paths.append("sglang"))
    monkeypatch.setattr(parent, "init_forward_metadata",
                        lambda self, fb: paths.append("sglang metadata"))
    return paths


def _one_layer_model(backend, layer, q, k, logits):
    """A model whose forward is one attention layer calling ``backend`` and returns ``logits``."""
    def forward(input_ids, positions, fb):
        backend.forward_extend(q, k, k.clone(), layer, fb)
        return types.SimpleNamespace(next_token_logits=logits.clone(), hidden_states=None)

    return types.SimpleNamespace(forward=forward)


def test_graph_selftest_reference_is_sglangs_target_verify_not_the_chain_kernel(attention_paths):
    """After a replay ``GraphSelfTest`` runs the batch eagerly twice on the real
    ``ChainVerifyTritonBackend``: through the chain kernel (graph vs eager), then, with
    ``reference`` set, through SGLang's own TARGET_VERIFY metadata and attention (the independent
    reference; were it the chain kernel again, a kernel bug would agree with itself). The switch
    is put back: the next TARGET_VERIFY forward is the chain kernel's."""
    from cpu_stubs import chain_backend_stub, forward_mode
    from sglang_verify_graph import chain_backend as cb

    ndt, bs = 3, 2
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend, ndt=ndt, bs=bs)
    backend.device, backend.device_core_count, backend._chain_static = "cpu", 4, None
    logits = torch.randn(bs * ndt, 5)
    runner = _runner(bs=bs, raw_bs=bs)
    runner.verify_cfg = types.SimpleNamespace(num_draft_tokens=ndt)
    runner.model_runner = types.SimpleNamespace(
        attn_backend=backend, model=_one_layer_model(backend, layer, q, k, logits))
    fb = types.SimpleNamespace(
        forward_mode=forward_mode("TARGET_VERIFY"), batch_size=bs, input_ids=None, positions=None,
        req_pool_indices=torch.zeros(bs, dtype=torch.int64), seq_lens=torch.tensor([5, 9]),
        spec_info=types.SimpleNamespace(custom_mask=None))

    probe = st.GraphSelfTest(runner)
    probe.after_replay(runner, fb, types.SimpleNamespace(next_token_logits=logits, hidden_states=None))
    assert attention_paths == ["chain", "sglang metadata", "sglang"]
    assert runner.counters.selftest["checks"] == runner.counters.selftest["upstream"]["checks"] == 1
    assert not backend.reference
    backend.forward_extend(q, k, k.clone(), layer, fb)
    assert attention_paths[3:] == ["chain"]


def test_draft_extend_selftest_reference_is_sglangs_draft_extend_not_the_chain_kernel(attention_paths):
    """After a draft-extend replay ``DraftExtendSelfTest`` runs the batch eagerly on the real
    ``ChainDraftExtendTritonBackend`` with ``reference`` set: SGLang's own DRAFT_EXTEND_V2
    metadata and attention, never the chain kernel the graph ran. The switch is put back: the
    next DRAFT_EXTEND_V2 forward is the chain kernel's."""
    from cpu_stubs import chain_backend_stub, forward_mode
    from sglang_verify_graph import chain_backend as cb

    ndt, bs = 3, 2
    backend, layer, q, k = chain_backend_stub(cb.ChainDraftExtendTritonBackend, ndt=ndt, bs=bs)
    backend.device, backend.device_core_count, backend._chain_static = "cpu", 4, None
    logits = torch.randn(bs * ndt, 5)
    runner = types.SimpleNamespace(
        buffers=types.SimpleNamespace(**{n: torch.zeros(8, dtype=torch.int64)
                                         for n in st._DRAFT_EXTEND_POISONED}),
        draft_extend_attn_backend=backend, bs=bs, raw_bs=bs,
        model_runner=types.SimpleNamespace(model=_one_layer_model(backend, layer, q, k, logits)))
    fb = types.SimpleNamespace(
        forward_mode=forward_mode("DRAFT_EXTEND_V2"), batch_size=bs, input_ids=None, positions=None,
        req_pool_indices=torch.zeros(bs, dtype=torch.int64), seq_lens=torch.tensor([8, 12]),
        spec_info=types.SimpleNamespace())

    selftest = {}
    probe = st.DraftExtendSelfTest(runner, selftest)
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, types.SimpleNamespace(next_token_logits=logits, hidden_states=None))
    assert attention_paths == ["sglang metadata", "sglang"]
    assert selftest["draft_extend"]["checks"] == 1
    assert not backend.reference
    backend.forward_extend(q, k, k.clone(), layer, fb)
    assert attention_paths[2:] == ["chain"]
