"""The plugin's environment variables: names and the one parser, :func:`read_env` (all
environment reading of the project happens there). Imports nothing but ``errors``."""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

from sglang_verify_graph.errors import VerifyGraphConfigError

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

ENV_DRAFT_EXTEND = "SGLANG_VERIFY_GRAPH_DRAFT_EXTEND"
"""``chain`` (default) or ``upstream``: the attention of the draft's ``DRAFT_EXTEND_V2`` forward
with the flag on and a triton draft-extend backend: the split-KV chain kernel, or SGLang's own
``extend_attention_fwd`` (for A/B measurements)."""

DRAFT_EXTEND_CHOICES = ("chain", "upstream")

ENV_SYNC_CHECK = "SGLANG_VERIFY_GRAPH_SYNC_CHECK"
"""Boolean: count synchronizing CUDA calls inside each EAGLE verify step (``sync_check.py``;
tests only). Independent of :data:`ENV_ENABLE` (upstream's verify can be checked too)."""

ENV_TEST_FAULT = "SGLANG_VERIFY_GRAPH_TEST_FAULT"
"""Tests only: a name of :data:`TEST_FAULT_CHOICES` makes one launch of the chain attention compute
that wrong attention, so a server test can show the fault changes output tokens; unset or empty:
no fault. Each name applies to one launch (:data:`TEST_FAULT_LAUNCHES`), the other launch runs
unfaulted. Target verify (``TARGET_VERIFY``, the verify backend): ``causal_plus_one``,
``causal_minus_one``, ``drop_first_split``, ``middle_page_entry``, ``drop_middle_split`` (kernel
faults, ``sglang_verify_graph.kernel.chain_verify_attention`` states their arithmetic) and
``wrong_layer_kv`` (the backend reads layer ``layer_id - 1``'s K/V, layer 0 reads layer 1's;
``sglang_verify_graph.chain_backend``). Draft extend (``DRAFT_EXTEND_V2``, the draft-extend backend):
``draft_extend_causal_plus_one``, ``draft_extend_causal_minus_one``,
``draft_extend_drop_first_split`` (kernel faults)."""

TEST_FAULT_LAUNCHES = {
    "causal_plus_one": "verify", "causal_minus_one": "verify", "drop_first_split": "verify",
    "middle_page_entry": "verify", "drop_middle_split": "verify", "wrong_layer_kv": "verify",
    "draft_extend_causal_plus_one": "draft-extend", "draft_extend_causal_minus_one": "draft-extend",
    "draft_extend_drop_first_split": "draft-extend",
}
"""Test fault name -> the launch it applies to: ``"verify"`` or ``"draft-extend"`` (the ``role`` of
the chain backend that applies it)."""

TEST_FAULT_CHOICES = tuple(TEST_FAULT_LAUNCHES)

_TRUE = ("1", "true", "yes", "on")
_EXPLICIT_FALSE = ("0", "false", "no", "off")
_FALSE = ("",) + _EXPLICIT_FALSE


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
        draft_extend: :data:`ENV_DRAFT_EXTEND` (one of :data:`DRAFT_EXTEND_CHOICES`).
        test_fault: :data:`ENV_TEST_FAULT` (one of :data:`TEST_FAULT_CHOICES`), or ``None``.
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
    draft_extend: str = "chain"
    test_fault: Optional[str] = None


def _parse_choice(environ: Mapping[str, str], name: str, choices: tuple,
                  default: Optional[str]) -> Optional[str]:
    raw = environ.get(name, "")
    value = raw.strip().lower() or default
    if value is None:
        return None
    if value not in choices:
        raise VerifyGraphConfigError(
            f"environment value must be one of {', '.join(choices)}", name, repr(raw),
            f"set {name} to one of {', '.join(choices)} or unset it",
        )
    return value


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
            :data:`ENV_PROFILE_EVERY` (< 0), :data:`ENV_DRAFT_EXTEND` not one of
            :data:`DRAFT_EXTEND_CHOICES`, :data:`ENV_TEST_FAULT` not one of
            :data:`TEST_FAULT_CHOICES`).
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
        draft_extend=_parse_choice(environ, ENV_DRAFT_EXTEND, DRAFT_EXTEND_CHOICES, "chain"),
        test_fault=_parse_choice(environ, ENV_TEST_FAULT, TEST_FAULT_CHOICES, None),
    )
