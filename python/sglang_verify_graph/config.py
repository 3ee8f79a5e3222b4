"""Settings and validation for ``--enable-verify-cuda-graph``.

This module is import-light on purpose: it does not import ``sglang.srt`` (nor
torch) at module level, so it can be used from the CLI hooks, from the
scheduler processes and from CPU tests alike. It works on *duck-typed*
server-args objects: anything with the attribute names of sglang 0.5.16's
``sglang.srt.server_args.ServerArgs`` (a real resolved ``ServerArgs``, sglang
0.5.23's resolved view of one, see ``sglang_adapter.resolved``, or a
``types.SimpleNamespace``).

One channel carries "the flag is on": the environment variable :data:`ENV_ENABLE`, which the
command-line hook sets before ``ServerArgs`` is built and ``sglang.Engine(...)`` users set
themselves (``Engine`` rejects unknown keyword arguments); spawned scheduler processes inherit it.

All environment reading of the project happens in ``env.read_env`` (re-exported here).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

from sglang_verify_graph.backends import (
    check_attention,
    check_draft_backend,
    check_overrides,
    check_target,
)
from sglang_verify_graph.env import (  # noqa: F401 (re-exported: config is the settings' API)
    ENV_ENABLE,
    ENV_LOG_EVERY,
    ENV_NUM_KV_SPLITS,
    ENV_PROFILE_EVERY,
    ENV_SELFTEST,
    ENV_SELFTEST_NAN,
    ENV_SYNC_CHECK,
    EnvSettings,
    read_env,
)
from sglang_verify_graph.errors import FLAG, VerifyGraphConfigError  # noqa: F401 (re-exported)

SUPPORTED_ATTENTION_BACKENDS: Tuple[str, ...] = ("triton", "fa3", "flashmla", "flashinfer")
"""Attention backends (resolved ``ServerArgs`` values) the verify graph supports; the policy
(chain kernel for triton, the backend's own verify for the others) is in ``backends.py``."""

SUPPORTED_SPECULATIVE_ALGORITHMS: Tuple[str, ...] = ("EAGLE3", "EAGLE")
"""Resolved ``speculative_algorithm`` values accepted (sglang resolves ``NEXTN`` to ``EAGLE``)."""

# ``ServerArgs.__post_init__`` returns before any resolution for these paths.
UNRESOLVED_MODEL_PATHS: Tuple[str, ...] = ("none", "dummy")

def is_enabled(env: Optional[EnvSettings] = None) -> bool:
    """Whether ``--enable-verify-cuda-graph`` is on: :data:`ENV_ENABLE` is set to a true value
    (``env``: the parsed environment; ``None`` reads it with :func:`read_env`). Raises
    VerifyGraphConfigError from :func:`read_env` on a malformed variable."""
    return (read_env() if env is None else env).enable


@dataclasses.dataclass(frozen=True)
class VerifyGraphConfig:
    """Validated settings of the topk=1 target-verify CUDA graph.

    Attributes:
        num_steps: draft steps per cycle (``speculative_num_steps``, >= 1).
        num_draft_tokens: tokens verified per request per step (= ``num_steps + 1``).
        topk: draft top-k (always 1).
        speculative_algorithm: resolved algorithm, ``"EAGLE3"`` or ``"EAGLE"``.
        attention_backend: resolved attention backend serving target verify
            (:data:`SUPPORTED_ATTENTION_BACKENDS`).
        page_size: KV-cache page size in tokens.
        max_running_requests: max concurrent requests, or ``None`` if unresolved.
        num_kv_splits: KV-split override from the environment, or ``None`` (runner chooses).
        log_every: verify steps between counter log lines (0 = off).
        decode_graph_backend: resolved ``cuda_graph_config.decode.backend``
            (never ``"disabled"``), or ``None`` if the object carries no config.
        cuda_graph_max_bs: resolved max captured batch size (requests), or ``None``.
        cuda_graph_bs: resolved captured batch sizes (requests), or ``None``.
        disable_cuda_graph_padding: replay only exactly captured batch sizes.
        tp_size: tensor-parallel size.
        selftest: run the in-server graph-vs-eager self-test (``SGLANG_VERIFY_GRAPH_SELFTEST``).
        selftest_nan: with ``selftest``, NaN in every padded row during replays
            (``SGLANG_VERIFY_GRAPH_SELFTEST_NAN``).
        verify_attention: ``"chain"`` (triton: the split-KV chain kernel) or ``"native"`` (fa3;
            flashmla, flashinfer on MLA targets: the backend's own verify kernel), see
            ``backends.py``.
        draft_extend_attention: ``"chain"`` (the draft's ``DRAFT_EXTEND_V2`` attention on a
            triton draft-extend backend is the chain kernel) or ``"upstream"``
            (``SGLANG_VERIFY_GRAPH_DRAFT_EXTEND``).
        test_fault: the chain attention's test fault (``SGLANG_VERIFY_GRAPH_TEST_FAULT``, tests
            only; ``env.TEST_FAULT_LAUNCHES`` names the launch it applies to), or ``None``.
    """

    num_steps: int
    num_draft_tokens: int
    topk: int
    speculative_algorithm: str
    attention_backend: str
    page_size: int
    max_running_requests: Optional[int]
    num_kv_splits: Optional[int]
    log_every: int
    decode_graph_backend: Optional[str] = None
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[Tuple[int, ...]] = None
    disable_cuda_graph_padding: bool = False
    tp_size: int = 1
    selftest: bool = False
    selftest_nan: bool = False
    verify_attention: str = "chain"
    draft_extend_attention: str = "chain"
    test_fault: Optional[str] = None


def _check_algorithm(server_args: Any) -> str:
    algo = getattr(server_args, "speculative_algorithm", None)
    name = algo.upper() if isinstance(algo, str) else algo
    if name == "NEXTN":  # what sglang's own alias resolution does
        name = "EAGLE"
    if name not in SUPPORTED_SPECULATIVE_ALGORITHMS:
        raise VerifyGraphConfigError(
            "needs EAGLE-3 (or EAGLE) speculative decoding", "--speculative-algorithm",
            algo,
            "pass --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft> "
            f"--speculative-eagle-topk 1, or remove {FLAG}",
        )
    return name


def _check_topk(topk: Any) -> None:
    if topk != 1:
        raise VerifyGraphConfigError(
            "supports only a linear draft chain (top-k 1)", "--speculative-eagle-topk",
            topk, "pass --speculative-eagle-topk 1",
        )


def _check_adaptive(server_args: Any) -> None:
    if getattr(server_args, "speculative_adaptive", False):
        raise VerifyGraphConfigError(
            "does not support adaptive speculative decoding (it swaps the verify "
            "graph runner per step)", "--speculative-adaptive", True,
            "remove --speculative-adaptive",
        )


def _check_steps(server_args: Any) -> Tuple[int, int, int]:
    topk = getattr(server_args, "speculative_eagle_topk", None)
    _check_topk(topk)
    _check_adaptive(server_args)
    steps = getattr(server_args, "speculative_num_steps", None)
    if not isinstance(steps, int) or steps < 1:
        raise VerifyGraphConfigError(
            "needs at least one draft step", "--speculative-num-steps", steps,
            "pass --speculative-num-steps N with N >= 1 (e.g. 3)",
        )
    ndt = getattr(server_args, "speculative_num_draft_tokens", None)
    if ndt != steps + 1:
        raise VerifyGraphConfigError(
            f"with top-k 1 the draft-token count must be num_steps + 1 = {steps + 1}",
            "--speculative-num-draft-tokens", ndt,
            f"pass --speculative-num-draft-tokens {steps + 1} or omit it",
        )
    return steps, topk, ndt


def _decode_graph_backend(server_args: Any) -> Optional[str]:
    cfg = getattr(server_args, "cuda_graph_config", None)
    decode = getattr(cfg, "decode", None)
    if decode is None and isinstance(cfg, Mapping):
        decode = cfg.get("decode")
    if isinstance(decode, Mapping):
        return decode.get("backend")
    return getattr(decode, "backend", None)


def _check_cuda_graph(server_args: Any) -> Optional[str]:
    backend = _decode_graph_backend(server_args)
    candidates = (
        ("--cuda-graph-backend-decode", getattr(server_args, "cuda_graph_backend_decode", None) == "disabled",
         "disabled", "remove --cuda-graph-backend-decode disabled"),
        ("--disable-decode-cuda-graph", bool(getattr(server_args, "disable_decode_cuda_graph", False)),
         True, "remove --disable-decode-cuda-graph"),
        ("--disable-cuda-graph", bool(getattr(server_args, "disable_cuda_graph", False)),
         True, "remove --disable-cuda-graph"),
    )
    if backend is None:  # unresolved object: judge by the raw flags alone
        if any(hit for _, hit, _, _ in candidates):
            backend = "disabled"
    if backend != "disabled":
        return backend
    for flag, hit, value, fix in candidates:
        if hit:
            raise VerifyGraphConfigError(
                "needs decode CUDA graphs (the verify graph replaces them)", flag,
                value, fix,
            )
    raise VerifyGraphConfigError(
        "needs decode CUDA graphs, but the resolved cuda_graph_config disables them "
        "(set by --cuda-graph-config or forced off by another setting; see the "
        "server log)", "--cuda-graph-config", "decode.backend=disabled",
        'set --cuda-graph-config \'{"decode":{"backend":"full"}}\' or remove the '
        "setting that disables decode CUDA graphs",
    )


def _check_parallel(server_args: Any) -> None:
    dp = getattr(server_args, "enable_dp_attention", False)
    # sglang 0.5.22 and later spell DP attention --attn-dp-size N (and resolve the deprecated
    # --enable-dp-attention into it); earlier releases have no such field.
    attn_dp = getattr(server_args, "attn_dp_size", 1) or 1
    pp = getattr(server_args, "pp_size", 1) or 1
    tbo = getattr(server_args, "enable_two_batch_overlap", False)
    checks = (
        ("--enable-dp-attention", bool(dp), dp, "DP attention", "remove --enable-dp-attention"),
        ("--attn-dp-size", attn_dp > 1, attn_dp, "DP attention", "use --attn-dp-size 1"),
        ("--pp-size", pp > 1, pp, "pipeline parallelism", "use --pp-size 1"),
        ("--enable-two-batch-overlap", bool(tbo), tbo, "two-batch overlap",
         "remove --enable-two-batch-overlap"),
    )
    for flag, bad, value, what, fix in checks:
        if bad:
            raise VerifyGraphConfigError(f"does not support {what} yet", flag, value, fix)


_KV_DTYPES_SERVED = ("auto", "bfloat16", "bf16", "float16", "fp16", "half")


def _check_kv_cache(server_args: Any) -> None:
    """Settings the chain verify attention cannot serve, caught at launch (not in the scheduler)."""
    kv = str(getattr(server_args, "kv_cache_dtype", "auto") or "auto")
    det = getattr(server_args, "enable_deterministic_inference", False)
    page_major = getattr(server_args, "enable_page_major_kv_layout", False)
    checks = (
        ("--kv-cache-dtype", kv not in _KV_DTYPES_SERVED, kv, "a quantized KV cache",
         "use --kv-cache-dtype auto"),
        ("--enable-deterministic-inference", bool(det), det, "deterministic inference",
         "remove --enable-deterministic-inference"),
        ("--enable-page-major-kv-layout", bool(page_major), page_major, "the page-major KV layout",
         "remove --enable-page-major-kv-layout"),
    )
    for flag, bad, value, what, fix in checks:
        if bad:
            raise VerifyGraphConfigError(f"does not support {what} yet", flag, value, fix)


def check_given(server_args: Any, env: Optional[EnvSettings] = None) -> None:
    """Refuse, before SGLang resolves the server arguments, the settings that conflict with the
    flag whatever the resolution decides, so that the one-line error comes first on any machine
    (SGLang's resolution needs an accelerator and fails without one).

    Judged on the values as given: the speculative algorithm (unset or not EAGLE/EAGLE3/NEXTN),
    a given ``--speculative-eagle-topk`` other than 1, ``--speculative-adaptive``, the flags that
    disable decode CUDA graphs, DP attention / pipeline parallelism / two-batch overlap, a given
    attention backend (or prefill/decode override) the verify graph does not serve, and with a
    given ``--attention-backend triton`` the KV-cache settings the chain kernel cannot serve; a
    given backend (or both phase overrides) is also checked for prefill != decode and, for local
    checkpoint folders, against the target's and draft's attention kind (MLA-only backends).
    Values SGLang decides (an unset top-k or backend, the draft-token count, which SGLang sets to
    ``num_steps + 1`` for top-k 1) are left to :func:`build_config` on the resolved arguments.

    Raises:
        VerifyGraphConfigError: on the first conflicting given setting, or a malformed variable.
    """
    if not is_enabled(env):
        return
    _check_algorithm(server_args)
    topk = getattr(server_args, "speculative_eagle_topk", None)
    if topk is not None:
        _check_topk(topk)
    _check_adaptive(server_args)
    _check_parallel(server_args)
    prefill = getattr(server_args, "prefill_attention_backend", None)
    decode = getattr(server_args, "decode_attention_backend", None)
    if getattr(server_args, "attention_backend", None) is not None or (prefill and decode):
        attention, verify_attention = check_attention(server_args)
        check_target(server_args, attention)  # local config.json files only
        check_draft_backend(server_args, attention)
        if verify_attention == "chain":
            _check_kv_cache(server_args)
    else:
        check_overrides(server_args)
    if _decode_graph_backend(server_args) is None:  # raw flags only; a given config is resolved later
        _check_cuda_graph(server_args)


def build_config(server_args: Any, env: Optional[EnvSettings] = None) -> Optional[VerifyGraphConfig]:
    """Validate the (resolved) server args and build the verify-graph settings.

    Checks, in order: speculative algorithm (EAGLE3/EAGLE), ``--speculative-eagle-topk 1``,
    no ``--speculative-adaptive``, ``speculative_num_steps >= 1``,
    ``num_draft_tokens == num_steps + 1``, one supported attention backend for prefill and
    decode (``backends.check_attention``), an MHA draft not on an MLA-only backend
    (``backends.check_draft_backend``), decode CUDA graphs on, no DP attention / pipeline
    parallelism / two-batch overlap, and for the chain kernel (triton) a bf16/fp16 KV cache, no
    deterministic inference, no page-major KV layout.

    Args:
        server_args: a resolved sglang 0.5.16 ``ServerArgs`` (after
            ``__post_init__``) or a duck-typed object with the same attribute names.
        env: parsed environment; ``None`` reads it with :func:`read_env`.

    Returns:
        ``None`` when the feature is off (see :func:`is_enabled`), otherwise the
        :class:`VerifyGraphConfig`.

    Raises:
        VerifyGraphConfigError: on the first setting the feature cannot work
            with (the message names the flag and the fix), or on a malformed
            environment variable.
    """
    if env is None:
        env = read_env()
    if not is_enabled(env):
        return None
    algo = _check_algorithm(server_args)
    steps, topk, ndt = _check_steps(server_args)
    attention, verify_attention = check_attention(server_args)
    check_target(server_args, attention)
    check_draft_backend(server_args, attention)
    graph_backend = _check_cuda_graph(server_args)
    _check_parallel(server_args)
    if verify_attention == "chain":  # what the chain kernel cannot serve yet
        _check_kv_cache(server_args)

    cfg = getattr(server_args, "cuda_graph_config", None)
    decode = getattr(cfg, "decode", None)
    bs = getattr(decode, "bs", None)
    return VerifyGraphConfig(
        num_steps=steps,
        num_draft_tokens=ndt,
        topk=topk,
        speculative_algorithm=algo,
        attention_backend=attention,
        verify_attention=verify_attention,
        page_size=int(getattr(server_args, "page_size", None) or 1),
        max_running_requests=getattr(server_args, "max_running_requests", None),
        num_kv_splits=env.num_kv_splits,
        log_every=env.log_every,
        decode_graph_backend=graph_backend,
        cuda_graph_max_bs=getattr(decode, "max_bs", None),
        cuda_graph_bs=tuple(bs) if bs is not None else None,
        disable_cuda_graph_padding=bool(getattr(server_args, "disable_cuda_graph_padding", False)),
        tp_size=int(getattr(server_args, "tp_size", 1) or 1),
        selftest=env.selftest,
        selftest_nan=env.selftest and env.selftest_nan,
        draft_extend_attention=env.draft_extend,
        test_fault=env.test_fault,
    )
