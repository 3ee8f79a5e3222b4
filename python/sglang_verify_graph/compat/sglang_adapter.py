"""The bottom layer: everything that is specific to an SGLang version, and the only module that
touches ``sglang.srt``. It imports nothing from this package, so every other module may import it.

It holds SGLang version facts (:data:`SGLANG_VERSION`, :data:`SUPPORTED_RANGE` and one boolean per
API change point, e.g. :data:`RESOLVE_ONCE`), the dotted names of the SGLang functions the plugin
hooks (:data:`DECODE_RUNNER_CLS`, :data:`VERIFY`, ...), accessors for SGLang objects whose
spelling differs between releases (:func:`resolved`, :func:`kv_write_loc`, ...) and the
hook-registry mechanics (:func:`install_hooks`: SGLang's ``HookRegistry`` has no public way to
apply one plugin's hooks early, so this is the one place that edits its ``_hooks`` / ``_patched``;
``test/cpu/test_hook_installation.py`` fails on a release where that stops working). What is done
at each hook lives above it (the table in ``hooks.py``; ``plugin.py`` installs it).

Supports every SGLang release from 0.5.16 to 0.5.23. Each change point below names the first
release that has it, as read in each release's source; a release in the range takes every path
whose change point it has reached. Heavy SGLang modules are imported inside functions, so that the
HTTP main process (which loads plugins before parsing arguments) imports only ``server_args`` and
the hook registry.
"""

from __future__ import annotations

import importlib.util
import pkgutil
import re
from typing import Any, Callable, Iterable

import sglang
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

__all__ = ["HookType"]


def _version_tuple(text: str) -> tuple:
    """``(major, minor, patch)`` of a version string (``"0.5.23.post1"`` -> ``(0, 5, 23)``;
    local and pre-release tails ignored)."""
    parts = []
    for piece in str(text).split("+")[0].split(".")[:3]:
        digits = re.match(r"\d*", piece).group()
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


SUPPORTED_RANGE = ("0.5.16", "0.5.23")
"""The oldest and newest SGLang release this plugin supports, inclusive, post releases of the
newest included (``pyproject.toml``'s dependency is :data:`REQUIREMENT`: a CPU test compares them)."""

_OLDEST, _NEWEST = (_version_tuple(v) for v in SUPPORTED_RANGE)

REQUIREMENT = (f"sglang>={SUPPORTED_RANGE[0]},"
               f"<{_NEWEST[0]}.{_NEWEST[1]}.{_NEWEST[2] + 1}")
"""The pip requirement of :data:`SUPPORTED_RANGE`: ``"sglang>=0.5.16,<0.5.24"``."""

SUPPORTED_VERSIONS = tuple(f"{_OLDEST[0]}.{_OLDEST[1]}.{n}" for n in range(_OLDEST[2], _NEWEST[2] + 1))
"""Every release in :data:`SUPPORTED_RANGE`, oldest first (both ends share major.minor)."""

SGLANG_VERSION: str = str(getattr(sglang, "__version__", "0"))
"""``sglang.__version__`` of the installed SGLang, read once at import."""

_INSTALLED = _version_tuple(SGLANG_VERSION)

IN_RANGE: bool = _OLDEST <= _INSTALLED <= _NEWEST
"""Whether the installed SGLang is a supported release (post releases of one count as it)."""


def _since(release: str) -> bool:
    """Whether the installed SGLang is ``release`` or newer."""
    return _INSTALLED >= _version_tuple(release)


# ---- API change points (first release with the change) ---------------------------------------
RUNNER_CLS_HOOK: bool = _since("0.5.17")
"""0.5.17: ``capture_decode_graph`` builds the decode-graph runner as
``model_runner._decode_cuda_graph_runner_cls()(model_runner)`` and returns ``GraphCapture``
(``DecodeGraphCapture`` is gone); the runner's ``can_run_graph`` no longer refuses a
capture-hidden-mode mismatch (the mode is fixed at capture; ``load_batch`` raises on one)."""

DP_BATCH_SIZE_HELPER: bool = _since("0.5.18")
"""0.5.18: ``can_run_graph`` takes the DP batch size from ``_max_dp_batch_size(forward_batch)``
(which raises on missing per-rank counts) instead of ``max(original_global_num_tokens_cpu)``."""

RESOLVE_ONCE: bool = _since("0.5.19")
"""0.5.19: ``ServerArgs.__post_init__`` resolves nothing; ``resolve_once()`` runs the resolution
pipeline, the record keeps the operator's raw input and decisions are read through
``resolving_view``; the ``--config`` merger moved to ``sglang.srt.utils.server_args_config_parser``;
``ForwardBatch.can_run_dp_cuda_graph`` became ``can_run_decode_cuda_graph``; the triton backend's
``_translate_kv_loc`` became ``kv_index_translator``."""

DRAFT_EXTEND_SELECT_INDEX: bool = _since("0.5.20")
"""0.5.20: ``EAGLEDraftExtendCudaGraphRunner.execute(forward_batch, select_index)`` (one argument
before)."""

KV_WRITE_LOC_FOR_BATCH: bool = _since("0.5.22")
"""0.5.22: ``KVWriteLoc`` carries a ``physical`` mark and is built with
``KVWriteLoc.for_batch(forward_batch)``."""

VALIDATES_AT_CONSTRUCTION: bool = not RESOLVE_ONCE
"""Before 0.5.19 ``ServerArgs.__post_init__`` resolves the record in place."""

CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE: bool = not RUNNER_CLS_HOOK
"""Before 0.5.17 ``can_run_graph`` refuses a capture-hidden-mode mismatch."""

# ---- hook targets (dotted names resolved by SGLang's HookRegistry) --------------------------
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
ADD_CLI_ARGS = f"{SERVER_ARGS}.add_cli_args"
FROM_CLI_ARGS = f"{SERVER_ARGS}.from_cli_args"
VALIDATION_POINT = f"{SERVER_ARGS}.resolve_once" if RESOLVE_ONCE else f"{SERVER_ARGS}.__post_init__"
"""Where the version resolves server arguments, for the CLI and ``sglang.Engine`` alike."""
CONFIG_MERGER = ("sglang.srt.utils.server_args_config_parser" if RESOLVE_ONCE
                 else "sglang.srt.server_args_config_parser") + ".ConfigArgumentMerger.merge_config_with_args"
CAPTURE_DECODE_GRAPH = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph"
"""Before 0.5.17: builds the decode-graph runner of a model runner."""
DECODE_RUNNER_CLS = "sglang.srt.model_executor.model_runner.ModelRunner._decode_cuda_graph_runner_cls"
"""0.5.17 on: picks the decode-graph runner class, built as ``cls(model_runner)``."""
FORWARD_RAW = "sglang.srt.model_executor.model_runner.ModelRunner._forward_raw"
"""Dispatches one forward to the decode graph, the prefill graph or the eager runner."""
BUILD_VERIFY_INPUT = "sglang.srt.speculative.eagle_worker_common.build_eagle_verify_input"
CREATE_DRAFT_EXTEND_BACKEND = "sglang.srt.speculative.draft_utils.DraftBackendFactory.create_draft_extend_backend"
"""Builds the draft's draft-extend attention backend (also the draft runner's ``attn_backend``)."""
DRAFT_EXTEND_EXECUTE = ("sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner."
                        "EAGLEDraftExtendCudaGraphRunner.execute")
"""Replays the draft-extend graph (``DRAFT_EXTEND_V2``) for one batch; sets ``raw_bs`` / ``bs``."""
GET_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
_EAGLE_V2 = "sglang.srt.speculative.eagle_worker_v2"
CYCLE = f"{_EAGLE_V2}.EAGLEWorkerV2.forward_batch_generation"
DRAFT = f"{_EAGLE_V2}.EagleDraftWorker.draft"
VERIFY = f"{_EAGLE_V2}.EAGLEWorkerV2.verify"
DRAFT_EXTEND = f"{_EAGLE_V2}.EagleDraftWorker._draft_extend_for_decode"
TOP_P_RENORM = "sgl_kernel.top_p_renorm_prob"
TOP_K_RENORM = "sgl_kernel.top_k_renorm_prob"
"""sgl_kernel's renormalisation kernels; SGLang 0.5.16's sampled verify
(``speculative/eagle_utils.py``) imports them from ``sgl_kernel`` at each call, so wrapping the
module attribute sees every call."""


# ---- server args ----------------------------------------------------------------------------
def resolved(server_args: Any) -> Any:
    """Read view of the *resolved* server arguments. Before 0.5.19: the object itself
    (``__post_init__`` resolves in place). 0.5.19 on: SGLang's ``resolving_view`` (the record
    keeps the operator's raw input; resolution decisions live in declarations over it, e.g.
    ``NEXTN`` stays in the field and the view says ``EAGLE``)."""
    if RESOLVE_ONCE:
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(server_args)
    return server_args


def load_plugins() -> None:
    """SGLang's ``load_plugins()`` (every ``sglang.srt.plugins`` entry point, once per process)."""
    from sglang.srt.plugins import load_plugins as load

    load()


def kill_process_tree(pid: int, wait_timeout: float = 60) -> None:
    """SGLang's ``kill_process_tree``: ``pid`` and every process it started; waits up to
    ``wait_timeout`` s for them to exit."""
    from sglang.srt.utils import kill_process_tree as kill

    kill(pid, wait_timeout=wait_timeout)


def gather_over_tp(scheduler, obj) -> "list | None":
    """``obj`` (picklable) of every tensor-parallel rank of ``scheduler``'s group, a list indexed by
    TP rank, gathered over SGLang's ``Scheduler.tp_cpu_group`` (gloo) as SGLang's ``check_weights``
    gathers its per-rank checksums; ``None`` at TP 1 or where ``scheduler`` has no such group. A
    collective: every TP rank must call it at the same point (each rank handles the same control
    request in the same order, SGLang broadcasting them over that group), or the caller blocks."""
    group = getattr(scheduler, "tp_cpu_group", None)
    if group is None:
        return None
    import torch.distributed as dist

    n = dist.get_world_size(group=group)
    if n <= 1:
        return None
    out = [None] * n
    dist.all_gather_object(out, obj, group=group)
    return out


# ---- classes and helpers the runner and backend build on -------------------------------------
def triton_attn_backend_cls():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    return TritonAttnBackend


def attention_context(backend):
    """A context manager under which SGLang's attention layers call ``backend``
    (``ForwardContext(attn_backend=backend)``, as ``ModelRunner._forward_raw`` enters it)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    return forward_context(ForwardContext(attn_backend=backend))


def decode_cuda_graph_runner_cls():
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    return DecodeCudaGraphRunner


def decode_graph_capture(runner, graph_mem_gib: float):
    """Before 0.5.17: what ``capture_decode_graph`` returns (``DecodeGraphCapture``)."""
    from sglang.srt.model_executor.model_runner_components.cuda_graph_setup import DecodeGraphCapture

    return DecodeGraphCapture(runner=runner, graph_mem_usage=graph_mem_gib)


def available_gpu_memory(model_runner) -> float:
    """Free GPU memory of the model runner's device, GiB (SGLang's ``get_available_gpu_memory``)."""
    from sglang.srt.utils import get_available_gpu_memory

    return get_available_gpu_memory(model_runner.device, model_runner.gpu_id)


def qlen_only_tree_mask_mode():
    """SGLang's smallest tree-mask mode (``TreeMaskMode.QLEN_ONLY``: bs * ndt^2 bools)."""
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    return TreeMaskMode.QLEN_ONLY


def kv_write_loc(forward_batch):
    """The KV write target of this forward's ``out_cache_loc`` (``KVWriteLoc``)."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if KV_WRITE_LOC_FOR_BATCH:
        return KVWriteLoc.for_batch(forward_batch)
    return KVWriteLoc(forward_batch.out_cache_loc, None, full_loc=None)


def kv_translation_active(backend) -> bool:
    """Whether the page table holds virtual slot ids that kernels must translate (unified pool).
    The chain kernel reads ``req_to_token`` directly, so it refuses such a pool."""
    if RESOLVE_ONCE:
        return bool(getattr(backend.kv_index_translator, "is_translating", False))
    return backend._translate_kv_loc is not None


def can_run_dp(forward_batch) -> bool:
    """The DP-attention vote that the batch may replay a graph (0.5.19 renamed the field)."""
    if RESOLVE_ONCE:
        return bool(forward_batch.can_run_decode_cuda_graph)
    return bool(forward_batch.can_run_dp_cuda_graph)


def draft_extend_select_index(args: tuple, kwargs: dict):
    """The ``select_index`` of an ``EAGLEDraftExtendCudaGraphRunner.execute(forward_batch, ...)``
    call from its arguments after ``forward_batch`` (0.5.20 on: a ``[raw_bs]`` integer tensor, the
    flat token row of each request's last accepted token, ``i * num_draft_tokens + accept_length
    - 1``, as ``EAGLEWorkerV2`` builds it); ``None`` before 0.5.20, whose ``execute`` takes none."""
    if DRAFT_EXTEND_SELECT_INDEX:
        return args[0] if args else kwargs.get("select_index")
    return None


def dp_batch_size(runner, forward_batch) -> int:
    """The batch size a DP-attention (MLP-sync) replay is padded for, as ``can_run_graph`` of
    ``runner`` (a ``DecodeCudaGraphRunner``) computes it: the largest per-rank request count.
    Raises RuntimeError (0.5.18 on) when the batch carries no per-rank counts."""
    if DP_BATCH_SIZE_HELPER:
        return runner._max_dp_batch_size(forward_batch)
    return max(forward_batch.original_global_num_tokens_cpu)


def logit_cap(layer) -> float:
    """The layer's logit soft-cap as the triton kernels take it (0.0 = none)."""
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod

    return float(logit_capping_mod(layer.logit_capping_method, layer.logit_cap)) if layer.logit_cap else 0.0


def num_aux_hidden_states(model_runner) -> int:
    """EAGLE-3 aux hidden states the target returns per token (3 unless the draft names its layers)."""
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
    """The model runner whose decode-graph runner this project replaces: the target (not draft)
    of EAGLE/EAGLE-3 with topk 1."""
    algo = model_runner.spec_algorithm
    return (not model_runner.is_draft_worker and algo.is_eagle()
            and (resolved(model_runner.server_args).speculative_eagle_topk or 1) == 1)


def sgl_kernel_installed() -> bool:
    """Whether ``sgl_kernel`` (SGLang's CUDA kernel package) can be imported here."""
    return importlib.util.find_spec("sgl_kernel") is not None


# ---- hook registry --------------------------------------------------------------------------
def install_attention_factory(name: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace SGLang's attention-backend factory ``name`` (``attention_registry``) with
    ``wrap(original)``, once per process (a second call keeps the first wrapper)."""
    from sglang.srt.layers.attention import attention_registry as registry

    original = registry.ATTENTION_BACKENDS[name]
    if getattr(original, "_verify_graph_factory", False):
        return
    factory = wrap(original)
    factory._verify_graph_factory = True
    registry.register_attention_backend(name)(factory)


def _is_applied(target: str, hook: Callable) -> bool:
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


def install_hooks(hooks: Iterable[tuple[str, Callable, HookType]]) -> list[str]:
    """Register ``(target, hook, kind)`` triples with SGLang's ``HookRegistry``, apply them now and
    return the targets that did NOT take effect (empty when all is well), each with the reason
    when its name no longer resolves. SGLang swallows plugin errors, so the caller must act on a
    non-empty answer."""
    missing, resolvable = [], []
    for target, hook, kind in hooks:
        try:  # a target that does not resolve is never registered: SGLang would log a traceback
            obj_path, attr = target.rsplit(".", 1)
            getattr(pkgutil.resolve_name(obj_path), attr)
        except Exception as e:  # the target moved in this SGLang version
            missing.append(f"{target} ({type(e).__name__}: {e})")
            continue
        resolvable.append((target, hook))
        HookRegistry.register(target, hook, kind)
    _apply_registered_hooks_now()
    missing += [target for target, hook in resolvable if not _is_applied(target, hook)]
    return missing
