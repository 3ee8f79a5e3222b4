"""plugin.py in-process: which hooks ``install`` registers for each setting (and with which kind),
what ``register`` does when a hook does not take effect (exit 1 with one line when the flag, the
profile or the sync check is requested; a logged error otherwise; exit 2 for a malformed variable
when even the CLI hooks fail), and what each runtime hook body does with its arguments.
SGLang's registry and the runtime core (``plan``, ``runner``, ``draft_extend``) are replaced by
recorders, so nothing is
patched in this process; the real registry is exercised in fresh interpreters by
test_hook_installation.py, test_sglang_versions.py and test_real_server_args.py."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

import inspect

from sglang_verify_graph import cli, hooks, plugin, profile_hooks
from sglang_verify_graph.debug import hooks as debug_hooks
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import FLAG, EnvSettings, VerifyGraphConfigError

AFTER, AROUND, BEFORE = adapter.HookType.AFTER, adapter.HookType.AROUND, adapter.HookType.BEFORE


@pytest.fixture
def registry(monkeypatch):
    """Records what ``install`` hands SGLang: ``calls`` (each hook list), ``factories`` (each
    attention-factory wrap) and answers ``missing`` (targets that did not take effect)."""
    rec = SimpleNamespace(calls=[], factories=[], missing=[], factory_error=None)

    def install_hooks(hooks):
        rec.calls.append(list(hooks))
        return list(rec.missing)

    def install_attention_factory(name, wrap):
        if rec.factory_error:
            raise rec.factory_error
        rec.factories.append((name, wrap))

    monkeypatch.setattr(adapter, "install_hooks", install_hooks)
    monkeypatch.setattr(adapter, "install_attention_factory", install_attention_factory)
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "m"])
    return rec


def _cli_table():
    return [(adapter.ADD_CLI_ARGS, cli.add_cli_args_hook, AFTER),
            (adapter.FROM_CLI_ARGS, cli.from_cli_args_hook, AROUND),
            (adapter.VALIDATION_POINT, cli.check_given_hook, BEFORE),
            (adapter.VALIDATION_POINT, cli.validate_hook, AFTER),
            (adapter.CONFIG_MERGER, cli.merge_config_hook, AROUND)]


def _runtime_table():
    graph = ((adapter.DECODE_RUNNER_CLS, plugin.decode_runner_cls_hook, AROUND) if adapter.RUNNER_CLS_HOOK
             else (adapter.CAPTURE_DECODE_GRAPH, plugin.capture_decode_graph_hook, AROUND))
    return [graph,
            (adapter.FORWARD_RAW, plugin.forward_raw_hook, AROUND),
            (adapter.VERIFY, plugin.verify_step_hook, AROUND),
            (adapter.CREATE_DRAFT_EXTEND_BACKEND, plugin.draft_extend_backend_hook, AROUND),
            (adapter.DRAFT_EXTEND_EXECUTE, plugin.draft_extend_execute_hook, AROUND),
            (adapter.BUILD_VERIFY_INPUT, plugin.build_verify_input_hook, AROUND),
            (adapter.GET_INTERNAL_STATE, plugin.internal_state_hook, AFTER)]


_PROFILE = [(adapter.CYCLE, profile_hooks.profile_cycle_hook, AROUND),
            (adapter.DRAFT, profile_hooks.profile_draft_hook, AROUND),
            (adapter.VERIFY, profile_hooks.profile_verify_hook, AROUND),
            (adapter.DRAFT_EXTEND, profile_hooks.profile_draft_extend_hook, AROUND)]


def _sync_check_table():
    renorm = [(adapter.TOP_P_RENORM, debug_hooks.top_p_renorm_hook, AROUND),
              (adapter.TOP_K_RENORM, debug_hooks.top_k_renorm_hook, AROUND)]
    return ([(adapter.VERIFY, debug_hooks.sync_check_hook, AROUND)]
            + (renorm if adapter.sgl_kernel_installed() else [])
            + [(adapter.GET_INTERNAL_STATE, debug_hooks.sync_check_state_hook, AFTER)])


def _triples(*groups):
    return [h.triple() for h in hooks.table(groups)]


def test_the_declared_tables_are_the_expected_ones():
    """The declarations (``@hook`` next to each body) give this SGLang release's targets: the
    graph hook and the validation point follow its API."""
    assert _triples("cli") == _cli_table()
    assert _triples("runtime") == _runtime_table()
    assert _triples("profile") == _PROFILE
    assert _triples("sync_check") == _sync_check_table()


def test_every_declared_body_takes_what_its_kind_passes():
    """An AFTER body takes ``(result, *args)``, an AROUND body ``(original, *args)``, a BEFORE
    body the target's own arguments (never a ``result`` or ``original`` first)."""
    for h in hooks.table():
        first = next(iter(inspect.signature(h.body).parameters))
        want = {AFTER: "result", AROUND: "original"}.get(h.kind)
        if want:
            assert first == want, f"{h.body.__name__} is declared {h.kind.name} but takes {first!r} first"
        else:
            assert first not in ("result", "original"), h.body.__name__


def test_a_hook_of_an_unknown_group_is_refused():
    with pytest.raises(ValueError, match="hook group 'runtim'"):
        hooks.hook("runtim", "a.b", AROUND)


def test_the_table_prints_one_line_per_hook():
    lines = hooks.describe().splitlines()
    assert len(lines) == len(hooks.table())
    assert any(line.startswith("runtime ") and "plugin.forward_raw_hook" in line for line in lines)


def test_install_cli_only_registers_the_cli_hooks_and_no_factory(registry):
    assert plugin.install(runtime=False) == []
    assert registry.calls == [_cli_table()] and registry.factories == []


def test_install_runtime_adds_the_runtime_hooks_and_the_triton_factory(registry):
    assert plugin.install(runtime=True) == []
    assert registry.calls == [_cli_table() + _runtime_table()]
    assert registry.factories == [("triton", plugin.triton_factory)]


def test_install_profile_and_sync_check_add_their_tables_in_order(registry):
    plugin.install(runtime=True, profile=True, sync_check=True)
    assert registry.calls[-1] == _cli_table() + _runtime_table() + _PROFILE + _sync_check_table()
    plugin.install(runtime=False, sync_check=True)
    assert registry.calls[-1] == _cli_table() + _sync_check_table()


def test_install_reports_missing_targets_and_a_failed_factory(registry):
    registry.missing = ["a.b.c"]
    registry.factory_error = RuntimeError("no registry")
    assert plugin.install(runtime=True) == ["a.b.c", "attention_registry['triton'] (RuntimeError: no registry)"]
    assert plugin.install(runtime=False) == ["a.b.c"]  # the factory is runtime-only


def _env(monkeypatch, **fields):
    monkeypatch.setattr(plugin, "read_env", lambda: EnvSettings(**fields))


@pytest.mark.parametrize("profile_every", [1, 5])
def test_register_installs_what_the_environment_asks_and_logs_it(registry, monkeypatch, caplog, profile_every):
    _env(monkeypatch, enable=True, profile_every=profile_every)
    with caplog.at_level(logging.INFO, logger="sglang_verify_graph"):
        plugin.register()
    assert registry.calls == [_cli_table() + _runtime_table() + _PROFILE]
    assert caplog.messages == ["sglang_verify_graph: hooks installed (runtime=True, profile=True, sync_check=False)"]
    registry.calls.clear()
    _env(monkeypatch, sync_check=True)
    plugin.register()
    assert registry.calls == [_cli_table() + _sync_check_table()] and len(registry.factories) == 1


@pytest.mark.parametrize("fields", [dict(enable=True), dict(profile_every=1), dict(sync_check=True), {}],
                         ids=["flag", "profile", "sync_check", "flag_on_argv"])
def test_register_exits_1_with_one_line_when_a_requested_hook_failed(registry, monkeypatch, capsys, fields):
    _env(monkeypatch, **fields)
    if not fields:
        monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "m", FLAG])
    registry.missing = ["x.y.z", "u.v.w"]
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err == (f"error: {FLAG}: the plugin could not hook into this SGLang version (sglang "
                   f"{adapter.SGLANG_VERSION}; supported: 0.5.16 to 0.5.23); "
                   "not applied: x.y.z; u.v.w\n")


@pytest.mark.parametrize("fields,argv,asked_by", [
    (dict(enable=True), [], "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"),
    (dict(profile_every=1), [], "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"),
    (dict(sync_check=True), [], "SGLANG_VERIFY_GRAPH_SYNC_CHECK"),
    ({}, [FLAG], FLAG),
    ({}, ["--enable-verify-cuda"], FLAG),
    ({}, ["--verify-graph-profile-every", "5"], "--verify-graph-profile-every"),
    ({}, ["--verify-graph-profile-every=5"], "--verify-graph-profile-every"),
    ({}, ["--verify-graph"], "--verify-graph-profile-every"),
], ids=["flag_env", "profile_env", "sync_check_env", "flag", "flag_abbreviated", "profile",
        "profile_equals", "profile_abbreviated"])
def test_outside_the_range_a_request_gets_one_line(registry, monkeypatch, capsys, fields, argv, asked_by):
    _env(monkeypatch, **fields)
    monkeypatch.setattr(sys, "argv", ["launch_server", *argv, "--model-path", "m"])  # read from argv[1] on
    monkeypatch.setattr(adapter, "IN_RANGE", False)
    monkeypatch.setattr(adapter, "SGLANG_VERSION", "0.5.24")
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert info.value.code == 1
    assert capsys.readouterr().err == (
        f"error: {FLAG}: sglang 0.5.24 is not supported by this plugin (supported: sglang 0.5.16 to "
        f"0.5.23). Fix: install 'sglang>=0.5.16,<0.5.24', or remove {asked_by}.\n")
    assert registry.calls == [] and registry.factories == []


@pytest.mark.parametrize("argv", [[], ["--enable-"], ["--enable-metrics"], ["--verify-"]],
                         ids=["none", "ambiguous_prefix", "other_flag", "short_prefix"])
def test_outside_the_range_an_other_launch_gets_nothing(registry, monkeypatch, capsys, argv):
    """Other options, and prefixes too short for argparse to mean the plugin's flags, ask for
    nothing; nor does a malformed variable of the plugin."""
    def bad_env():
        raise VerifyGraphConfigError("must be an integer", "SGLANG_VERIFY_GRAPH_LOG_EVERY", "x", "set it to 0")

    monkeypatch.setattr(plugin, "read_env", bad_env)
    monkeypatch.setattr(sys, "argv", ["launch_server", "--model-path", "m", *argv])
    monkeypatch.setattr(adapter, "IN_RANGE", False)
    plugin.register()
    assert registry.calls == [] and capsys.readouterr() == ("", "")


def test_outside_the_range_nothing_is_installed_or_printed_without_a_request(registry, monkeypatch, capsys,
                                                                          caplog):
    _env(monkeypatch)
    monkeypatch.setattr(adapter, "IN_RANGE", False)
    with caplog.at_level(logging.DEBUG, logger="sglang_verify_graph"):
        plugin.register()
    assert registry.calls == [] and registry.factories == []
    assert capsys.readouterr() == ("", "") and caplog.records == []


def test_register_only_logs_a_failed_hook_when_nothing_is_requested(registry, monkeypatch, capsys, caplog):
    _env(monkeypatch)
    registry.missing = ["x.y.z"]
    with caplog.at_level(logging.ERROR, logger="sglang_verify_graph"):
        plugin.register()  # no SystemExit: an unrelated server keeps running
    assert capsys.readouterr().err == ""
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "could not hook into this SGLang version" in caplog.text and "not applied: x.y.z" in caplog.text


def test_register_with_a_malformed_variable_installs_the_cli_hooks_only(registry, monkeypatch, capsys, caplog):
    def bad_env():
        raise VerifyGraphConfigError("must be an integer", "SGLANG_VERIFY_GRAPH_LOG_EVERY", "x", "set it to 0")

    monkeypatch.setattr(plugin, "read_env", bad_env)
    with caplog.at_level(logging.ERROR, logger="sglang_verify_graph"):
        plugin.register()  # the validation point reports the variable later
    assert registry.calls == [_cli_table()] and registry.factories == []
    assert caplog.messages == [f"sglang_verify_graph: {FLAG}: must be an integer (SGLANG_VERIFY_GRAPH_LOG_EVERY = x). "
                               "Fix: set it to 0."]
    assert capsys.readouterr().err == ""
    registry.missing = ["x.y.z"]
    with pytest.raises(SystemExit) as info:
        plugin.register()
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {FLAG}: must be an integer") and err.count("\n") == 1


class FakeCapture:
    """The runtime core as the hooks see it: answers set per test, calls recorded."""

    def __init__(self, **answers):
        self.calls = []
        self.answers = answers

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            answer = self.answers.get(name)
            return answer(*args, **kwargs) if callable(answer) else answer
        return call


@pytest.fixture
def core(monkeypatch):
    """``core(**answers)``: one recorder standing in for the runtime core the hooks reach lazily
    (``plan``, the runner class, ``draft_extend``)."""
    def make(**answers):
        fake = FakeCapture(**answers)
        monkeypatch.setattr(plugin, "_plan", lambda: fake)
        monkeypatch.setattr(plugin, "_draft_extend", lambda: fake)
        monkeypatch.setattr(plugin, "_runner_cls", lambda: fake.answers.get("runner_cls", "OursCls"))
        return fake
    return make


@pytest.mark.parametrize("kind", ["chain", "native", "upstream"])
def test_triton_factory_gives_the_chain_backend_to_a_chain_plan_only(core, monkeypatch, kind):
    from sglang_verify_graph import chain_backend

    fake = core(verify_plan=lambda runner: SimpleNamespace(kind=kind, config="CFG"))
    monkeypatch.setattr(chain_backend, "ChainVerifyTritonBackend", lambda runner, c: ("chain", runner, c))
    made = plugin.triton_factory(lambda runner: ("upstream", runner))("MR")
    assert made == (("chain", "MR", "CFG") if kind == "chain" else ("upstream", "MR"))
    assert fake.calls == [("verify_plan", ("MR",), {})]


@pytest.mark.parametrize("how", ["kwarg", "positional"])
def test_capture_decode_graph_hook_captures_ours_or_refuses_a_lost_flag(core, monkeypatch, how):
    monkeypatch.setattr(adapter, "decode_graph_capture", lambda runner, mem: ("captured", runner, mem))
    call = (lambda hook, orig: hook(orig, model_runner="MR")) if how == "kwarg" else (
        lambda hook, orig: hook(orig, "MR"))
    ours = lambda mr: SimpleNamespace(mr=mr, counters=SimpleNamespace(graph_mem_gib=1.5))  # noqa: E731
    fake = core(runner_kind="chain", runner_cls=ours)
    got = call(plugin.capture_decode_graph_hook, lambda *a, **k: "upstream")
    assert got[0] == "captured" and got[1].mr == "MR" and got[2] == 1.5
    assert fake.calls == [("runner_kind", ("MR",), {})]
    fake = core(runner_kind=None)
    assert call(plugin.capture_decode_graph_hook, lambda *a, **k: ("upstream", a, k)) == (
        ("upstream", (), {"model_runner": "MR"}) if how == "kwarg" else ("upstream", ("MR",), {}))
    assert [c[0] for c in fake.calls] == ["runner_kind", "refuse_if_flag_lost"]
    assert fake.calls[1][1] == ("MR",)


@pytest.mark.parametrize("kind, ours", [("chain", True), ("native", True), (None, False)])
def test_decode_runner_cls_hook_gives_our_class_to_the_served_target_only(core, kind, ours):
    fake = core(runner_kind=lambda mr: kind if mr == "MR" else None)
    got = plugin.decode_runner_cls_hook(lambda mr, *a, **k: ("UpstreamCls", mr, a, k), "MR", 7, x=1)
    assert got == ("OursCls" if ours else ("UpstreamCls", "MR", (7,), {"x": 1}))
    assert (("refuse_if_flag_lost", ("MR",), {}) in fake.calls) is (not ours)


def test_an_eager_draft_extend_is_counted_and_runs(core):
    fake = core()
    mode = SimpleNamespace(is_draft_extend_v2=lambda: True, is_target_verify=lambda: False)
    fb = SimpleNamespace(forward_mode=mode)
    out = plugin.forward_raw_hook(lambda mr, b, *a, **k: ("ran", mr, b, a, k), "MR", fb, 1, y=2)
    assert out == ("ran", "MR", fb, (1,), {"y": 2})
    assert fake.calls == [("count_eager_draft_extend", ("MR",), {})]


def test_forward_raw_hook_passes_arguments_through_for_a_counted_verify():
    from sglang_verify_graph.counters import VerifyCounters

    counters = VerifyCounters()
    mr = SimpleNamespace(decode_cuda_graph_runner=SimpleNamespace(counters=counters))
    fb = SimpleNamespace(batch_size=2, forward_mode=SimpleNamespace(is_draft_extend_v2=lambda: False,
                                                                    is_target_verify=lambda: True))
    assert plugin.forward_raw_hook(lambda m, b, *a, **k: (m, b, a, k), mr, fb, 3, z=4) == (mr, fb, (3,), {"z": 4})
    assert counters.fallback_total == 1 and counters.eager_requests == 2


@pytest.mark.parametrize("topk, chain, asks_qlen_only", [(1, True, True), (2, True, False), (1, False, False)])
def test_build_verify_input_hook_asks_for_the_smallest_mask_for_a_chain_target(core, monkeypatch, topk, chain,
                                                                              asks_qlen_only):
    monkeypatch.setattr(adapter, "qlen_only_tree_mask_mode", lambda: "QLEN_ONLY")
    core(runner_kind=lambda mr: "chain" if chain and mr == "MR" else None)
    target = SimpleNamespace(model_runner="MR")
    got = plugin.build_verify_input_hook(lambda *a, **k: (a, k), "x", target_worker=target, topk=topk,
                                         tree_mask_mode="FULL_MASK")
    assert got == (("x",), {"target_worker": target, "topk": topk,
                            "tree_mask_mode": "QLEN_ONLY" if asks_qlen_only else "FULL_MASK"})
    assert plugin.build_verify_input_hook(lambda *a, **k: k, topk=1, tree_mask_mode="FULL_MASK") == {
        "topk": 1, "tree_mask_mode": "FULL_MASK"}  # no target worker given: unchanged


def test_internal_state_hook_adds_the_counters(monkeypatch):
    monkeypatch.setattr(plugin, "get_counters", lambda: SimpleNamespace(snapshot=lambda: {"replays": 3}))
    result = SimpleNamespace(internal_state={"other": 1})
    assert plugin.internal_state_hook(result, "scheduler") is result
    assert result.internal_state == {"other": 1, "verify_cuda_graph": {"replays": 3}}
    plain = {}
    assert plugin.internal_state_hook(plain) is plain and set(plain) == {"verify_cuda_graph"}
    monkeypatch.setattr(plugin, "get_counters", lambda: None)
    plain = {}
    plugin.internal_state_hook(plain)
    assert plain == {}
    assert plugin.internal_state_hook("not a dict") == "not a dict"


def test_sync_check_and_renorm_hooks_go_through_the_sync_check(monkeypatch):
    seen = []
    check = SimpleNamespace(run=lambda fn, *a, **k: ("run", fn(*a, **k)), note=seen.append,
                            snapshot=lambda: {"syncs": 0})
    monkeypatch.setattr(debug_hooks, "get_sync_check", lambda: check)
    monkeypatch.setattr(debug_hooks, "peek_sync_check", lambda: check)
    assert debug_hooks.sync_check_hook(lambda *a, **k: (a, k), 1, b=2) == ("run", ((1,), {"b": 2}))
    assert debug_hooks.top_p_renorm_hook(lambda *a, **k: (a, k), 3, p=0.9) == ((3,), {"p": 0.9})
    assert debug_hooks.top_k_renorm_hook(lambda *a, **k: (a, k), 4, k=2) == ((4,), {"k": 2})
    assert seen == ["top_p_renorm_prob", "top_k_renorm_prob"]
    state = {"other": 1}
    assert debug_hooks.sync_check_state_hook(state) is state and state == {"other": 1, "verify_sync_check": {"syncs": 0}}


def test_draft_extend_hooks_delegate_to_the_runtime_core(core):
    fake = core(draft_extend_backend_for=lambda runner, backend: ("chain", runner, backend),
                execute_draft_extend=lambda execute, runner, fb, *a, **k: ("replayed", execute(runner, fb, *a, **k)))
    factory = SimpleNamespace(draft_model_runner="DRAFT")
    assert plugin.draft_extend_backend_hook(lambda f, *a, **k: ("triton", f, a, k), factory, 1, v=5) == (
        "chain", "DRAFT", ("triton", factory, (1,), {"v": 5}))
    assert plugin.draft_extend_execute_hook(lambda r, fb, *a, **k: (r, fb, a, k), "RUNNER", "FB", 2, w=3) == (
        "replayed", ("RUNNER", "FB", (2,), {"w": 3}))
    assert [c[0] for c in fake.calls] == ["draft_extend_backend_for", "execute_draft_extend"]


def test_verify_step_hook_counts_then_passes_every_argument(monkeypatch):
    from sglang_verify_graph.counters import VerifyCounters

    counters = VerifyCounters()
    monkeypatch.setattr(plugin, "get_counters", lambda: counters)
    batch = SimpleNamespace(batch_size=lambda: 3)
    assert plugin.verify_step_hook(lambda w, b, *a, **k: (w, b, a, k), "WORKER", batch, 1, m=2) == (
        "WORKER", batch, (1,), {"m": 2})
    assert (counters.verify_steps, counters.verify_requests) == (1, 3)


@pytest.mark.parametrize("verify", [True, False])
def test_forward_raw_hook_passes_other_forwards_through_untouched(verify):
    """A model runner without our runner (the draft, or no attribute at all), or a forward that
    is not a verify: run as given, nothing counted."""
    fb = SimpleNamespace(batch_size=2, forward_mode=SimpleNamespace(is_draft_extend_v2=lambda: False,
                                                                    is_target_verify=lambda: verify))
    for mr in (SimpleNamespace(), SimpleNamespace(decode_cuda_graph_runner=SimpleNamespace())):
        assert plugin.forward_raw_hook(lambda m, b, *a, **k: (m, b, a, k), mr, fb, 5, q=6) == (mr, fb, (5,), {"q": 6})
    from sglang_verify_graph.counters import VerifyCounters

    counters = VerifyCounters()
    ours = SimpleNamespace(decode_cuda_graph_runner=SimpleNamespace(counters=counters))
    assert plugin.forward_raw_hook(lambda m, b, *a, **k: (m, b, a, k), ours, fb, 5, q=6) == (ours, fb, (5,), {"q": 6})
    assert counters.fallback_total == (1 if verify else 0)
