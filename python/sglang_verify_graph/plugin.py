"""The top layer: the plugin's hooks beside their SGLang targets, and ``register()``, the entry
point of the ``sglang.srt.plugins`` group (``verify_cuda_graph``).

SGLang calls ``register()`` in every process that loads plugins (the HTTP main process before it
parses arguments, ``sglang.Engine``, every scheduler process). It installs the CLI hooks
everywhere and the runtime hooks where the flag is on (schedulers inherit
``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` from the launcher), applies them at once and checks that
each took effect. SGLang logs and swallows plugin exceptions, so a failed check when the flag is
requested ends the process with ``SystemExit`` and one clear line instead of silently serving
upstream's verify graph.

Hooks: the table of ``hooks.py`` (``python -m sglang_verify_graph.hooks`` prints it), each
declared next to its body: the CLI hooks in ``cli.py``, the runtime hooks here, the profile hooks
in ``profile_hooks.py``, the host-sync check's in ``debug/hooks.py``. The runtime hooks ask the
model runner's plan (``plan.verify_plan``, decided once per runner) and reach the runtime core
(torch, Triton, SGLang's model executor) only when called: ``register()`` also runs in the HTTP
main process, which loads plugins before it parses arguments and needs only the CLI hooks.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

from sglang_verify_graph import cli, hooks
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import ENV_ENABLE, ENV_PROFILE_EVERY, ENV_SYNC_CHECK, FLAG, read_env
from sglang_verify_graph.counters import get_counters
from sglang_verify_graph.errors import VerifyGraphConfigError
from sglang_verify_graph.hooks import hook

logger = logging.getLogger("sglang_verify_graph")
AROUND, AFTER = adapter.HookType.AROUND, adapter.HookType.AFTER


def _plan():
    """``plan`` (config, backends; light), imported at the first runtime hook call."""
    from sglang_verify_graph import plan

    return plan


def _runner_cls():
    """``VerifyCudaGraphRunner`` (the runtime core: torch, Triton, SGLang's model executor)."""
    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    return VerifyCudaGraphRunner


def _draft_extend():
    from sglang_verify_graph import draft_extend

    return draft_extend


# ---- runtime hooks --------------------------------------------------------------------------
def triton_factory(original: Callable) -> Callable:
    """SGLang's ``triton`` attention factory, wrapped: a model runner whose plan is the chain
    kernel (the EAGLE topk=1 target with the flag on) gets ``ChainVerifyTritonBackend``; every
    other model runner gets ``original(runner)``."""

    def create_triton_backend(runner):
        plan = _plan().verify_plan(runner)
        if plan.kind != "chain":
            return original(runner)
        from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

        return ChainVerifyTritonBackend(runner, plan.config)

    return create_triton_backend


@hook("runtime", None if adapter.RUNNER_CLS_HOOK else adapter.CAPTURE_DECODE_GRAPH, AROUND)
def capture_decode_graph_hook(original: Callable, *args, **kwargs):
    """Before 0.5.17, AROUND ``capture_decode_graph(model_runner=...)``: capture
    ``VerifyCudaGraphRunner(model_runner)`` for the EAGLE topk=1 target whose attention backend
    the verify graph serves (``plan.runner_kind``); otherwise upstream's."""
    model_runner = kwargs.get("model_runner", args[0] if args else None)
    plan = _plan()
    if plan.runner_kind(model_runner) is None:
        plan.refuse_if_flag_lost(model_runner)
        return original(*args, **kwargs)
    runner = _runner_cls()(model_runner)
    return adapter.decode_graph_capture(runner, runner.counters.graph_mem_gib)


@hook("runtime", adapter.DECODE_RUNNER_CLS if adapter.RUNNER_CLS_HOOK else None, AROUND)
def decode_runner_cls_hook(original: Callable, model_runner, *args, **kwargs):
    """0.5.17 on, AROUND ``ModelRunner._decode_cuda_graph_runner_cls(self)``: the EAGLE topk=1
    target whose attention backend the verify graph serves gets ``VerifyCudaGraphRunner`` (SGLang
    then builds it as ``cls(model_runner)``); otherwise upstream's."""
    cls = original(model_runner, *args, **kwargs)
    plan = _plan()
    if plan.runner_kind(model_runner) is not None:
        return _runner_cls()
    plan.refuse_if_flag_lost(model_runner)
    return cls


@hook("runtime", adapter.FORWARD_RAW, AROUND)
def forward_raw_hook(original: Callable, model_runner, forward_batch, *args, **kwargs):
    """AROUND ``ModelRunner._forward_raw(self, forward_batch, ...)``: a TARGET_VERIFY forward of
    a model runner that holds our runner, which did not replay our graph (eager, or another
    graph runner), is counted as a fallback under the reason our ``can_run_graph`` recorded; a
    DRAFT_EXTEND_V2 forward of a draft served by the chain draft-extend backend (graph replays
    go through ``EAGLEDraftExtendCudaGraphRunner.execute``, never here) as an eager draft extend."""
    mode = forward_batch.forward_mode
    if mode.is_draft_extend_v2():
        _draft_extend().count_eager_draft_extend(model_runner)
        return original(model_runner, forward_batch, *args, **kwargs)
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    counters = getattr(runner, "counters", None)
    if counters is None or not mode.is_target_verify():
        return original(model_runner, forward_batch, *args, **kwargs)
    replays = counters.replays
    out = original(model_runner, forward_batch, *args, **kwargs)
    if counters.replays == replays:
        counters.count_eager_verify(forward_batch.batch_size)
    return out


@hook("runtime", adapter.VERIFY, AROUND)
def verify_step_hook(original: Callable, worker, batch, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.verify(self, batch, ...)``: SGLang's own count of verify steps and
    their requests (``batch.batch_size()``), taken before the model runner decides how to run
    the forward; the counters check the replays and fallbacks against it."""
    counters = get_counters()
    if counters is not None:
        counters.count_verify_step(batch.batch_size())
    return original(worker, batch, *args, **kwargs)


@hook("runtime", adapter.CREATE_DRAFT_EXTEND_BACKEND, AROUND)
def draft_extend_backend_hook(original: Callable, factory, *args, **kwargs):
    """AROUND ``DraftBackendFactory.create_draft_extend_backend(self)``: with the flag on, the
    draft's triton draft-extend backend becomes ``ChainDraftExtendTritonBackend``
    (``draft_extend.draft_extend_backend_for``); any other backend is returned unchanged."""
    backend = original(factory, *args, **kwargs)
    return _draft_extend().draft_extend_backend_for(factory.draft_model_runner, backend)


@hook("runtime", adapter.DRAFT_EXTEND_EXECUTE, AROUND)
def draft_extend_execute_hook(original: Callable, runner, forward_batch, *args, **kwargs):
    """AROUND ``EAGLEDraftExtendCudaGraphRunner.execute(self, forward_batch, ...)``: a replay of a
    draft-extend graph served by the chain kernel is counted (``raw_bs`` padded to ``bs``) and
    passed to the runner's probe (the self-test when it is on)."""
    return _draft_extend().execute_draft_extend(original, runner, forward_batch, *args, **kwargs)


@hook("runtime", adapter.BUILD_VERIFY_INPUT, AROUND)
def build_verify_input_hook(original: Callable, *args, **kwargs):
    """AROUND ``build_eagle_verify_input``: a topk=1 chain verified by the chain kernel needs no
    tree mask, so ask for SGLang's smallest mask mode (QLEN_ONLY: bs * ndt^2 bools) instead of
    FULL_MASK (ndt * (seq_len + ndt) bools per request, memset every step)."""
    target = kwargs.get("target_worker")
    if (target is not None and kwargs.get("topk") == 1
            and _plan().runner_kind(target.model_runner) == "chain"):
        kwargs["tree_mask_mode"] = adapter.qlen_only_tree_mask_mode()
    return original(*args, **kwargs)


@hook("runtime", adapter.GET_INTERNAL_STATE, AFTER)
def internal_state_hook(result, *args, **kwargs):
    """AFTER ``Scheduler.get_internal_state(self, req)``: add this rank's counters to the returned
    ``internal_state`` dict as ``verify_cuda_graph`` and, under tensor parallelism, every TP rank's
    as ``verify_cuda_graph_tp_ranks`` (list indexed by TP rank, ``None`` for a rank without
    counters). ``/get_server_info`` serves TP rank 0's dict only; every rank runs this hook for the
    same request, so the gather (a collective) runs on each before anything else can return."""
    state = getattr(result, "internal_state", result)
    counters = get_counters()
    snapshot = counters.snapshot() if counters is not None else None
    ranks = adapter.gather_over_tp(args[0], snapshot) if args else None
    if isinstance(state, dict) and snapshot is not None:
        state["verify_cuda_graph"] = snapshot
    if isinstance(state, dict) and ranks is not None and any(r is not None for r in ranks):
        state["verify_cuda_graph_tp_ranks"] = ranks
    return result


def install(runtime: bool, profile: bool = False, sync_check: bool = False) -> list[str]:
    """Install the CLI hooks (and the runtime ones when ``runtime``, the profile ones when
    ``profile``, the host-sync check when ``sync_check``) and return the targets that did NOT
    take effect (empty when all is well)."""
    groups = ("cli",) + ("runtime",) * runtime + ("profile",) * profile + ("sync_check",) * sync_check
    missing = adapter.install_hooks(h.triple() for h in hooks.table(groups))
    if runtime:
        try:
            adapter.install_attention_factory("triton", triton_factory)
        except Exception as e:
            missing.append(f"attention_registry['triton'] ({type(e).__name__}: {e})")
    return missing


def unsupported_release_line(request: str) -> str:
    """The one line a request for the plugin (``request``: the flag or variable that asked for
    it) gets on an SGLang release outside ``sglang_adapter.SUPPORTED_RANGE``."""
    lo, hi = adapter.SUPPORTED_RANGE
    return (f"error: {FLAG}: sglang {adapter.SGLANG_VERSION} is not supported by this plugin "
            f"(supported: sglang {lo} to {hi}). Fix: install '{adapter.REQUIREMENT}', or remove "
            f"{request}.")


def _request(env) -> str:
    """What in this process asks for the plugin: the flag or the profile flag on the command
    line (spelled out, ``=value`` or abbreviated), else the first feature variable of ``env``
    (an ``EnvSettings``; ``None``, a malformed variable, asks for nothing); ``""`` when nothing
    does."""
    if cli.cli_gives_flag(sys.argv[1:]):
        return FLAG
    if cli.gives_option(sys.argv[1:], cli.PROFILE_FLAG, cli.MIN_PROFILE_FLAG_PREFIX):
        return cli.PROFILE_FLAG
    if env is None:
        return ""
    for on, name in ((env.enable, ENV_ENABLE), (env.profile_every > 0, ENV_PROFILE_EVERY),
                     (env.sync_check, ENV_SYNC_CHECK)):
        if on:
            return name
    return ""


def register() -> None:
    """Install and verify the plugin's hooks (the per-phase profile hooks where
    ``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0). Raises SystemExit(1) when the flag or the profile
    is requested (command line or environment) but a hook did not take effect, or the installed
    SGLang is outside ``sglang_adapter.SUPPORTED_RANGE`` (one line, :func:`unsupported_release_line`);
    outside the range, a process that does not ask for the plugin (:func:`_request`) gets nothing
    from it: no hook, no output. A malformed ``SGLANG_VERIFY_GRAPH_*`` variable installs the CLI hooks only, so that
    the server-args validation reports it (one line and exit 2 on the command line,
    ``VerifyGraphConfigError`` from ``sglang.Engine``)."""
    if not adapter.IN_RANGE:
        try:
            env = read_env()
        except VerifyGraphConfigError:
            env = None
        request = _request(env)
        if request:
            print(unsupported_release_line(request), file=sys.stderr)
            raise SystemExit(1)
        return
    try:
        env = read_env()
    except VerifyGraphConfigError as e:  # a malformed SGLANG_VERIFY_GRAPH_* variable
        # The validation point reads the environment again and raises the same error, which
        # the command line turns into one line and exit 2 and sglang.Engine(...) raises as
        # VerifyGraphConfigError (a SystemExit here would end the user's program).
        logger.error("sglang_verify_graph: %s", e)
        if install(runtime=False):
            print(f"error: {e}", file=sys.stderr)  # stderr is line-buffered
            raise SystemExit(2) from None
        return
    profile = env.profile_every > 0
    missing = install(runtime=env.enable, profile=profile, sync_check=env.sync_check)
    if not missing:
        logger.info("sglang_verify_graph: hooks installed (runtime=%s, profile=%s, sync_check=%s)",
                    env.enable, profile, env.sync_check)
        return
    lo, hi = adapter.SUPPORTED_RANGE
    msg = (f"error: {FLAG}: the plugin could not hook into this SGLang version "
           f"(sglang {adapter.SGLANG_VERSION}; supported: {lo} to {hi}); "
           f"not applied: {'; '.join(missing)}")
    if _request(env):
        print(msg, file=sys.stderr)
        raise SystemExit(1)
    logger.error(msg)
