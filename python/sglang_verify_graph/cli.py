"""Command-line hooks for ``--enable-verify-cuda-graph`` (group ``cli`` of the hook table,
``hooks.py``, each declared next to its body below).

The flag travels one way: the command line (or ``--config`` YAML, or the user's environment)
-> ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` in ``os.environ`` (:func:`from_cli_args_hook`, before
``ServerArgs`` is built, so the scheduler processes inherit it) -> ``env.read_env`` -> the config
(``config.build_config``) -> the model runner's plan (``plan.verify_plan``).

:func:`validate_hook`, AFTER the validation point (``ServerArgs.__post_init__`` before 0.5.19,
``ServerArgs.resolve_once`` from 0.5.19: where that SGLang version resolves the server arguments),
is the single validation for both the CLI (``python -m sglang.launch_server ...
--enable-verify-cuda-graph``) and the Python API (``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` +
``sglang.Engine(**kwargs)``); :func:`check_given_hook`, BEFORE it, checks the values as given, so
the one line comes first on a machine where SGLang's resolution would fail. From 0.5.19 validation
reads the resolved view (``sglang_adapter.resolved``), since the record's fields keep the raw input.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Optional

from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.config import (
    ENV_ENABLE,
    ENV_PROFILE_EVERY,
    FLAG,
    UNRESOLVED_MODEL_PATHS,
    VerifyGraphConfigError,
    build_config,
    check_given,
    read_env,
)
from sglang_verify_graph.hooks import hook

DEST = "enable_verify_cuda_graph"
"""``argparse`` destination of :data:`~sglang_verify_graph.config.FLAG`."""

ATTR_FROM_CLI = "_verify_cuda_graph_from_cli"
"""0.5.19 on: underscore attribute marking a record built by ``from_cli_args`` while the feature was
requested, so the later validation (``resolve_once``) ends the launcher with one line."""


PROFILE_FLAG = "--verify-graph-profile-every"
"""Per-phase profile of EAGLE cycles: cycles between log lines (0 / absent = off)."""

PROFILE_DEST = "verify_graph_profile_every"
"""``argparse`` destination of :data:`PROFILE_FLAG`."""

PROFILE_HELP = (
    "Per-phase profile of EAGLE decode cycles (draft, target verify, draft-extend, other), "
    "timed with CUDA events read back without synchronizing: every N cycles each scheduler "
    "rank logs one 'verify_graph_profile ...' line (readable by python -m "
    "sglang_verify_graph.advisor --from-log) and, with --enable-metrics, exports "
    "sglang_verify_graph_* Prometheus metrics. 0 = off (the default, unless "
    f"{ENV_PROFILE_EVERY} is set; a different value there is an error). Works with or without "
    f"{FLAG}. Python API: set {ENV_PROFILE_EVERY}=N before sglang.Engine(...)."
)


def profile_every_value(text: str) -> int:
    """argparse ``type=`` of :data:`PROFILE_FLAG`: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


HELP = (
    "Replay the EAGLE-3 target verify of a linear draft chain through a dedicated "
    "CUDA graph with split-KV chain attention. Requires --speculative-algorithm "
    "EAGLE3 (or EAGLE) with --speculative-eagle-topk 1, --attention-backend triton "
    "(the split-KV chain kernel; fa3, and flashmla / flashinfer on MLA targets, keep their own "
    "verify kernels) and decode CUDA graphs enabled; not yet supported with DP attention, pipeline "
    "parallelism, two-batch overlap or --speculative-adaptive. Python API: set "
    f"{ENV_ENABLE}=1 before sglang.Engine(...)."
)


@hook("cli", adapter.ADD_CLI_ARGS, adapter.HookType.AFTER)
def add_cli_args_hook(result: Any, parser: argparse.ArgumentParser) -> None:
    """AFTER hook on the staticmethod ``ServerArgs.add_cli_args(parser)``.

    Adds ``--enable-verify-cuda-graph`` (``store_true``, dest
    :data:`DEST`) and ``--verify-graph-profile-every N`` (int >= 0, dest
    :data:`PROFILE_DEST`) to ``parser``. Idempotent: an option the parser already
    has is not added again.

    Args:
        result: the original's return value (``None``), ignored.
        parser: the ``argparse.ArgumentParser`` sglang filled.

    Returns:
        ``None`` (keeps the original's result).
    """
    actions = getattr(parser, "_option_string_actions", {})
    if FLAG not in actions:
        parser.add_argument(FLAG, dest=DEST, action="store_true", default=False, help=HELP)
    if PROFILE_FLAG not in actions:
        parser.add_argument(PROFILE_FLAG, dest=PROFILE_DEST, type=profile_every_value,
                            default=None, metavar="N", help=PROFILE_HELP)
    return None


@hook("cli", adapter.FROM_CLI_ARGS, adapter.HookType.AROUND)
def from_cli_args_hook(original: Callable[..., Any], cls: type, args: argparse.Namespace) -> Any:
    """AROUND hook on the classmethod ``ServerArgs.from_cli_args(cls, args)``.

    When ``args.enable_verify_cuda_graph`` is set, exports
    ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` into ``os.environ`` *before* building
    the ``ServerArgs`` (so :func:`validate_hook` validates it and the spawned
    scheduler processes inherit it), likewise ``SGLANG_VERIFY_GRAPH_PROFILE_EVERY=N``
    for ``--verify-graph-profile-every N`` (N >= 0; 0 = off; a different value already in the
    environment is a conflict), then builds it with ``original(cls, args)``.

    Args:
        original: the unwrapped ``from_cli_args`` function.
        cls: the ``ServerArgs`` class.
        args: the parsed ``argparse.Namespace``.

    From sglang 0.5.19 ``original`` returns an *unresolved* record, so nothing is
    validated here; the record is marked (:data:`ATTR_FROM_CLI`) and
    :func:`validate_hook` validates it once SGLang resolves it.

    Returns:
        The ``ServerArgs`` built by ``original``.

    Raises:
        SystemExit: code 2 after printing one line ``error: <message>`` to
            stderr when a :class:`~sglang_verify_graph.config.VerifyGraphConfigError`
            escapes (no traceback), including the flag given while
            ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH`` is set to an explicit false value (``0``, ``false``,
            ``no``, ``off``): two sources that disagree, so neither silently wins.
    """
    requested = bool(getattr(args, DEST, False))
    profile_every = getattr(args, PROFILE_DEST, None)  # None: not given on the command line
    try:
        if requested and read_env().enable_set_off:
            raise VerifyGraphConfigError(
                f"is given on the command line (or config file) while the environment turns it "
                f"off", ENV_ENABLE, os.environ.get(ENV_ENABLE, ""),
                f"unset {ENV_ENABLE} or remove {FLAG}")
        if requested:
            os.environ[ENV_ENABLE] = "1"
        if profile_every is not None:
            env_every = read_env().profile_every if os.environ.get(ENV_PROFILE_EVERY, "").strip() else None
            if env_every is not None and env_every != profile_every:
                raise VerifyGraphConfigError(
                    f"the profile interval is {profile_every} on the command line but {env_every} "
                    f"in {ENV_PROFILE_EVERY}", PROFILE_FLAG, profile_every,
                    f"unset {ENV_PROFILE_EVERY} or pass {PROFILE_FLAG} {env_every}")
            # Like the flag: the scheduler processes inherit the variable (config.read_env).
            os.environ[ENV_PROFILE_EVERY] = str(int(profile_every))
        server_args = original(cls, args)
        if requested and adapter.VALIDATES_AT_CONSTRUCTION:
            _validate(server_args)  # here too, in case no validation hook is installed
        if not adapter.VALIDATES_AT_CONSTRUCTION:
            # 0.5.19 on: the record is still unresolved; the validation hooks judge it later (a
            # malformed SGLANG_VERIFY_GRAPH_* variable too, flag or not) and end in one line.
            setattr(server_args, ATTR_FROM_CLI, True)
    except VerifyGraphConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return server_args


def _validate(server_args: Any) -> None:
    """``config.build_config`` on the resolved server args (placeholder objects, ``model_path``
    ``"dummy"``/``"none"``, which SGLang leaves unresolved, are skipped). Raises
    VerifyGraphConfigError when the feature is on and a setting conflicts with it, or a
    ``SGLANG_VERIFY_GRAPH_*`` variable is malformed."""
    model_path = getattr(server_args, "model_path", None)
    if isinstance(model_path, str) and model_path.lower() in UNRESOLVED_MODEL_PATHS:
        return
    build_config(adapter.resolved(server_args))


@hook("cli", adapter.VALIDATION_POINT, adapter.HookType.BEFORE)
def check_given_hook(server_args: Any, *args, **kwargs) -> None:
    """BEFORE hook on the validation point (``ServerArgs.__post_init__`` before 0.5.19,
    ``ServerArgs.resolve_once`` from 0.5.19): :func:`~sglang_verify_graph.config.check_given` on the
    values as given, before SGLang's resolution (which needs an accelerator) can fail first.

    Raises:
        SystemExit: code 2 after one line ``error: <message>`` on stderr when a 0.5.19+ record was
            built from the command line (:data:`ATTR_FROM_CLI`; before 0.5.19 ``from_cli_args_hook``
            turns the error into that line).
        VerifyGraphConfigError: otherwise, on a conflicting given setting.
    """
    model_path = getattr(server_args, "model_path", None)
    if isinstance(model_path, str) and model_path.lower() in UNRESOLVED_MODEL_PATHS:
        return None
    _exit_if_from_cli(server_args, check_given, server_args)
    return None


def _exit_if_from_cli(server_args: Any, check: Callable, *args) -> None:
    """``check(*args)``; a VerifyGraphConfigError becomes one ``error:`` line and exit 2 for a
    record built from the command line (:data:`ATTR_FROM_CLI`), else propagates."""
    try:
        check(*args)
    except VerifyGraphConfigError as err:
        if getattr(server_args, ATTR_FROM_CLI, False):
            print(f"error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        raise


@hook("cli", adapter.VALIDATION_POINT, adapter.HookType.AFTER)
def validate_hook(result: Any, server_args: Any) -> None:
    """AFTER hook on the validation point (``ServerArgs.__post_init__(self)`` before 0.5.19,
    ``ServerArgs.resolve_once(self)`` from 0.5.19, which the launcher, ``sglang.Engine`` and, as a
    no-op, every scheduler process call): validate the resolved server args when the feature is
    on; nothing when it is off.

    Returns:
        ``None`` (keeps the original's result).

    Raises:
        SystemExit: code 2 after one line ``error: <message>`` on stderr when a 0.5.19+ record was
            built from the command line (:data:`ATTR_FROM_CLI`).
        VerifyGraphConfigError: otherwise (before 0.5.19 ``from_cli_args_hook`` turns it into that
            line; ``sglang.Engine(**kwargs)`` raises it from the constructor).
    """
    _exit_if_from_cli(server_args, _validate, server_args)
    return None


CONFIG_KEY = FLAG[2:]
"""The flag as a key of an SGLang ``--config`` YAML file (``enable-verify-cuda-graph``)."""

MIN_FLAG_PREFIX = len("--enable-v")
"""The shortest abbreviation of the flag argparse accepts (no SGLang option starts with it)."""

MIN_PROFILE_FLAG_PREFIX = len("--verify-g")
"""The shortest abbreviation of :data:`PROFILE_FLAG` argparse accepts."""


def config_file_path(cli_args: list) -> Optional[str]:
    """The path after ``--config`` in ``cli_args`` (a list of str), or ``None``."""
    if "--config" in cli_args:
        i = cli_args.index("--config")
        if i + 1 < len(cli_args):
            return cli_args[i + 1]
    return None


def gives_option(cli_args: list, option: str, min_prefix: int) -> bool:
    """Whether ``cli_args`` (list of str) gives the long ``option``: spelled out, as
    ``option=value``, or abbreviated as argparse accepts it (a prefix of at least ``min_prefix``
    characters)."""
    for arg in cli_args:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and len(name) >= min_prefix and option.startswith(name):
            return True
    return False


def cli_gives_flag(cli_args: list) -> bool:
    """Whether ``cli_args`` (list of str) holds the flag, spelled out or abbreviated as argparse
    allows (e.g. ``--enable-verify-cuda``)."""
    return gives_option(cli_args, FLAG, MIN_FLAG_PREFIX)


def check_flag_sources(cli_args: list, config: Any, config_path: str = "config file",
                       env_on: bool = False) -> None:
    """Refuse ``--enable-verify-cuda-graph`` given with conflicting values by a ``--config`` YAML
    file and the command line or the environment.

    SGLang's merger turns a YAML ``true`` of a ``store_true`` flag into the flag and silently
    drops a ``false`` (its precedence is command line > config file); it passes keys through as
    written, so ``enable_verify_cuda_graph:`` becomes ``--enable_verify_cuda_graph``, and a string
    such as ``"true"`` becomes ``--enable-verify-cuda-graph true``: argparse rejects both with a
    usage error that names no fix. So a config file that says ``false`` while the command line
    (``cli_gives_flag``) or the environment (``env_on``) turns the feature on, a value that is not
    a YAML boolean, or the underscore spelling stops the launch instead.

    Args:
        cli_args: the command-line arguments (list of str) before SGLang merged the file in.
        config: the parsed YAML document (a mapping; anything else is left to SGLang).
        config_path: the file's path, for the message.
        env_on: ``SGLANG_ENABLE_VERIFY_CUDA_GRAPH`` is set to a true value.

    Raises:
        VerifyGraphConfigError: on any of the cases above.
    """
    if not isinstance(config, dict):
        return
    if DEST in config:
        raise VerifyGraphConfigError(
            "SGLang passes config-file keys through as written, and argparse knows only the "
            "hyphenated flag", f"{DEST} in {config_path}", config[DEST],
            f"write '{CONFIG_KEY}: true' (or false) in {config_path}")
    if CONFIG_KEY not in config:
        return
    value = config[CONFIG_KEY]
    where = f"{CONFIG_KEY} in {config_path}"
    if not isinstance(value, bool):
        raise VerifyGraphConfigError(
            "a config file must give the flag as a YAML boolean", where, repr(value),
            f"write '{CONFIG_KEY}: true' (or false) in {config_path}")
    if not value and cli_gives_flag(cli_args):
        raise VerifyGraphConfigError(
            "is given on the command line but set to false in the config file", where,
            value, f"remove {FLAG} from the command line or set '{CONFIG_KEY}: true' in "
            f"{config_path}")
    if not value and env_on:
        raise VerifyGraphConfigError(
            f"is turned on by {ENV_ENABLE} but set to false in the config file", where, value,
            f"unset {ENV_ENABLE} or set '{CONFIG_KEY}: true' in {config_path}")


@hook("cli", adapter.CONFIG_MERGER, adapter.HookType.AROUND)
def merge_config_hook(original: Callable[..., Any], merger: Any, cli_args: list) -> Any:
    """AROUND hook on ``ConfigArgumentMerger.merge_config_with_args(self, cli_args)`` (SGLang's
    ``--config`` YAML support): after SGLang merged (and validated) the file, run
    :func:`check_flag_sources` on it.

    Returns:
        The merged argument list (list of str), unchanged.

    Raises:
        SystemExit: code 2 after one line ``error: <message>`` on stderr on a conflict.
    """
    merged = original(merger, cli_args)
    path = config_file_path(list(cli_args))
    if path is not None:
        import yaml  # an SGLang dependency; the original has just parsed this file with it

        with open(path) as f:
            config = yaml.safe_load(f)
        try:
            check_flag_sources(list(cli_args), config, path, env_on=read_env().enable)
        except VerifyGraphConfigError as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
    return merged
