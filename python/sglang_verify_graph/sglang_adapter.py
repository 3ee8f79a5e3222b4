"""The one module that touches SGLang internals (``sglang.srt.*``); supports sglang 0.5.16 and
0.5.23 (``sglang_adapter_v0523`` holds what only 0.5.23 needs and is imported from here only).

An SGLang upgrade changes this file (and its version module) only. The version is read once, at
import (:data:`SGLANG_VERSION`); :data:`API_0523` selects the 0.5.23 code paths (sglang >= 0.5.23),
every older version takes the 0.5.16 paths unchanged. Heavy internals are imported lazily inside
functions so the HTTP main process (which loads plugins before parsing arguments) imports only
``server_args`` and the hook registry.

Hook points (see docs/design.md):
  CLI (every process): ``ServerArgs.add_cli_args`` AFTER (adds the flag),
    ``ServerArgs.from_cli_args`` AROUND (records it, one-line errors),
    ``ConfigArgumentMerger.merge_config_with_args`` AROUND (``--config`` YAML vs command line
    conflicts on the flag), and the validation point
    that runs for both the CLI and ``sglang.Engine``: 0.5.16 ``ServerArgs.__post_init__`` AFTER;
    0.5.23 ``ServerArgs.resolve_once`` AFTER (0.5.23's ``__post_init__`` resolves nothing).
  Runtime (processes where the flag is on, i.e. schedulers):
    ``register_attention_backend("triton")`` (SGLang's attention registry): the EAGLE topk=1
      target gets ``ChainVerifyTritonBackend``;
    0.5.16 ``cuda_graph_setup.capture_decode_graph`` AROUND / 0.5.23
      ``ModelRunner._decode_cuda_graph_runner_cls`` AROUND: the target gets
      ``VerifyCudaGraphRunner`` instead of ``DecodeCudaGraphRunner`` (upstream's verify graph is
      not captured as well);
    ``eagle_worker_common.build_eagle_verify_input`` AROUND: topk=1 chains build the tiny
      QLEN_ONLY tree mask instead of the full ``ndt * (seq_len + ndt)`` mask + memset;
    ``Scheduler.get_internal_state`` AFTER: counters under ``"verify_cuda_graph"``.
  Profile (processes where ``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0, with or without the flag),
    AROUND hooks with the same names in 0.5.16 and 0.5.23 (extra 0.5.23 arguments pass through):
    ``EAGLEWorkerV2.forward_batch_generation`` (the cycle; decode batches only: prefill/extend and
    idle batches are not profiled), ``EagleDraftWorker.draft`` (draft),
    ``EAGLEWorkerV2.verify`` (target verify), ``EagleDraftWorker._draft_extend_for_decode``
    (draft-extend). The hook functions live in ``profile_hooks.py`` (no ``sglang.srt`` imports);
    see ``profile.py``.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Callable

import sglang
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger("sglang_verify_graph")

SUPPORTED_VERSIONS = ("0.5.16", "0.5.23")
"""SGLang versions this plugin is written and tested against (see README)."""


def _version_tuple(text: str) -> tuple:
    parts = []
    for piece in str(text).split("+")[0].split(".")[:3]:
        digits = re.match(r"\d*", piece).group()
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


SGLANG_VERSION: str = str(getattr(sglang, "__version__", "0"))
"""``sglang.__version__`` of the installed SGLang, read once at import."""

API_0523: bool = _version_tuple(SGLANG_VERSION) >= (0, 5, 23)
"""True on sglang >= 0.5.23 (msgspec ServerArgs, resolution views, runner-class hook)."""

VALIDATES_AT_CONSTRUCTION: bool = not API_0523
"""0.5.16 resolves ServerArgs in ``__post_init__``; 0.5.23 only in ``resolve_once()``."""

CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE: bool = not API_0523
"""0.5.16's ``can_run_graph`` refuses a capture-hidden-mode mismatch; 0.5.23 fixes the mode at
capture and has no such check."""

_SA = "sglang.srt.server_args.ServerArgs"
CAPTURE_DECODE_GRAPH = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph"
DECODE_RUNNER_CLS = "sglang.srt.model_executor.model_runner.ModelRunner._decode_cuda_graph_runner_cls"
BUILD_VERIFY_INPUT = "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input"
GET_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
CONFIG_MERGER = ("sglang.srt.utils.server_args_config_parser" if API_0523
                 else "sglang.srt.server_args_config_parser") + ".ConfigArgumentMerger.merge_config_with_args"
_EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2"
CYCLE = f"{_EAGLE_V2}.EAGLEWorkerV2.forward_batch_generation"
DRAFT = f"{_EAGLE_V2}.EagleDraftWorker.draft"
VERIFY = f"{_EAGLE_V2}.EAGLEWorkerV2.verify"
DRAFT_EXTEND = f"{_EAGLE_V2}.EagleDraftWorker._draft_extend_for_decode"


def _v0523():
    from sglang_verify_graph import sglang_adapter_v0523

    return sglang_adapter_v0523


# ---- server args ---------------------------------------------------------------------------
def resolved(server_args: Any) -> Any:
    """Read view of the *resolved* server arguments. 0.5.16: the object itself (``__post_init__``
    resolves in place). 0.5.23: SGLang's ``resolving_view`` (the record keeps the operator's raw
    input; resolution decisions live in declarations over it)."""
    return _v0523().resolved(server_args) if API_0523 else server_args


# ---- classes and helpers the runner / backend build on ------------------------------------
def triton_attn_backend_cls():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend


def decode_cuda_graph_runner_cls():
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    return DecodeCudaGraphRunner


def kv_write_loc(forward_batch):
    """The KV write target of this forward's ``out_cache_loc`` (``KVWriteLoc``)."""
    if API_0523:
        return _v0523().kv_write_loc(forward_batch)
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    return KVWriteLoc(forward_batch.out_cache_loc, None, full_loc=None)


def kv_translation_active(backend) -> bool:
    """Whether the page table holds virtual slot ids that kernels must translate (unified pool).
    The chain kernel reads ``req_to_token`` directly, so it refuses such a pool."""
    if API_0523:
        return _v0523().kv_translation_active(backend)
    return backend._translate_kv_loc is not None


def can_run_dp(forward_batch) -> bool:
    """The DP-attention vote that the batch may replay a graph (0.5.23 renamed the field)."""
    if API_0523:
        return bool(forward_batch.can_run_decode_cuda_graph)
    return bool(forward_batch.can_run_dp_cuda_graph)


def logit_cap(layer) -> float:
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod

    return float(logit_capping_mod(layer.logit_capping_method, layer.logit_cap)) if layer.logit_cap else 0.0


def num_aux_hidden_states(model_runner) -> int:
    ids = getattr(model_runner.spec_aux_config, "eagle_aux_hidden_state_layer_ids", None)
    return len(ids) if ids else 3


def local_embedding_row(model_runner, token_id: int):
    """This rank's row of the target's input embedding for ``token_id`` (a ``[hidden]`` view of
    the weight, model dtype), or ``None`` when another TP rank's vocab shard holds it."""
    emb = model_runner.model.get_input_embeddings()
    start = getattr(getattr(emb, "shard_indices", None), "org_vocab_start_index", 0)
    local = token_id - start
    if not 0 <= local < emb.weight.shape[0]:
        return None
    return emb.weight.data[local]


def is_eagle_topk1_target(model_runner) -> bool:
    """The runner this project replaces: the target (not draft) of EAGLE/EAGLE-3 with topk 1."""
    algo = model_runner.spec_algorithm
    return (not model_runner.is_draft_worker and algo.is_eagle()
            and (resolved(model_runner.server_args).speculative_eagle_topk or 1) == 1)


# ---- runtime hooks -------------------------------------------------------------------------
def _config_for(model_runner):
    from sglang_verify_graph.config import build_config

    return build_config(resolved(model_runner.server_args))


def _install_triton_factory() -> None:
    from sglang.srt.layers.attention import attention_registry as registry

    original = registry.ATTENTION_BACKENDS["triton"]
    if getattr(original, "_verify_graph_factory", False):
        return

    def create_triton_backend(runner):
        cfg = _config_for(runner) if is_eagle_topk1_target(runner) else None
        if cfg is None:
            return original(runner)
        from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

        return ChainVerifyTritonBackend(runner, cfg)

    create_triton_backend._verify_graph_factory = True
    registry.register_attention_backend("triton")(create_triton_backend)


def uses_chain_backend(model_runner) -> bool:
    from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

    return isinstance(getattr(model_runner, "attn_backend", None), ChainVerifyTritonBackend)


def verify_runner_kind(model_runner):
    """``"chain"`` when the target's backend is ``ChainVerifyTritonBackend``; ``"native"`` when
    the flag's config chose a native backend (``backends.py``) and the target's backend object is
    that backend's SGLang class; else ``None`` (upstream's runner, or a refusal)."""
    if uses_chain_backend(model_runner):
        return "chain"
    if model_runner is None or not is_eagle_topk1_target(model_runner):
        return None
    cfg = _config_for(model_runner)
    if cfg is None or cfg.verify_attention != "native":
        return None
    from sglang_verify_graph.backends import NATIVE_BACKEND_CLASSES

    name = type(getattr(model_runner, "attn_backend", None)).__name__
    return "native" if name in NATIVE_BACKEND_CLASSES.get(cfg.attention_backend, ()) else None


def refuse_if_flag_lost(model_runner) -> None:
    """Raise instead of silently capturing upstream's runner when the flag is on for this EAGLE
    topk=1 target but its attention backend is not (or no longer) one the verify graph serves
    (the chain backend, or the configured native backend's own class), e.g. SGLang wrapped it for
    a hybrid linear-attention / sparse model. Raises VerifyGraphConfigError."""
    if model_runner is None or not is_eagle_topk1_target(model_runner):
        return
    cfg = _config_for(model_runner)
    if cfg is None:
        return
    from sglang_verify_graph.backends import NATIVE_BACKEND_CLASSES
    from sglang_verify_graph.config import VerifyGraphConfigError

    backend = getattr(cfg, "attention_backend", "triton")
    expected = ("ChainVerifyTritonBackend",) if getattr(cfg, "verify_attention", "chain") == "chain" \
        else NATIVE_BACKEND_CLASSES.get(backend, ())
    raise VerifyGraphConfigError(
        problem=f"with --attention-backend {backend} the verify graph serves "
                f"{' / '.join(expected)}, but this model got another attention backend "
                "(an attention wrapper, e.g. hybrid linear or sparse attention, or for "
                "flashinfer/flashmla a target without MLA)",
        flag="attention backend", value=type(getattr(model_runner, "attn_backend", None)).__name__,
        fix="pass --attention-backend triton, or remove --enable-verify-cuda-graph for this model")


def capture_verify_runner(model_runner, build: Callable):
    """Capture our runner with ``build(model_runner, cfg, counters)``, fill the capture counters
    (time, GPU memory) and log one line; an OOM becomes one actionable RuntimeError. Returns
    ``(runner, graph_mem_gib)``."""
    from sglang.srt.utils import get_available_gpu_memory

    from sglang_verify_graph.counters import VerifyCounters, eager_cliff_warning, install_counters

    cfg = getattr(model_runner.attn_backend, "verify_cfg", None) or _config_for(model_runner)
    counters = install_counters(VerifyCounters(log_every=cfg.log_every))
    before = get_available_gpu_memory(model_runner.device, model_runner.gpu_id)
    try:
        runner = build(model_runner, cfg, counters)
    except Exception as e:
        if "out of memory" in str(e).lower():
            raise RuntimeError(
                "--enable-verify-cuda-graph: capturing the verify graphs ran out of GPU memory. "
                "Fix: lower --cuda-graph-max-bs-decode (fewer/smaller buckets) or "
                "--mem-fraction-static.") from e
        raise
    after = get_available_gpu_memory(model_runner.device, model_runner.gpu_id)
    counters.graph_mem_gib = before - after
    logger.info(
        "VerifyCudaGraphRunner captured TARGET_VERIFY graphs: capture_bs=%s, num_draft_tokens=%d "
        "tokens/request, attention=%s, %.2f s, %.3f GiB",
        counters.capture_bs, counters.num_draft_tokens, counters.attention,
        counters.capture_seconds, counters.graph_mem_gib)
    cliff = eager_cliff_warning(getattr(model_runner, "max_running_requests", None),
                                counters.capture_bs)
    if cliff:
        logger.warning("%s", cliff)
    return runner, before - after


def capture_decode_graph_hook(original: Callable, *args, **kwargs):
    """0.5.16, AROUND ``capture_decode_graph(model_runner=...)``: capture VerifyCudaGraphRunner for
    the EAGLE topk=1 target whose attention backend the verify graph serves
    (:func:`verify_runner_kind`); otherwise upstream."""
    model_runner = kwargs.get("model_runner", args[0] if args else None)
    if verify_runner_kind(model_runner) is None:
        refuse_if_flag_lost(model_runner)
        return original(*args, **kwargs)
    from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import DecodeGraphCapture

    from sglang_verify_graph.runner import VerifyCudaGraphRunner

    runner, mem = capture_verify_runner(model_runner, VerifyCudaGraphRunner)
    return DecodeGraphCapture(runner=runner, graph_mem_usage=mem)


def decode_runner_cls_hook(original: Callable, model_runner, *args, **kwargs):
    """0.5.23, AROUND ``ModelRunner._decode_cuda_graph_runner_cls(self)``: the EAGLE topk=1 target
    whose attention backend the verify graph serves gets our runner class; otherwise upstream's."""
    cls = original(model_runner, *args, **kwargs)
    if verify_runner_kind(model_runner) is not None and is_eagle_topk1_target(model_runner):
        return _v0523().verify_runner_cls()
    refuse_if_flag_lost(model_runner)
    return cls


def build_verify_input_hook(original: Callable, *args, **kwargs):
    """AROUND ``build_eagle_verify_input``: a topk=1 chain verified by the chain kernel needs no
    tree mask, so ask for SGLang's smallest mask mode (QLEN_ONLY: bs * ndt^2 bools) instead of
    FULL_MASK (ndt * (seq_len + ndt) bools per request, memset every step)."""
    target = kwargs.get("target_worker")
    if target is not None and kwargs.get("topk") == 1:
        from sglang.srt.speculative.eagle_utils import TreeMaskMode

        from sglang_verify_graph.chain_backend import ChainVerifyTritonBackend

        if isinstance(target.model_runner.attn_backend, ChainVerifyTritonBackend):
            kwargs["tree_mask_mode"] = TreeMaskMode.QLEN_ONLY
    return original(*args, **kwargs)


def internal_state_hook(result, *args, **kwargs):
    """AFTER ``Scheduler.get_internal_state``: add this rank's counters to the returned
    ``GetInternalStateReqOutput.internal_state`` dict (what /get_server_info serves)."""
    from sglang_verify_graph.counters import get_counters

    from sglang_verify_graph.sync_check import peek_sync_check

    counters = get_counters()
    state = getattr(result, "internal_state", result)
    if counters is not None and isinstance(state, dict):
        state["verify_cuda_graph"] = counters.snapshot()
    check = peek_sync_check()
    if check is not None and isinstance(state, dict):
        state["verify_sync_check"] = check.snapshot()
    return result


def sync_check_hook(original: Callable, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.verify`` (``SGLANG_VERIFY_GRAPH_SYNC_CHECK=1``, tests only): count
    synchronizing CUDA calls inside the verify step (``sync_check.py``)."""
    from sglang_verify_graph.sync_check import get_sync_check

    return get_sync_check().run(original, *args, **kwargs)


TOP_P_RENORM = "sgl_kernel.top_p_renorm_prob"
TOP_K_RENORM = "sgl_kernel.top_k_renorm_prob"
"""sgl_kernel's renormalisation kernels; SGLang 0.5.16's sampled verify
(``speculative/eagle_utils.py``) imports them from ``sgl_kernel`` at each call, so wrapping the
module attribute sees every call."""


def top_p_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND :data:`TOP_P_RENORM` (sync check only): count the call inside a verify step."""
    from sglang_verify_graph.sync_check import get_sync_check

    get_sync_check().note("top_p_renorm_prob")
    return original(*args, **kwargs)


def top_k_renorm_hook(original: Callable, *args, **kwargs):
    """AROUND :data:`TOP_K_RENORM` (sync check only): count the call inside a verify step."""
    from sglang_verify_graph.sync_check import get_sync_check

    get_sync_check().note("top_k_renorm_prob")
    return original(*args, **kwargs)


def sync_check_hooks() -> list[tuple[str, Callable, HookType]]:
    """The verify-step wrapper, the internal-state report and, where ``sgl_kernel`` is installed
    (not on the CPU CI machine), the renorm-kernel counters."""
    import importlib.util

    hooks = [(VERIFY, sync_check_hook, HookType.AROUND),
             (GET_INTERNAL_STATE, internal_state_hook, HookType.AFTER)]
    if importlib.util.find_spec("sgl_kernel") is not None:
        hooks += [(TOP_P_RENORM, top_p_renorm_hook, HookType.AROUND),
                  (TOP_K_RENORM, top_k_renorm_hook, HookType.AROUND)]
    return hooks


# ---- registration --------------------------------------------------------------------------
def cli_hooks() -> list[tuple[str, Callable, HookType]]:
    from sglang_verify_graph import cli

    validate = ((f"{_SA}.resolve_once", cli.resolve_once_hook, HookType.AFTER) if API_0523
                else (f"{_SA}.__post_init__", cli.post_init_hook, HookType.AFTER))
    return [
        (f"{_SA}.add_cli_args", cli.add_cli_args_hook, HookType.AFTER),
        (f"{_SA}.from_cli_args", cli.from_cli_args_hook, HookType.AROUND),
        validate,
        (CONFIG_MERGER, cli.merge_config_hook, HookType.AROUND),
    ]


def runtime_hooks() -> list[tuple[str, Callable, HookType]]:
    graph = ((DECODE_RUNNER_CLS, decode_runner_cls_hook, HookType.AROUND) if API_0523
             else (CAPTURE_DECODE_GRAPH, capture_decode_graph_hook, HookType.AROUND))
    return [
        graph,
        (BUILD_VERIFY_INPUT, build_verify_input_hook, HookType.AROUND),
        (GET_INTERNAL_STATE, internal_state_hook, HookType.AFTER),
    ]


def _is_applied(target: str, hook: Callable) -> bool:
    import pkgutil

    obj_path, attr = target.rsplit(".", 1)
    fn = getattr(pkgutil.resolve_name(obj_path), attr)
    fn = getattr(fn, "__func__", fn)
    seen = 0
    while fn is not None and seen < 16:  # walk the wrapper chain built by HookRegistry
        if any(c.cell_contents is hook for c in (getattr(fn, "__closure__", None) or ())):
            return True
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def _apply_registered_hooks_now() -> None:
    """Apply every hook registered so far, then hand the registry back empty for the rest of
    ``load_plugins()``. ``apply_hooks`` skips targets it has patched, so leaving them marked
    would silently drop hooks that plugins loaded after us register on the same targets (e.g.
    their own ``ServerArgs.add_cli_args`` flag); forgetting the applied entries lets those be
    applied later, on top of the already-wrapped attributes, in registration order."""
    HookRegistry.apply_hooks()
    hooks, patched = getattr(HookRegistry, "_hooks", None), getattr(HookRegistry, "_patched", None)
    if isinstance(hooks, dict) and isinstance(patched, set):
        for target in list(patched):
            hooks.pop(target, None)
        patched.clear()


def register(runtime: bool, profile: bool = False, sync_check: bool = False) -> list[str]:
    """Register the CLI hooks (and the runtime ones when ``runtime``, the profile ones when
    ``profile``, the host-sync check when ``sync_check``), apply them now and return the targets
    that did NOT take effect (empty when all is well). SGLang swallows plugin errors, so the
    caller must act on a non-empty answer."""
    from sglang_verify_graph.profile_hooks import profile_hooks

    hooks = (cli_hooks() + (runtime_hooks() if runtime else [])
             + (profile_hooks() if profile else []))
    if sync_check:
        hooks += [h for h in sync_check_hooks() if h not in hooks]
    for target, hook, kind in hooks:
        HookRegistry.register(target, hook, kind)
    _apply_registered_hooks_now()
    missing = []
    for target, hook, _ in hooks:
        try:
            if not _is_applied(target, hook):
                missing.append(target)
        except Exception as e:  # resolution failed: the target moved in this SGLang version
            missing.append(f"{target} ({type(e).__name__}: {e})")
    if runtime:
        try:
            _install_triton_factory()
        except Exception as e:
            missing.append(f"attention_registry['triton'] ({type(e).__name__}: {e})")
    return missing


def argv_requests_flag(flag: str) -> bool:
    return flag in sys.argv
