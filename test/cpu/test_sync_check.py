"""CPU tier: the host-sync check of the verify step (``SGLANG_VERIFY_GRAPH_SYNC_CHECK``).
Failure mode guarded (on the GPU by ``test/gpu/test_runner_selftest.py``-style server
runs with the check on): a blocking device-to-host sync creeping into the verify step between
the verify forward and acceptance (e.g. an ``.item()`` in bookkeeping), which serialises the
overlap scheduler. Here: the counting logic with PyTorch's sync-debug API replaced by a fake that
emits the warning PyTorch emits; the mode is restored after every call, errors still propagate;
the env switch registers the hooks."""

import warnings

import pytest
import torch

from sglang_verify_graph import hooks
from sglang_verify_graph.compat import sglang_adapter
from sglang_verify_graph.debug import hooks as debug_hooks
from sglang_verify_graph.debug import sync_check
from sglang_verify_graph.config import ENV_SYNC_CHECK, read_env

MSG = "called a synchronizing CUDA operation"  # c10/cuda/CUDAFunctions.cpp warn_or_error_on_sync


@pytest.fixture
def fake_mode(monkeypatch):
    state = {"mode": 0, "seen": []}

    def set_mode(m):
        state["mode"] = m
        state["seen"].append(m)

    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: state["mode"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    return state


def test_counts_synchronizing_calls_and_restores_the_mode(fake_mode):
    check = sync_check.SyncCheck()

    def step(n):
        assert fake_mode["mode"] == "warn"
        for _ in range(n):
            warnings.warn(MSG)
        warnings.warn("an unrelated warning")
        return n

    assert check.run(step, 0) == 0
    assert check.snapshot() == {"calls": 1, "syncs": 0, "first": None, "kernel_calls": {}}
    assert check.run(step, 2) == 2
    snap = check.snapshot()
    assert snap["calls"] == 2 and snap["syncs"] == 2 and MSG in snap["first"]
    assert fake_mode["mode"] == 0 and fake_mode["seen"] == ["warn", 0, "warn", 0]


PROTOTYPE_NOTICE = ("Synchronization debug mode is a prototype feature and does not yet detect all "
                    "synchronizing operations (Triggered internally at "
                    "/pytorch/torch/csrc/cuda/Module.cpp:1003.)")  # torch 2.11, seen on the H200


def test_the_debug_modes_prototype_notice_is_not_a_sync(fake_mode):
    """Setting the debug mode makes PyTorch warn once that the mode is a prototype; on an
    H200 that notice was once counted as a sync (1 in 88 verify steps). Only PyTorch's
    synchronizing-call warning counts."""
    check = sync_check.SyncCheck()

    def step():
        warnings.warn(PROTOTYPE_NOTICE)
        warnings.warn("Warning: " + MSG + ".")  # the wording of a real sync, with its prefix
        return 0

    check.run(step)
    snap = check.snapshot()
    assert snap["syncs"] == 1 and MSG in snap["first"] and "prototype" not in snap["first"]
    assert not sync_check.is_sync_warning(PROTOTYPE_NOTICE)
    assert sync_check.is_sync_warning("CALLED A SYNCHRONIZING CUDA OPERATION")


def test_errors_propagate_and_are_counted(fake_mode):
    check = sync_check.SyncCheck()

    def boom():
        warnings.warn(MSG)
        raise ValueError("verify failed")

    with pytest.raises(ValueError):
        check.run(boom)
    assert check.snapshot()["syncs"] == 1 and fake_mode["mode"] == 0


def test_env_and_hook_list():
    assert read_env({ENV_SYNC_CHECK: "1"}).sync_check and not read_env({}).sync_check
    targets = [h.target for h in hooks.table(("sync_check",))]
    import importlib.util

    renorm = [sglang_adapter.TOP_P_RENORM, sglang_adapter.TOP_K_RENORM]
    assert targets == ([sglang_adapter.VERIFY] + (renorm if importlib.util.find_spec("sgl_kernel") else [])
                       + [sglang_adapter.GET_INTERNAL_STATE])


def test_kernel_calls_counted_only_inside_the_step(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: None)
    check = sync_check.SyncCheck()
    check.note("top_p_renorm_prob")  # outside a verify step: not counted
    check.run(lambda: (check.note("top_p_renorm_prob"), check.note("top_p_renorm_prob"),
                       check.note("top_k_renorm_prob")))
    check.note("top_k_renorm_prob")
    assert check.snapshot()["kernel_calls"] == {"top_p_renorm_prob": 2, "top_k_renorm_prob": 1}


def test_renorm_hooks_count_and_pass_through(monkeypatch):
    check = sync_check.SyncCheck()
    monkeypatch.setattr(sync_check, "_CHECK", check)
    seen = []
    check._inside = 1
    out = debug_hooks.top_p_renorm_hook(lambda p, t: seen.append((p, t)) or "probs", "P", "T")
    assert out == "probs" and seen == [("P", "T")]
    assert check.snapshot()["kernel_calls"] == {"top_p_renorm_prob": 1}


def test_internal_state_reports_the_check(monkeypatch):
    check = sync_check.get_sync_check()
    result = type("R", (), {"internal_state": {}})()
    debug_hooks.sync_check_state_hook(result)
    assert result.internal_state["verify_sync_check"] == check.snapshot()


_DRIVER = r"""
import json
from sglang_verify_graph import plugin
from sglang_verify_graph.compat import sglang_adapter as a
plugin.register()
from sglang_verify_graph import hooks
print("RESULT " + json.dumps([a._is_applied(h.target, h.body) for h in hooks.table(("sync_check",))]))
"""


@pytest.mark.parametrize("on", ["0", "1"])
def test_hooks_install_on_real_sglang_only_when_env_on(on):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_VERIFY_GRAPH_")
           and k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"}
    env[ENV_SYNC_CHECK] = on
    proc = subprocess.run([sys.executable, "-c", _DRIVER], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    applied = __import__("json").loads(line[len("RESULT "):])
    assert applied == ([True, True] if on == "1" else [False, False])
