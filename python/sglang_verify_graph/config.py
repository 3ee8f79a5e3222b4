"""Settings and validation for ``--enable-verify-cuda-graph``.

This module is import-light on purpose: it does not import ``sglang.srt`` (nor
torch) at module level, so it can be used from the CLI hooks, from the
scheduler processes and from CPU tests alike. It works on *duck-typed*
server-args objects: anything with the attribute names of sglang 0.5.16's
``sglang.srt.server_args.ServerArgs`` (a real resolved ``ServerArgs``, sglang
0.5.23's resolved view of one, see ``sglang_adapter.resolved``, or a
``types.SimpleNamespace``).

Two channels carry "the flag is on":

* the underscore attribute :data:`ATTR_ENABLE` on the ``ServerArgs`` object
  (set by the CLI hooks; it survives pickling to the scheduler processes), and
* the environment variable :data:`ENV_ENABLE` (how ``sglang.Engine(...)`` users
  turn the feature on, since ``Engine`` rejects unknown keyword arguments; it
  is inherited by spawned scheduler processes).

All environment reading of the project happens in :func:`read_env`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple

FLAG = "--enable-verify-cuda-graph"
"""The command-line flag this plugin adds to SGLang's server arguments."""

ENV_ENABLE = "SGLANG_ENABLE_VERIFY_CUDA_GRAPH"
"""Environment variable that turns the feature on (``1``/``true``/``yes``/``on``)."""

ENV_NUM_KV_SPLITS = "SGLANG_VERIFY_GRAPH_NUM_KV_SPLITS"
"""Optional positive int: override the number of KV splits of the verify attention."""

ENV_LOG_EVERY = "SGLANG_VERIFY_GRAPH_LOG_EVERY"
"""Non-negative int: verify steps between counter log lines (0 = never log)."""

ENV_PROFILE_EVERY = "SGLANG_VERIFY_GRAPH_PROFILE_EVERY"
"""Non-negative int: EAGLE cycles between per-phase profile log lines (0 = profile off).
Independent of :data:`ENV_ENABLE` (upstream's verify path can be profiled too)."""

ENV_SELFTEST = "SGLANG_VERIFY_GRAPH_SELFTEST"
"""Boolean: run the in-server graph-vs-eager self-test on every replay (GPU tests only; slow)."""

ENV_SELFTEST_NAN = "SGLANG_VERIFY_GRAPH_SELFTEST_NAN"
"""Boolean, with :data:`ENV_SELFTEST` only: during each replay of our graph the embedding row of
the padding token holds NaN, so every padded row carries NaN through every layer; the self-test
then checks that real rows stay finite and equal to eager (GPU tests only)."""

ENV_SYNC_CHECK = "SGLANG_VERIFY_GRAPH_SYNC_CHECK"
"""Boolean: count synchronizing CUDA calls inside each EAGLE verify step (``sync_check.py``;
tests only). Independent of :data:`ENV_ENABLE` (upstream's verify can be checked too)."""

ATTR_ENABLE = "_enable_verify_cuda_graph"
"""Underscore attribute set to ``True`` on an enabled ``ServerArgs`` object."""

ATTR_CONFIG = "_verify_cuda_graph_config"
"""Underscore attribute holding the validated :class:`VerifyGraphConfig` (set by the post-init hook)."""

SUPPORTED_ATTENTION_BACKENDS: Tuple[str, ...] = ("triton", "fa3", "flashmla", "flashinfer")
"""Attention backends (resolved ``ServerArgs`` values) the verify graph supports; the policy
(chain kernel for triton, the backend's own verify for the others) is in ``backends.py``."""

SUPPORTED_SPECULATIVE_ALGORITHMS: Tuple[str, ...] = ("EAGLE3", "EAGLE")
"""Resolved ``speculative_algorithm`` values accepted (sglang resolves ``NEXTN`` to ``EAGLE``)."""

# ``ServerArgs.__post_init__`` returns before any resolution for these paths.
UNRESOLVED_MODEL_PATHS: Tuple[str, ...] = ("none", "dummy")

_TRUE = ("1", "true", "yes", "on")
_EXPLICIT_FALSE = ("0", "false", "no", "off")
_FALSE = ("",) + _EXPLICIT_FALSE


class VerifyGraphConfigError(ValueError):
    """A server setting that ``--enable-verify-cuda-graph`` cannot work with.

    Attributes:
        problem: what is wrong, e.g. ``"needs a linear draft chain"``.
        flag: the conflicting flag (``"--speculative-eagle-topk"``) or
            environment variable name.
        value: the offending value as given/resolved (any type, shown with ``str``).
        fix: what to do, e.g. ``"pass --speculative-eagle-topk 1"``.

    ``str(err)`` is one line:
    ``--enable-verify-cuda-graph: <problem> (<flag> = <value>). Fix: <fix>.``
    """

    def __init__(self, problem: str, flag: str, value: Any, fix: str):
        self.problem = _one_line(problem)
        self.flag = _one_line(flag)
        self.value = value
        self.fix = _one_line(fix).rstrip(".")
        super().__init__(
            f"{FLAG}: {self.problem} ({self.flag} = {_one_line(str(value))}). "
            f"Fix: {self.fix}."
        )

    def __reduce__(self):  # picklable across processes despite the custom __init__
        return (type(self), (self.problem, self.flag, self.value, self.fix))


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """The project's environment variables, parsed.

    Attributes:
        enable: :data:`ENV_ENABLE` is set to a true value.
        num_kv_splits: :data:`ENV_NUM_KV_SPLITS` (count of KV splits, >= 1), or
            ``None`` to let the runner choose.
        log_every: :data:`ENV_LOG_EVERY` (verify steps between counter log lines;
            0 = off).
        selftest: :data:`ENV_SELFTEST` is set to a true value.
        selftest_nan: :data:`ENV_SELFTEST_NAN` is set to a true value.
        sync_check: :data:`ENV_SYNC_CHECK` is set to a true value.
        profile_every: :data:`ENV_PROFILE_EVERY` (EAGLE cycles between per-phase profile log
            lines; 0 = profile off).
        enable_set_off: :data:`ENV_ENABLE` is set to an explicit false value (``0``/``false``/
            ``no``/``off``), not merely unset or empty: together with the command-line flag that is
            a conflict (``cli.from_cli_args_hook`` refuses it).
    """

    enable: bool = False
    num_kv_splits: Optional[int] = None
    log_every: int = 0
    selftest: bool = False
    profile_every: int = 0
    enable_set_off: bool = False
    selftest_nan: bool = False
    sync_check: bool = False


def _parse_bool(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise VerifyGraphConfigError(
        "unrecognised boolean environment value", name, repr(raw),
        f"set {name}=1 to enable or unset it",
    )


def _parse_int(
    environ: Mapping[str, str], name: str, minimum: int, default: Optional[int]
) -> Optional[int]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise VerifyGraphConfigError(
            f"environment value must be an integer >= {minimum}", name, repr(raw),
            f"set {name} to an integer >= {minimum} or unset it",
        )
    return value


def read_env(environ: Optional[Mapping[str, str]] = None) -> EnvSettings:
    """Read every environment variable of this project (the only place that does).

    Args:
        environ: mapping to read; defaults to ``os.environ`` (read at call time).

    Returns:
        The parsed :class:`EnvSettings`.

    Raises:
        VerifyGraphConfigError: a variable is malformed (non-boolean
            :data:`ENV_ENABLE`, non-integer or out-of-range
            :data:`ENV_NUM_KV_SPLITS` (< 1), :data:`ENV_LOG_EVERY` or
            :data:`ENV_PROFILE_EVERY` (< 0)).
            These variables belong to this plugin, so a typo fails loudly even
            while the flag is off.
    """
    if environ is None:
        environ = os.environ
    return EnvSettings(
        enable=_parse_bool(environ, ENV_ENABLE),
        num_kv_splits=_parse_int(environ, ENV_NUM_KV_SPLITS, 1, None),
        log_every=_parse_int(environ, ENV_LOG_EVERY, 0, 0),
        selftest=_parse_bool(environ, ENV_SELFTEST),
        profile_every=_parse_int(environ, ENV_PROFILE_EVERY, 0, 0),
        enable_set_off=environ.get(ENV_ENABLE, "").strip().lower() in _EXPLICIT_FALSE,
        selftest_nan=_parse_bool(environ, ENV_SELFTEST_NAN),
        sync_check=_parse_bool(environ, ENV_SYNC_CHECK),
    )


def is_enabled(server_args: Any, env: Optional[EnvSettings] = None) -> bool:
    """Whether ``--enable-verify-cuda-graph`` is on for these server args.

    Args:
        server_args: a ``ServerArgs`` (or duck-typed object); only
            :data:`ATTR_ENABLE` is read from it.
        env: parsed environment; ``None`` reads it with :func:`read_env`
            (only when the attribute is not already true).

    Returns:
        ``True`` if the attribute :data:`ATTR_ENABLE` is true or the
        environment flag :data:`ENV_ENABLE` is set.

    Raises:
        VerifyGraphConfigError: from :func:`read_env` on a malformed variable.
    """
    if getattr(server_args, ATTR_ENABLE, False):
        return True
    if env is None:
        env = read_env()
    return env.enable


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


def _check_algorithm(sa: Any) -> str:
    algo = getattr(sa, "speculative_algorithm", None)
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


def _check_steps(sa: Any) -> Tuple[int, int, int]:
    topk = getattr(sa, "speculative_eagle_topk", None)
    if topk != 1:
        raise VerifyGraphConfigError(
            "supports only a linear draft chain (top-k 1)", "--speculative-eagle-topk",
            topk, "pass --speculative-eagle-topk 1",
        )
    if getattr(sa, "speculative_adaptive", False):
        raise VerifyGraphConfigError(
            "does not support adaptive speculative decoding (it swaps the verify "
            "graph runner per step)", "--speculative-adaptive", True,
            "remove --speculative-adaptive",
        )
    steps = getattr(sa, "speculative_num_steps", None)
    if not isinstance(steps, int) or steps < 1:
        raise VerifyGraphConfigError(
            "needs at least one draft step", "--speculative-num-steps", steps,
            "pass --speculative-num-steps N with N >= 1 (e.g. 3)",
        )
    ndt = getattr(sa, "speculative_num_draft_tokens", None)
    if ndt != steps + 1:
        raise VerifyGraphConfigError(
            f"with top-k 1 the draft-token count must be num_steps + 1 = {steps + 1}",
            "--speculative-num-draft-tokens", ndt,
            f"pass --speculative-num-draft-tokens {steps + 1} or omit it",
        )
    return steps, topk, ndt


def _decode_graph_backend(sa: Any) -> Optional[str]:
    cfg = getattr(sa, "cuda_graph_config", None)
    decode = getattr(cfg, "decode", None)
    if decode is None and isinstance(cfg, Mapping):
        decode = cfg.get("decode")
    if isinstance(decode, Mapping):
        return decode.get("backend")
    return getattr(decode, "backend", None)


def _check_cuda_graph(sa: Any) -> Optional[str]:
    backend = _decode_graph_backend(sa)
    candidates = (
        ("--cuda-graph-backend-decode", getattr(sa, "cuda_graph_backend_decode", None) == "disabled",
         "disabled", "remove --cuda-graph-backend-decode disabled"),
        ("--disable-decode-cuda-graph", bool(getattr(sa, "disable_decode_cuda_graph", False)),
         True, "remove --disable-decode-cuda-graph"),
        ("--disable-cuda-graph", bool(getattr(sa, "disable_cuda_graph", False)),
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


def _check_parallel(sa: Any) -> None:
    dp = getattr(sa, "enable_dp_attention", False)
    # sglang 0.5.23 spells DP attention --attn-dp-size N (and resolves the deprecated
    # --enable-dp-attention into it); 0.5.16 has no such field.
    attn_dp = getattr(sa, "attn_dp_size", 1) or 1
    pp = getattr(sa, "pp_size", 1) or 1
    tbo = getattr(sa, "enable_two_batch_overlap", False)
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


def _check_kv_cache(sa: Any) -> None:
    """Settings the chain verify attention cannot serve, caught at launch (not in the scheduler)."""
    kv = str(getattr(sa, "kv_cache_dtype", "auto") or "auto")
    det = getattr(sa, "enable_deterministic_inference", False)
    page_major = getattr(sa, "enable_page_major_kv_layout", False)
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
    if not is_enabled(server_args, env):
        return None
    algo = _check_algorithm(server_args)
    steps, topk, ndt = _check_steps(server_args)
    from sglang_verify_graph.backends import check_attention, check_draft_backend, check_target

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
    )


def get_config(server_args: Any, env: Optional[EnvSettings] = None) -> Optional[VerifyGraphConfig]:
    """The config stored on ``server_args`` by the post-init hook, else :func:`build_config`.

    Args:
        server_args: ``ServerArgs`` (possibly unpickled in a scheduler process).
        env: parsed environment, used only when nothing is stored.

    Returns:
        The stored or freshly built :class:`VerifyGraphConfig`, or ``None`` when off.

    Raises:
        VerifyGraphConfigError: as :func:`build_config`, when it has to build.
    """
    stored = getattr(server_args, ATTR_CONFIG, None)
    if isinstance(stored, VerifyGraphConfig):
        return stored
    return build_config(server_args, env)
