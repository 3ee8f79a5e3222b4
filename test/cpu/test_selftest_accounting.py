"""CPU tier: what the self-tests count (``debug/selftest.py``), on stand-in runners, backends and
models whose outputs differ from the replay's in known rows.

``GraphSelfTest``: the result fields it starts from; per replayed step the eager forward on the
replay's split count (chain runners), checks, rows, argmax mismatches, non-finite rows of logits
and aux hidden states, the worst relative error over steps (NaN kept), steps whose replay and eager
forward disagree on having hidden states, the buckets seen; the upstream reference's counts per
draft position; the probe hooks in the runner's order (poison, NaN in and out around a padded
replay). ``DraftExtendSelfTest``: the poisoned buffers and scratch, ``spec_info`` as the replay
found it during the reference forward and as the replay left it afterwards, the reference forward
under an attention context of the backend, and the counts (rows picked by ``select_index``)."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph.buffers import PAD_TOKEN_ID
from sglang_verify_graph.chain_backend import ChainMetadata
from sglang_verify_graph.compat import sglang_adapter
from sglang_verify_graph.debug import selftest as st


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_relative_errors():
    a = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    b = torch.tensor([[0.3, 0.4], [0.0, 0.0]])
    assert st.row_rel_err(a, b).tolist() == pytest.approx([1.0, 1e12])
    assert st.GraphSelfTest._rel(a[:1], b[:1]) == pytest.approx(1.0)
    assert st.GraphSelfTest._rel(b[:1] * 3, b[:1]) == pytest.approx(2.0)


def test_the_tree_mask_is_on_the_seq_lens_device_whatever_the_default():
    with torch.device("meta"):
        mask = st.chain_tree_mask(torch.tensor([2, 0], device="cpu"), 3)
    assert mask.device.type == "cpu" and mask.int().sum().item() == 3 * 2 + 6 + 6


# ---- GraphSelfTest ------------------------------------------------------------------------------
class _Backend:
    """The chain backend as the self-test uses it: eager metadata (split count 7, as an eager batch
    would get), ``num_kv_splits_for`` of a bucket, the ``reference`` switch."""

    reference = False

    def __init__(self):
        self._chain_meta = None
        self.inits = []

    def init_forward_metadata(self, fb):
        self.inits.append(self.reference)
        self._chain_meta = ChainMetadata(getattr(fb, "req_pool_indices", None), getattr(fb, "seq_lens", None),
                                         7, None, None)

    def num_kv_splits_for(self, bs):
        return 100 + bs


class _Model:
    """``forward`` returns the queued outputs in order and records what each call saw."""

    def __init__(self, backend):
        self.backend, self.outputs, self.seen = backend, [], []

    def forward(self, input_ids, positions, fb):
        meta = self.backend._chain_meta
        self.seen.append(dict(input_ids=input_ids, positions=positions, fb=fb, reference=self.backend.reference,
                              splits=meta.num_kv_splits if meta is not None else None))
        logits, hidden = self.outputs.pop(0)
        return SimpleNamespace(next_token_logits=logits, hidden_states=hidden)


def _runner(ndt=2, chain=True, bs=4, raw_bs=3, **extra):
    backend = _Backend()
    runner = SimpleNamespace(
        buffers=SimpleNamespace(**{n: torch.zeros(8, dtype=torch.int64) for n in st._POISONED}),
        counters=SimpleNamespace(selftest={}), verify_cfg=SimpleNamespace(num_draft_tokens=ndt),
        model_runner=SimpleNamespace(attn_backend=backend), bs=bs, raw_bs=raw_bs, raw_num_token=raw_bs * ndt,
        **extra)
    runner.model_runner.model = _Model(backend)
    if chain is not None:
        runner.chain = chain
    return runner


def _batch(rows, raw_bs=3):
    return SimpleNamespace(input_ids=torch.arange(1, rows + 1), positions=torch.arange(rows) + 50,
                           req_pool_indices=torch.arange(raw_bs), seq_lens=torch.full((raw_bs,), 9),
                           spec_info=SimpleNamespace(custom_mask=None))


def _out(logits, hidden):
    return SimpleNamespace(next_token_logits=logits, hidden_states=hidden)


def _pair(rows=6, vocab=5, hidden=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g)
    logits[torch.arange(rows), torch.arange(rows) % vocab] += 10.0  # a clear argmax per row
    return logits, torch.randn(rows, hidden, generator=g) + 3.0


def _flip_argmax(logits, rows):
    """``logits`` with a new argmax in each of ``rows``."""
    out = logits.clone()
    for r in rows:
        out[r, (int(out[r].argmax()) + 1) % out.shape[1]] += 100.0
    return out


def test_a_fresh_selftest_reports_zeros():
    runner = _runner(ndt=3)
    st.GraphSelfTest(runner)
    assert runner.counters.selftest == dict(
        checks=0, logits_max_rel_err=0.0, hidden_max_rel_err=0.0, argmax_mismatch=0, addresses_stable=True,
        bs_seen={}, raw_bs_seen={}, nonfinite_rows=0, nan_injected_replays=0,
        upstream=dict(checks=0, rows=0, argmax_mismatch=0, nonfinite_rows=0,
                      logits_row_max_rel_err=[0.0] * 3, hidden_row_max_rel_err=[0.0] * 3))
    for chain in (False,):
        runner = _runner(chain=chain)
        assert st.GraphSelfTest(runner).upstream is None and "upstream" not in runner.counters.selftest


def test_each_step_is_counted_and_the_worst_error_kept(monkeypatch):
    """Three steps on a non-chain runner: errors 0.2 / 0.05 then smaller / larger, then a step
    whose replay has a non-finite logits row and two non-finite hidden rows (NaN wins)."""
    runner = _runner(chain=False)
    model, r = runner.model_runner.model, runner.counters.selftest
    probe = st.GraphSelfTest(runner)
    g1, h1 = _pair(seed=1)
    e1, eh1 = _flip_argmax(g1, [1]), h1 * 1.05
    g2, h2 = _pair(seed=2)
    e2, eh2 = _flip_argmax(g2, [0, 4]), h2 * 1.5
    model.outputs = [(e1, eh1), (e2, eh2)]
    fb = _batch(6)
    probe.after_replay(runner, fb, _out(g1, h1))
    assert r["checks"] == 1 and r["rows"] == 6 and r["argmax_mismatch"] == 1 and r["nonfinite_rows"] == 0
    assert r["logits_max_rel_err"] == pytest.approx(_rel(g1, e1))
    assert r["hidden_max_rel_err"] == pytest.approx(_rel(h1, eh1))
    probe.after_replay(runner, fb, _out(g2, h2))
    assert r["checks"] == 2 and r["rows"] == 12 and r["argmax_mismatch"] == 3
    assert r["logits_max_rel_err"] == pytest.approx(max(_rel(g1, e1), _rel(g2, e2)))
    assert r["hidden_max_rel_err"] == pytest.approx(_rel(h2, eh2)) and _rel(h2, eh2) > _rel(h1, eh1)
    assert r["bs_seen"] == {4: 2} and r["raw_bs_seen"] == {3: 2}
    assert [s["input_ids"] is fb.input_ids and s["positions"] is fb.positions and s["fb"] is fb
            for s in model.seen] == [True, True]
    assert [s["splits"] for s in model.seen] == [7, 7]  # not a chain runner: the eager metadata's

    runner.bs, runner.raw_bs = 8, 5
    g3, h3 = _pair(rows=10, seed=3)
    model.outputs = [(g3.clone(), h3.clone())]
    g3[2, 1], g3[6, 1] = float("nan"), float("-inf")  # two rows, one column
    h3[0, 0], h3[7, 0] = float("inf"), float("nan")  # two rows, one column
    probe.after_replay(runner, _batch(10, 5), _out(g3, h3))
    assert r["nonfinite_rows"] == 4 and r["rows"] == 22 and r["checks"] == 3
    assert math.isnan(r["logits_max_rel_err"]) and math.isnan(r["hidden_max_rel_err"])
    assert r["bs_seen"] == {4: 2, 8: 1} and r["raw_bs_seen"] == {3: 2, 5: 1}
    assert "hidden_missing" not in r and "upstream" not in r
    g4, h4 = _pair(seed=4)
    model.outputs = [(g4.clone(), h4.clone())]
    g4[5, 0] = float("nan")
    probe.after_replay(runner, _batch(6), _out(g4, h4))
    assert r["nonfinite_rows"] == 5 and r["bs_seen"] == {4: 2, 8: 2}


@pytest.mark.parametrize("graph_hidden, ref_hidden", [(True, False), (False, True), (False, False)])
def test_a_step_without_hidden_states_on_one_side_is_counted(graph_hidden, ref_hidden):
    runner = _runner(chain=False)
    probe = st.GraphSelfTest(runner)
    g, h = _pair()
    runner.model_runner.model.outputs = [(g.clone(), h.clone() if ref_hidden else None)] * 2
    for _ in range(2):
        probe.after_replay(runner, _batch(6), _out(g, h if graph_hidden else None))
    r = runner.counters.selftest
    assert r.get("hidden_missing") == (2 if graph_hidden != ref_hidden else None)
    assert r["hidden_max_rel_err"] == 0.0 and r["checks"] == 2


@pytest.mark.parametrize("extra", [dict(chain=True), dict(chain=None)], ids=["chain", "chain-unset"])
def test_a_chain_runners_eager_forward_uses_the_replays_split_count(extra):
    """The eager forward runs with the bucket's split count (the replay's reduction order), then
    the upstream reference in ``reference`` mode; a runner without ``chain`` is a chain runner."""
    runner = _runner(**extra)
    model = runner.model_runner.model
    probe = st.GraphSelfTest(runner)
    g, h = _pair()
    model.outputs = [(g.clone(), h.clone()), (g.clone(), h.clone())]
    probe.after_replay(runner, _batch(6), _out(g, h))
    assert [(s["splits"], s["reference"]) for s in model.seen] == [(100 + runner.bs, False), (7, True)]
    assert runner.model_runner.attn_backend.reference is False
    assert runner.counters.selftest["upstream"]["checks"] == 1


def test_the_upstream_reference_counts_per_draft_position_over_steps():
    """Upstream rows differ at draft position 1 (logits, step 1) and 0 (hidden, step 2): each
    position keeps its worst row over steps; argmax mismatches and the reference's non-finite
    rows add up."""
    ndt = 2
    runner = _runner(ndt=ndt)
    model, u = runner.model_runner.model, None
    probe = st.GraphSelfTest(runner)
    u = runner.counters.selftest["upstream"]
    g, h = _pair()
    up1 = _flip_argmax(g, [3])  # request 1, position 1
    up2_h = h.clone()
    up2_h[4] *= 2.0  # request 2, position 0
    up2 = g.clone()
    up2[1, 0], up2[5, 0] = float("-inf"), float("inf")  # position 1, two rows in one column
    model.outputs = [(g.clone(), h.clone()), (up1, h.clone()), (g.clone(), h.clone()), (up2, up2_h)]
    fb = _batch(6)
    probe.after_replay(runner, fb, _out(g, h))
    assert u["checks"] == 1 and u["rows"] == 6 and u["argmax_mismatch"] == 1 and u["nonfinite_rows"] == 0
    err1 = st.row_rel_err(g, up1).view(-1, ndt).amax(0).tolist()
    assert u["logits_row_max_rel_err"] == pytest.approx(err1) and err1[0] == 0.0 < err1[1]
    assert u["hidden_row_max_rel_err"] == [0.0, 0.0]
    probe.after_replay(runner, fb, _out(g, h))
    assert u["checks"] == 2 and u["rows"] == 12 and u["argmax_mismatch"] == 1 and u["nonfinite_rows"] == 2
    assert math.isnan(u["logits_row_max_rel_err"][1]) and u["logits_row_max_rel_err"][0] == 0.0
    assert u["hidden_row_max_rel_err"] == pytest.approx([_rel(h[4:5], up2_h[4:5]), 0.0])
    model.outputs = [(g.clone(), h.clone()), (up2, h.clone())]
    probe.after_replay(runner, fb, _out(g, h))
    assert u["nonfinite_rows"] == 4 and u["checks"] == 3
    assert [s["positions"] is fb.positions and s["input_ids"] is fb.input_ids for s in model.seen] == [True] * 6
    assert runner.model_runner.attn_backend.reference is False


def test_the_upstream_reference_without_replay_hidden_states_compares_logits_only():
    runner = _runner(ndt=2)
    probe = st.GraphSelfTest(runner)
    g, h = _pair()
    runner.model_runner.model.outputs = [(g.clone(), None), (g.clone(), h * 2.0)]
    probe.after_replay(runner, _batch(6), _out(g, None))
    u = runner.counters.selftest["upstream"]
    assert u["checks"] == 1 and u["hidden_row_max_rel_err"] == [0.0, 0.0]


# ---- NaN injection and the probe hooks ----------------------------------------------------------
@pytest.fixture
def embedding(monkeypatch):
    """The target's embedding (3 tokens x 4), its row looked up for the runner's model runner."""
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    owner = {}

    def row(model_runner, token_id):
        assert model_runner is owner["mr"], "the embedding of another model runner"
        return weight[token_id]

    monkeypatch.setattr(sglang_adapter, "local_embedding_row", row)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return weight, owner


def test_the_hooks_in_the_runners_order_around_a_padded_replay(embedding):
    weight, owner = embedding
    original = weight.clone()
    runner = _runner(ndt=1, bs=4, raw_bs=3)
    owner["mr"] = runner.model_runner
    probe = st.GraphSelfTest(runner, inject_nan=True)
    fb = _batch(3)
    for step in (1, 2):
        probe.before_load(runner, fb)
        assert all(bool((getattr(runner.buffers, n) == st.POISON).all()) for n in st._POISONED)
        probe.after_load(runner, fb)
        assert torch.isnan(weight[PAD_TOKEN_ID]).all() and torch.equal(weight[1:], original[1:])
        probe.after_enqueue(runner)
        assert torch.equal(weight, original)
        assert runner.counters.selftest["nan_injected_replays"] == step


def test_a_restored_row_is_left_alone_by_later_restores(embedding):
    """``restore_nan`` undoes its own injection once: a later change of the row (a weight update)
    stays."""
    weight, owner = embedding
    runner = _runner(ndt=1, bs=4, raw_bs=3)
    owner["mr"] = runner.model_runner
    probe = st.GraphSelfTest(runner, inject_nan=True)
    probe.restore_nan()  # nothing injected yet: nothing to put back
    weight[PAD_TOKEN_ID] = 5.0
    probe.restore_nan()
    assert (weight[PAD_TOKEN_ID] == 5.0).all()
    probe.inject_nan(runner, _batch(3))
    probe.restore_nan()
    weight[PAD_TOKEN_ID] = 7.0
    probe.restore_nan()
    assert (weight[PAD_TOKEN_ID] == 7.0).all()


def test_without_injection_the_hooks_touch_no_embedding(embedding):
    runner = _runner(ndt=1, bs=4, raw_bs=3)
    probe = st.GraphSelfTest(runner)
    probe.before_load(runner, _batch(3))
    probe.after_load(runner, _batch(3))
    probe.after_enqueue(runner)
    assert runner.counters.selftest["nan_injected_replays"] == 0


def test_each_skip_for_a_real_pad_token_is_counted(embedding):
    weight, owner = embedding
    runner = _runner(ndt=1, bs=4, raw_bs=3)
    owner["mr"] = runner.model_runner
    probe = st.GraphSelfTest(runner, inject_nan=True)
    for n in (1, 2):
        probe.inject_nan(runner, SimpleNamespace(input_ids=torch.tensor([5, PAD_TOKEN_ID, 7, 9])))
        assert runner.counters.selftest["nan_skipped_real_pad_token"] == n
    assert runner.counters.selftest["nan_injected_replays"] == 0


# ---- DraftExtendSelfTest ------------------------------------------------------------------------
_SPEC = st._SPEC_FIELDS


@pytest.fixture
def contexts(monkeypatch):
    """Backends the reference forward ran under (``adapter.attention_context``)."""
    entered = []

    @contextlib.contextmanager
    def context(backend):
        entered.append(backend)
        yield
        entered.append("exit")

    monkeypatch.setattr(st.adapter, "attention_context", context)
    return entered


def _draft_runner(bs=4, raw_bs=3, buffers=st._DRAFT_EXTEND_POISONED, static=True):
    backend = _Backend()
    if static:
        backend._chain_static = (torch.zeros(6), torch.zeros(3))
    runner = SimpleNamespace(buffers=SimpleNamespace(**{n: torch.zeros(8, dtype=torch.int64) for n in buffers}),
                             draft_extend_attn_backend=backend, bs=bs, raw_bs=raw_bs)
    runner.model_runner = SimpleNamespace(model=_Model(backend))
    return runner


def test_a_fresh_draft_extend_selftest_reports_zeros():
    selftest = {"checks": 4}
    st.DraftExtendSelfTest(_draft_runner(), selftest)
    assert selftest == {"checks": 4, "draft_extend": dict(
        checks=0, logits_max_rel_err=0.0, hidden_max_rel_err=0.0, argmax_mismatch=0, nonfinite_rows=0,
        rows=0, bs_seen={}, raw_bs_seen={})}


@pytest.mark.parametrize("buffers, static", [(st._DRAFT_EXTEND_POISONED, True), (("seq_lens",), False)],
                         ids=["all", "some-buffers-no-scratch"])
def test_before_execute_poisons_what_the_runner_has(buffers, static):
    runner = _draft_runner(buffers=buffers, static=static)
    probe = st.DraftExtendSelfTest(runner, {})
    probe.before_execute(runner, SimpleNamespace(spec_info=SimpleNamespace()))
    assert all(bool((getattr(runner.buffers, n) == st.POISON).all()) for n in buffers)
    for buf in getattr(runner.draft_extend_attn_backend, "_chain_static", ()):
        assert buf.isnan().all()


def test_the_reference_sees_the_spec_info_the_replay_found_and_leaves_the_replays(contexts):
    """``execute`` rewrites ``spec_info`` fields; the reference forward must see them as they were
    before the replay, and the caller sees the replay's afterwards. Fields the spec lacks stay
    absent."""
    runner = _draft_runner()
    backend, model = runner.draft_extend_attn_backend, runner.model_runner.model
    probe = st.DraftExtendSelfTest(runner, {})
    spec = SimpleNamespace(positions="p0", num_correct_drafts="c0", extend_seq_lens_cpu="e0")
    fb = SimpleNamespace(spec_info=spec, input_ids=torch.arange(6), positions=torch.arange(6) + 9,
                         req_pool_indices=torch.arange(3), seq_lens=torch.full((3,), 9))
    probe.before_execute(runner, fb)
    spec.positions, spec.num_correct_drafts, spec.extend_seq_lens_cpu = "p1", "c1", "e1"  # the replay
    seen = {}

    def forward(input_ids, positions, f):
        seen.update({k: getattr(spec, k) for k in vars(spec)}, reference=backend.reference,
                    context=list(contexts), args=(input_ids, positions, f))
        g, h = _pair()
        return SimpleNamespace(next_token_logits=g, hidden_states=h)

    model.forward = forward
    g, h = _pair()
    probe.after_execute(runner, fb, _out(g, h))
    assert {k: seen[k] for k in ("positions", "num_correct_drafts", "extend_seq_lens_cpu")} == \
        dict(positions="p0", num_correct_drafts="c0", extend_seq_lens_cpu="e0")
    assert seen["reference"] is True and seen["context"] == [backend]
    assert seen["args"][0] is fb.input_ids and seen["args"][1] is fb.positions and seen["args"][2] is fb
    assert vars(spec) == dict(positions="p1", num_correct_drafts="c1", extend_seq_lens_cpu="e1")
    assert backend.reference is False and contexts == [backend, "exit"] and backend.inits == [True]


def test_draft_extend_steps_are_counted(contexts):
    """Two steps: the reference's rows picked by ``select_index`` (0.5.20 on) or its first rows;
    errors and mismatches from the picked rows; non-finite rows of the replay's logits and hidden
    states."""
    runner = _draft_runner(bs=4, raw_bs=3)
    model = runner.model_runner.model
    r = {}
    probe = st.DraftExtendSelfTest(runner, r)
    r = r["draft_extend"]
    fb = SimpleNamespace(spec_info=SimpleNamespace(), input_ids=None, positions=None)
    g, h = _pair(rows=3)
    ref_all, ref_h = _pair(rows=9, seed=5)
    select = torch.tensor([2, 4, 8])
    ref_all[select], ref_h[select] = _flip_argmax(g, [1]), h * 1.2
    model.outputs = [(ref_all.clone(), ref_h.clone())]
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, _out(g, h), select_index=select)
    assert r["checks"] == 1 and r["rows"] == 3 and r["argmax_mismatch"] == 1 and r["nonfinite_rows"] == 0
    assert r["logits_max_rel_err"] == pytest.approx(_rel(g, ref_all[select]))
    assert r["hidden_max_rel_err"] == pytest.approx(_rel(h, ref_h[select]))
    assert r["bs_seen"] == {4: 1} and r["raw_bs_seen"] == {3: 1}

    g2, h2 = _pair(rows=3, seed=7)
    first = torch.cat([_flip_argmax(g2, [0, 1]), torch.zeros(4, 5)])
    model.outputs = [(first, torch.cat([h2, torch.zeros(4, 4)]))]
    g2[0, 4], g2[1, 4] = float("nan"), float("nan")  # two rows, one column
    h2[0, 0], h2[2, 0] = float("inf"), float("inf")
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, _out(g2, h2))
    assert r["checks"] == 2 and r["rows"] == 6 and r["argmax_mismatch"] == 3 and r["nonfinite_rows"] == 4
    assert math.isnan(r["logits_max_rel_err"]) and r["hidden_max_rel_err"] == math.inf
    assert r["bs_seen"] == {4: 2} and r["raw_bs_seen"] == {3: 2}
    runner.bs, runner.raw_bs = 2, 2
    g3, h3 = _pair(rows=2, seed=8)
    model.outputs = [(g3.clone(), h3.clone())]
    g3[1, 1] = float("nan")
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, _out(g3, h3))
    assert r["nonfinite_rows"] == 5 and r["rows"] == 8
    assert r["bs_seen"] == {4: 2, 2: 1} and r["raw_bs_seen"] == {3: 2, 2: 1}


def test_draft_extend_without_hidden_states_counts_logits_only(contexts):
    runner = _draft_runner()
    r = {}
    probe = st.DraftExtendSelfTest(runner, r)
    g, h = _pair(rows=3)
    h[0, 0] = float("nan")
    runner.model_runner.model.outputs = [(g.clone(), None), (g.clone(), h.clone())]
    fb = SimpleNamespace(spec_info=SimpleNamespace(), input_ids=None, positions=None)
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, _out(g, h))  # the reference has none
    probe.before_execute(runner, fb)
    probe.after_execute(runner, fb, _out(g, None))  # the replay has none
    assert r["draft_extend"]["nonfinite_rows"] == 0 and r["draft_extend"]["hidden_max_rel_err"] == 0.0
