"""CPU tier: the compat layer's accessors and hook-registry mechanics, in-process
(``compat/sglang_adapter.py``).

* version facts: release strings with local and pre-release tails, ``_since`` at and past the
  installed release;
* accessors of each change point on stand-ins, on both sides of the point (the point's flag set
  as each release has it): the DP vote, the draft-extend ``select_index``, the DP batch size, the
  KV translation check; the ones that only forward to SGLang (process kill, free GPU memory, the
  0.5.16 graph capture result, the attention context, the logit cap) with the arguments SGLang
  takes; this rank's embedding row of a token under vocab sharding;
* the registry: ``install_attention_factory`` once per process; ``install_hooks`` on targets of a
  stand-in module with SGLang's ``HookRegistry`` emptied for the test: hooks applied, the registry
  handed back empty (so a later plugin's hook on the same target is applied on top), a target
  that does not resolve or does not take the hook reported in one entry each, the wrapper chain
  walked to find an applied hook (classmethods too), and the walk bounded."""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_verify_graph.compat import sglang_adapter as sa


# ---- version facts -------------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [
    ("0.5.23+cu130", (0, 5, 23)), ("1.2+3.4", (1, 2, 0)), ("0.5.rc1", (0, 5, 0)), ("1.2", (1, 2, 0)),
    ("7", (7, 0, 0)), ("0.5.20.post2", (0, 5, 20)),
])
def test_version_tuples(text, want):
    assert sa._version_tuple(text) == want


def test_since_counts_the_installed_release_itself():
    assert sa._since(sa.SGLANG_VERSION) is True
    assert sa._since(sa.SUPPORTED_RANGE[0]) is True
    assert sa._since("99.0.0") is False


# ---- accessors on both sides of their change point ----------------------------------------------
@pytest.mark.parametrize("resolve_once", [False, True])
def test_the_dp_vote_field_of_each_release(monkeypatch, resolve_once):
    monkeypatch.setattr(sa, "RESOLVE_ONCE", resolve_once)
    field, other = ("can_run_decode_cuda_graph", "can_run_dp_cuda_graph")[::1 if resolve_once else -1]
    for value in (True, False):
        assert sa.can_run_dp(SimpleNamespace(**{field: value, other: not value})) is value


@pytest.mark.parametrize("resolve_once", [False, True])
def test_the_kv_translation_check_of_each_release(monkeypatch, resolve_once):
    monkeypatch.setattr(sa, "RESOLVE_ONCE", resolve_once)
    if resolve_once:
        cases = [(SimpleNamespace(kv_index_translator=SimpleNamespace(is_translating=True)), True),
                 (SimpleNamespace(kv_index_translator=SimpleNamespace(is_translating=False)), False),
                 (SimpleNamespace(kv_index_translator=SimpleNamespace()), False)]
    else:
        cases = [(SimpleNamespace(_translate_kv_loc=None), False), (SimpleNamespace(_translate_kv_loc=object()), True)]
    for backend, want in cases:
        assert sa.kv_translation_active(backend) is want


@pytest.mark.parametrize("takes_it", [False, True])
def test_the_draft_extend_select_index_of_each_release(monkeypatch, takes_it):
    monkeypatch.setattr(sa, "DRAFT_EXTEND_SELECT_INDEX", takes_it)
    idx = torch.tensor([2, 5])
    got = [sa.draft_extend_select_index((idx,), {}), sa.draft_extend_select_index((), {"select_index": idx}),
           sa.draft_extend_select_index((), {})]
    assert got == ([idx, idx, None] if takes_it else [None, None, None])


@pytest.mark.parametrize("helper", [False, True])
def test_the_dp_batch_size_of_each_release(monkeypatch, helper):
    monkeypatch.setattr(sa, "DP_BATCH_SIZE_HELPER", helper)
    fb = SimpleNamespace(original_global_num_tokens_cpu=[3, 7, 2])
    runner = SimpleNamespace(_max_dp_batch_size=lambda f: 11 if f is fb else -1)
    assert sa.dp_batch_size(runner, fb) == (11 if helper else 7)


def test_the_kv_write_target_of_the_installed_release():
    if sa.KV_WRITE_LOC_FOR_BATCH:
        pytest.skip("0.5.22 on: KVWriteLoc.for_batch builds it (test_sglang_versions.py)")
    fb = SimpleNamespace(out_cache_loc=torch.arange(4))
    loc = sa.kv_write_loc(fb)
    assert (loc.loc, loc.swa_loc, loc.full_loc) == (fb.out_cache_loc, None, None)


def test_kill_process_tree_forwards_to_sglangs(monkeypatch):
    import sglang.srt.utils

    calls = []
    monkeypatch.setattr(sglang.srt.utils, "kill_process_tree", lambda pid, **kw: calls.append((pid, kw)))
    sa.kill_process_tree(123)
    sa.kill_process_tree(456, wait_timeout=5)
    assert calls == [(123, {"wait_timeout": 60}), (456, {"wait_timeout": 5})]


def test_free_gpu_memory_of_the_runners_device(monkeypatch):
    import sglang.srt.utils

    monkeypatch.setattr(sglang.srt.utils, "get_available_gpu_memory", lambda device, gpu_id: (device, gpu_id))
    assert sa.available_gpu_memory(SimpleNamespace(device="cuda", gpu_id=3)) == ("cuda", 3)


def test_the_0516_capture_result():
    if sa.RUNNER_CLS_HOOK:
        pytest.skip("0.5.17 on: no DecodeGraphCapture")
    runner = object()
    cap = sa.decode_graph_capture(runner, 1.5)
    assert cap.runner is runner and cap.graph_mem_usage == 1.5


def test_the_attention_context_hands_sglangs_layers_the_backend():
    from sglang.srt.model_executor.forward_context import get_forward_context

    backend = object()
    with sa.attention_context(backend):
        assert get_forward_context().attn_backend is backend


@pytest.mark.parametrize("cap, method, want", [(0.0, "tanh", 0.0), (None, "tanh", 0.0), (30, "tanh", 30.0),
                                               (0.5, "tanh", 0.5)])
def test_the_layers_logit_cap(cap, method, want):
    got = sa.logit_cap(SimpleNamespace(logit_cap=cap, logit_capping_method=method))
    assert got == want and type(got) is float


def test_a_logit_cap_of_a_method_sglang_lacks_is_sglangs_error():
    with pytest.raises(ValueError):
        sa.logit_cap(SimpleNamespace(logit_cap=5.0, logit_capping_method="softsign"))


@pytest.mark.parametrize("aux, want", [(SimpleNamespace(eagle_aux_hidden_state_layer_ids=[1, 4, 9, 20]), 4),
                                       (SimpleNamespace(eagle_aux_hidden_state_layer_ids=None), 3),
                                       (SimpleNamespace(eagle_aux_hidden_state_layer_ids=[]), 3),
                                       (SimpleNamespace(), 3)], ids=["named", "none", "empty", "absent"])
def test_aux_hidden_states_per_token(aux, want):
    assert sa.num_aux_hidden_states(SimpleNamespace(spec_aux_config=aux)) == want


@pytest.mark.parametrize("topk, want", [(1, True), (None, True), (2, False)])
def test_an_eagle_target_with_topk_one_or_unset(topk, want):
    runner = SimpleNamespace(is_draft_worker=False, spec_algorithm=SimpleNamespace(is_eagle=lambda: True),
                             server_args=SimpleNamespace(speculative_eagle_topk=topk))
    assert sa.is_eagle_topk1_target(runner) is want


@pytest.mark.parametrize("present", [False, True])
def test_sgl_kernel_is_looked_up_by_its_name(monkeypatch, present):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if present else None) if name == "sgl_kernel" else real(name, *a))
    assert sa.sgl_kernel_installed() is present


# ---- the embedding row of a token ----------------------------------------------------------------
def _model_runner(start=None, rows=5):
    weight = torch.nn.Parameter(torch.arange(rows * 4, dtype=torch.float32).view(rows, 4))
    emb = SimpleNamespace(weight=weight)
    if start is not None:
        emb.shard_indices = SimpleNamespace(org_vocab_start_index=start)
    return SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: emb)), weight


@pytest.mark.parametrize("start, token, row", [
    (10, 10, 0), (10, 12, 2), (10, 14, 4), (10, 9, None), (10, 15, None),
    (None, 0, 0), (None, 3, 3), (None, 5, None),
])
def test_this_ranks_embedding_row_of_a_token(start, token, row):
    mr, weight = _model_runner(start)
    got = sa.local_embedding_row(mr, token)
    if row is None:
        assert got is None
    else:
        assert got.data_ptr() == weight.data[row].data_ptr() and got.shape == (4,) and not got.requires_grad


# ---- the attention registry ----------------------------------------------------------------------
def test_the_attention_factory_is_wrapped_once_per_process(monkeypatch):
    from sglang.srt.layers.attention import attention_registry as registry

    original = lambda runner: "upstream"  # noqa: E731
    monkeypatch.setattr(registry, "ATTENTION_BACKENDS", {"triton": original, "fa3": "other"})
    wrapped = []

    def wrap(fn):
        wrapped.append(fn)
        return lambda runner: ("ours", fn(runner))

    sa.install_attention_factory("triton", wrap)
    factory = registry.ATTENTION_BACKENDS["triton"]
    assert factory("r") == ("ours", "upstream") and factory._verify_graph_factory is True
    sa.install_attention_factory("triton", wrap)
    assert registry.ATTENTION_BACKENDS["triton"] is factory and wrapped == [original]
    assert registry.ATTENTION_BACKENDS["fa3"] == "other"


# ---- the hook registry ---------------------------------------------------------------------------
MOD = "vg_adapter_hook_targets"


@pytest.fixture
def targets(monkeypatch):
    """A stand-in module of hook targets, and SGLang's ``HookRegistry`` empty for the test."""
    mod = types.ModuleType(MOD)

    def greet(x):
        return f"hi {x}"

    class Tool:
        def run(self, x):
            return x * 2

        @classmethod
        def make(cls, x):
            return x + 1

    mod.greet, mod.Tool = greet, Tool
    monkeypatch.setitem(sys.modules, MOD, mod)
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    return mod


def _after(tag):
    return lambda result, *a, **k: f"{result} {tag}"


def test_hooks_are_applied_and_the_registry_handed_back_empty(targets):
    around = lambda original, self, x: original(self, x) + 100  # noqa: E731
    make = lambda original, cls, x: original(cls, x) * 10  # noqa: E731
    missing = sa.install_hooks([(f"{MOD}.greet", _after("ours"), HookType.AFTER),
                                (f"{MOD}.Tool.run", around, HookType.AROUND),
                                (f"{MOD}.Tool.make", make, HookType.AROUND)])
    assert missing == []
    assert targets.greet("a") == "hi a ours"
    assert targets.Tool().run(2) == 104 and targets.Tool.make(3) == 40
    assert dict(HookRegistry._hooks) == {} and HookRegistry._patched == set()


def test_a_later_plugins_hook_on_the_same_target_is_applied_on_top(targets):
    """What ``load_plugins()`` does after our ``register``: more hooks registered, then one
    ``apply_hooks()``; ours stay applied and are still seen under the later wrapper."""
    ours = _after("ours")
    assert sa.install_hooks([(f"{MOD}.greet", ours, HookType.AFTER)]) == []
    HookRegistry.register(f"{MOD}.greet", _after("later"), HookType.AFTER)
    HookRegistry.apply_hooks()
    assert targets.greet("a") == "hi a ours later"
    assert sa._is_applied(f"{MOD}.greet", ours)


def test_each_target_that_does_not_take_its_hook_is_reported(targets):
    ok = _after("ours")
    missing = sa.install_hooks([(f"{MOD}.nothing", ok, HookType.AFTER),
                                (f"{MOD}.Tool", ok, HookType.AFTER),  # a class takes REPLACE only
                                (f"{MOD}.greet", ok, HookType.AFTER),
                                ("vg_no_such_module_here.f", ok, HookType.AFTER)])
    assert missing[0] == (f"{MOD}.nothing (AttributeError: module '{MOD}' has no attribute 'nothing')")
    assert missing[1].startswith("vg_no_such_module_here.f (ModuleNotFoundError: ") and missing[1].endswith(")")
    assert missing[2:] == [f"{MOD}.Tool"]
    assert targets.greet("a") == "hi a ours"
    assert f"{MOD}.nothing" not in HookRegistry._hooks  # never registered: SGLang would log a traceback
    assert f"{MOD}.Tool" in HookRegistry._hooks and f"{MOD}.greet" not in HookRegistry._hooks


def _wrapped(inner, hook=None):
    """A wrapper as ``HookRegistry`` builds one: ``__wrapped__`` to ``inner``, ``hook`` in its
    closure (or only ``inner``)."""
    if hook is None:
        @functools.wraps(inner)
        def plain(*a, **k):
            return inner(*a, **k)
        return plain

    @functools.wraps(inner)
    def w(*a, **k):
        return hook(inner(*a, **k))
    return w


@pytest.mark.parametrize("depth, seen", [(0, True), (8, True), (15, True), (16, False)])
def test_the_wrapper_chain_is_walked_for_an_applied_hook(targets, depth, seen):
    """Our wrapper under ``depth`` later ones is found; the walk stops after 16 wrappers."""
    hook = _after("ours")
    fn = _wrapped(targets.greet, hook)
    for _ in range(depth):
        fn = _wrapped(fn)
    targets.greet = fn
    assert sa._is_applied(f"{MOD}.greet", hook) is seen
    assert sa._is_applied(f"{MOD}.greet", _after("other")) is False


def test_a_cyclic_wrapper_chain_ends_the_walk(targets):
    fn = _wrapped(targets.greet)
    fn.__wrapped__ = fn
    targets.greet = fn
    assert sa._is_applied(f"{MOD}.greet", _after("ours")) is False


def test_a_hook_on_a_classmethod_is_seen(targets):
    hook = _after("ours")
    raw = targets.Tool.__dict__["make"].__func__
    targets.Tool.make = classmethod(_wrapped(raw, hook))
    assert sa._is_applied(f"{MOD}.Tool.make", hook) is True
    assert sa._is_applied(f"{MOD}.Tool.run", hook) is False


# ---- gathering over the TP group -----------------------------------------------------------------
@pytest.fixture
def dist_calls(monkeypatch):
    """``torch.distributed`` stand-ins: a group's world size is ``group.size``; ``all_gather_object``
    fills rank ``i``'s slot with ``(i, obj)``. Returns the calls."""
    import torch.distributed as dist

    calls = []

    def world(group=None):
        calls.append(("size", group))
        return group.size

    def gather(out, obj, group=None):
        calls.append(("gather", len(out), obj, group))
        out[:] = [(i, obj) for i in range(len(out))]

    monkeypatch.setattr(dist, "get_world_size", world)
    monkeypatch.setattr(dist, "all_gather_object", gather)
    return calls


@pytest.mark.parametrize("size", [2, 3])
def test_every_tp_ranks_object_is_gathered_over_the_schedulers_cpu_group(dist_calls, size):
    group = SimpleNamespace(size=size)
    got = sa.gather_over_tp(SimpleNamespace(tp_cpu_group=group), {"rank": "mine"})
    assert got == [(i, {"rank": "mine"}) for i in range(size)]
    assert dist_calls == [("size", group), ("gather", size, {"rank": "mine"}, group)]


def test_nothing_is_gathered_at_tp_one_or_without_a_group(dist_calls):
    assert sa.gather_over_tp(SimpleNamespace(tp_cpu_group=SimpleNamespace(size=1)), "x") is None
    assert sa.gather_over_tp(SimpleNamespace(), "x") is None
    assert sa.gather_over_tp(SimpleNamespace(tp_cpu_group=None), "x") is None
    assert [c[0] for c in dist_calls] == ["size"]
