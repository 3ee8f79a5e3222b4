"""The top layer: the plugin's hooks beside their SGLang targets, and ``register()``, the entry
point of the ``sglang.srt.plugins`` group (``verify_cuda_graph``).

SGLang calls ``register()`` in every process that loads plugins (the HTTP main process before it
parses arguments, ``sglang.Engine``, every scheduler process). It installs the CLI hooks
everywhere and the runtime hooks where the flag is on (schedulers inherit
``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` from the launcher), applies them at once and checks that
each took effect. SGLang logs and swallows plugin exceptions, so a failed check when the flag is
requested ends the process with ``SystemExit`` and one clear line instead of silently serving
upstream's verify graph.

Hooks (``HookRegistry`` kinds: AFTER ``hook(result, *args, **kwargs)``, AROUND
``hook(original, *args, **kwargs)``), targets in ``sglang_adapter``:

* CLI (every process), bodies in ``cli.py``: ``ServerArgs.add_cli_args`` AFTER (the flags),
  ``ServerArgs.from_cli_args`` AROUND (records them, one-line errors), the validation point
  (``ServerArgs.__post_init__`` before 0.5.19, ``ServerArgs.resolve_once`` from 0.5.19; BEFORE: the given
  values, so the one line comes first on a machine without a GPU; AFTER: the resolved ones) and
  ``ConfigArgumentMerger.merge_config_with_args`` AROUND (``--config`` YAML conflicts).
* Runtime (where the flag is on), bodies here: SGLang's ``triton`` attention factory (the EAGLE
  topk=1 target gets ``ChainVerifyTritonBackend``); ``capture_decode_graph`` (before 0.5.17) /
  ``ModelRunner._decode_cuda_graph_runner_cls`` (0.5.17 on) AROUND (the target gets
  ``VerifyCudaGraphRunner``); ``ModelRunner._forward_raw`` AROUND (counts each verify that did
  not replay our graph, and eager draft extends); ``EAGLEWorkerV2.verify`` AROUND (SGLang's own
  count of verify steps, the counters' cross-check); ``DraftBackendFactory.create_draft_extend_backend``
  AROUND (the draft gets ``ChainDraftExtendTritonBackend``); ``EAGLEDraftExtendCudaGraphRunner.execute``
  AROUND (counts draft-extend replays; the self-test's probe); ``build_eagle_verify_input`` AROUND
  (QLEN_ONLY tree mask);
  ``Scheduler.get_internal_state`` AFTER (counters for ``/get_server_info``).
* Profile (``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0, with or without the flag), bodies in
  ``profile_hooks.py``; host-sync check (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``), bodies here.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

from sglang_verify_graph import cli, profile_hooks
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import ENV_ENABLE, ENV_PROFILE_EVERY, ENV_SYNC_CHECK, FLAG, read_env
from sglang_verify_graph.counters import get_counters
from sglang_verify_graph.errors import VerifyGraphConfigError
from sglang_verify_graph.debug.sync_check import get_sync_check, peek_sync_check

logger = logging.getLogger("sglang_verify_graph")

Hook = tuple[str, Callable, adapter.HookType]


def _capture():
    """The runtime core (``capture`` and below: torch, Triton, SGLang's model executor), imported
    at the first runtime hook call rather than here: ``register()`` also runs in the HTTP main
    process, which loads plugins before it parses arguments and needs only the CLI hooks."""
    from sglang_verify_graph import capture

    return capture


# ---- runtime hooks --------------------------------------------------------------------------
def triton_factory(original: Callable) -> Callable:
    """SGLang's ``triton`` attention factory, wrapped: the EAGLE topk=1 target with the flag on
    gets ``ChainVerifyTritonBackend``; every other model runner gets ``original(runner)``."""

    def create_triton_backend(runner):
        capture = _capture()
        cfg = capture.config_for(runner) if adapter.is_eagle_topk1_target(runner) else None
        return original(runner) if cfg is None else capture.ChainVerifyTritonBackend(runner, cfg)

    return create_triton_backend


def capture_decode_graph_hook(original: Callable, *args, **kwargs):
    """Before 0.5.17, AROUND ``capture_decode_graph(model_runner=...)``: capture VerifyCudaGraphRunner
    for the EAGLE topk=1 target whose attention backend the verify graph serves
    (``capture.verify_runner_kind``); otherwise upstream's."""
    model_runner = kwargs.get("model_runner", args[0] if args else None)
    capture = _capture()
    if capture.verify_runner_kind(model_runner) is None:
        capture.refuse_if_flag_lost(model_runner)
        return original(*args, **kwargs)
    runner, mem = capture.capture_verify_runner(model_runner)
    return adapter.decode_graph_capture(runner, mem)


def decode_runner_cls_hook(original: Callable, model_runner, *args, **kwargs):
    """0.5.17 on, AROUND ``ModelRunner._decode_cuda_graph_runner_cls(self)``: the EAGLE topk=1
    target whose attention backend the verify graph serves gets our runner class; otherwise
    upstream's."""
    cls = original(model_runner, *args, **kwargs)
    capture = _capture()
    if capture.verify_runner_kind(model_runner) is not None and adapter.is_eagle_topk1_target(model_runner):
        return capture.VerifyCudaGraphRunnerFromModelRunner
    capture.refuse_if_flag_lost(model_runner)
    return cls


def forward_raw_hook(original: Callable, model_runner, forward_batch, *args, **kwargs):
    """AROUND ``ModelRunner._forward_raw(self, forward_batch, ...)``: a TARGET_VERIFY forward of
    a model runner that holds our runner, which did not replay our graph (eager, or another
    graph runner), is counted as a fallback under the reason our ``can_run_graph`` recorded; a
    DRAFT_EXTEND_V2 forward of a draft served by the chain draft-extend backend (graph replays
    go through ``EAGLEDraftExtendCudaGraphRunner.execute``, never here) as an eager draft extend."""
    mode = forward_batch.forward_mode
    if mode.is_draft_extend_v2():
        _capture().count_eager_draft_extend(model_runner)
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


def verify_step_hook(original: Callable, worker, batch, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.verify(self, batch, ...)``: SGLang's own count of verify steps and
    their requests (``batch.batch_size()``), taken before the model runner decides how to run
    the forward; the counters check the replays and fallbacks against it."""
    counters = get_counters()
    if counters is not None:
        counters.count_verify_step(batch.batch_size())
    return original(worker, batch, *args, **kwargs)


def draft_extend_backend_hook(original: Callable, factory, *args, **kwargs):
    """AROUND ``DraftBackendFactory.create_draft_extend_backend(self)``: with the flag on, the
    draft's triton draft-extend backend becomes ``ChainDraftExtendTritonBackend``
    (``capture.draft_extend_backend_for``); any other backend is returned unchanged."""
    backend = original(factory, *args, **kwargs)
    return _capture().draft_extend_backend_for(factory.draft_model_runner, backend)


def draft_extend_execute_hook(original: Callable, runner, forward_batch, *args, **kwargs):
    """AROUND ``EAGLEDraftExtendCudaGraphRunner.execute(self, forward_batch, ...)``: a replay of a
    draft-extend graph served by the chain kernel is counted (``raw_bs`` padded to ``bs``) and
    passed to the runner's probe (the self-test when it is on)."""
    return _capture().execute_draft_extend(original, runner, forward_batch, *args, **kwargs)


def build_verify_input_hook(original: Callable, *args, **kwargs):
    """AROUND ``build_eagle_verify_input``: a topk=1 chain verified by the chain kernel needs no
    tree mask, so ask for SGLang's smallest mask mode (QLEN_ONLY: bs * ndt^2 bools) instead of
    FULL_MASK (ndt * (seq_len + ndt) bools per request, memset every step)."""
    target = kwargs.get("target_worker")
    if (target is not None and kwargs.get("topk") == 1
            and _capture().uses_chain_backend(target.model_runner)):
        kwargs["tree_mask_mode"] = adapter.qlen_only_tree_mask_mode()
    return original(*args, **kwargs)


def internal_state_hook(result, *args, **kwargs):
    """AFTER ``Scheduler.get_internal_state``: add this rank's counters (and the sync check's) to
    the returned ``internal_state`` dict (what ``/get_server_info`` serves)."""
    state = getattr(result, "internal_state", result)
    if isinstance(state, dict):
        counters, check = get_counters(), peek_sync_check()
        if counters is not None:
            state["verify_cuda_graph"] = counters.snapshot()
        if check is not None:
            state["verify_sync_check"] = check.snapshot()
    return result


def sync_check_hook(original: Callable, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.verify`` (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``, tests only): count
    synchronizing CUDA calls inside the verify step (``sync_check.py``)."""
    return get_sync_check().run(original, *args, **kwargs)


def top_p_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND ``sgl_kernel.top_p_renorm_prob`` (sync check only): count the call in a verify step."""
    get_sync_check().note("top_p_renorm_prob")
    return original(*args, **kwargs)


def top_k_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND ``sgl_kernel.top_k_renorm_prob`` (sync check only): count the call in a verify step."""
    get_sync_check().note("top_k_renorm_prob")
    return original(*args, **kwargs)


# ---- hook tables ----------------------------------------------------------------------------
def cli_hooks() -> list[Hook]:
    validate = cli.resolve_once_hook if adapter.RESOLVE_ONCE else cli.post_init_hook
    return [
        (adapter.ADD_CLI_ARGS, cli.add_cli_args_hook, adapter.HookType.AFTER),
        (adapter.FROM_CLI_ARGS, cli.from_cli_args_hook, adapter.HookType.AROUND),
        (adapter.VALIDATION_POINT, cli.pre_resolution_hook, adapter.HookType.BEFORE),
        (adapter.VALIDATION_POINT, validate, adapter.HookType.AFTER),
        (adapter.CONFIG_MERGER, cli.merge_config_hook, adapter.HookType.AROUND),
    ]


def runtime_hooks() -> list[Hook]:
    graph = ((adapter.DECODE_RUNNER_CLS, decode_runner_cls_hook, adapter.HookType.AROUND) if adapter.RUNNER_CLS_HOOK
             else (adapter.CAPTURE_DECODE_GRAPH, capture_decode_graph_hook, adapter.HookType.AROUND))
    return [
        graph,
        (adapter.FORWARD_RAW, forward_raw_hook, adapter.HookType.AROUND),
        (adapter.VERIFY, verify_step_hook, adapter.HookType.AROUND),
        (adapter.CREATE_DRAFT_EXTEND_BACKEND, draft_extend_backend_hook, adapter.HookType.AROUND),
        (adapter.DRAFT_EXTEND_EXECUTE, draft_extend_execute_hook, adapter.HookType.AROUND),
        (adapter.BUILD_VERIFY_INPUT, build_verify_input_hook, adapter.HookType.AROUND),
        (adapter.GET_INTERNAL_STATE, internal_state_hook, adapter.HookType.AFTER),
    ]


def profile_hooks_table() -> list[Hook]:
    return [
        (adapter.CYCLE, profile_hooks.profile_cycle_hook, adapter.HookType.AROUND),
        (adapter.DRAFT, profile_hooks.profile_draft_hook, adapter.HookType.AROUND),
        (adapter.VERIFY, profile_hooks.profile_verify_hook, adapter.HookType.AROUND),
        (adapter.DRAFT_EXTEND, profile_hooks.profile_draft_extend_hook, adapter.HookType.AROUND),
    ]


def sync_check_hooks() -> list[Hook]:
    """The verify-step wrapper, the internal-state report and, where ``sgl_kernel`` is installed
    (not on a CPU-only machine), the renorm-kernel counters."""
    hooks = [(adapter.VERIFY, sync_check_hook, adapter.HookType.AROUND),
             (adapter.GET_INTERNAL_STATE, internal_state_hook, adapter.HookType.AFTER)]
    if adapter.sgl_kernel_installed():
        hooks += [(adapter.TOP_P_RENORM, top_p_renorm_hook, adapter.HookType.AROUND),
                  (adapter.TOP_K_RENORM, top_k_renorm_hook, adapter.HookType.AROUND)]
    return hooks


def install(runtime: bool, profile: bool = False, sync_check: bool = False) -> list[str]:
    """Install the CLI hooks (and the runtime ones when ``runtime``, the profile ones when
    ``profile``, the host-sync check when ``sync_check``) and return the targets that did NOT
    take effect (empty when all is well)."""
    hooks = cli_hooks() + (runtime_hooks() if runtime else []) + (profile_hooks_table() if profile else [])
    if sync_check:
        hooks += [h for h in sync_check_hooks() if h not in hooks]
    missing = adapter.install_hooks(hooks)
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
