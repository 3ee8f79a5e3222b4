"""Entry point of the ``sglang.srt.plugins`` group (``verify_cuda_graph``).

SGLang calls ``register()`` in every process that loads plugins (the HTTP main process before it
parses arguments, ``sglang.Engine``, every scheduler process). It registers the CLI hooks
everywhere and the runtime hooks where the flag is on (schedulers inherit
``SGLANG_ENABLE_VERIFY_CUDA_GRAPH=1`` from the launcher), applies them at once and checks that
each took effect. SGLang logs and swallows plugin exceptions, so a failed check when the flag is
requested ends the process with ``SystemExit`` and one clear line instead of silently serving
upstream's verify graph.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("sglang_verify_graph")


def register() -> None:
    """Register and verify the plugin's hooks (the per-phase profile hooks where
    ``SGLANG_VERIFY_GRAPH_PROFILE_EVERY`` > 0). Raises SystemExit(1) when the flag or the profile
    is requested (command line or environment) but a hook did not take effect. A malformed
    ``SGLANG_VERIFY_GRAPH_*`` variable installs the CLI hooks only, so that the server-args
    validation reports it (one line and exit 2 on the command line, ``VerifyGraphConfigError`` from
    ``sglang.Engine``)."""
    from sglang_verify_graph import sglang_adapter
    from sglang_verify_graph.config import FLAG, VerifyGraphConfigError, read_env

    try:
        env = read_env()
        enabled_here = env.enable
    except VerifyGraphConfigError as e:  # a malformed SGLANG_VERIFY_GRAPH_* variable
        # Install the CLI hooks only: the validation point (ServerArgs.__post_init__ /
        # resolve_once) reads the environment again and raises the same error, which the
        # command line turns into one line and exit 2 and sglang.Engine(...) raises as
        # VerifyGraphConfigError (a SystemExit here would end the user's program).
        logger.error("sglang_verify_graph: %s", e)
        missing = sglang_adapter.register(runtime=False)
        if missing:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        return
    profile_here = env.profile_every > 0
    missing = sglang_adapter.register(runtime=enabled_here, profile=profile_here,
                                      sync_check=env.sync_check)
    if not missing:
        logger.info("sglang_verify_graph: hooks installed (runtime=%s, profile=%s, sync_check=%s)",
                    enabled_here, profile_here, env.sync_check)
        return
    msg = (f"error: {FLAG}: the plugin could not hook into this SGLang version "
           f"(sglang {sglang_adapter.SGLANG_VERSION}; supported: "
           f"{', '.join(sglang_adapter.SUPPORTED_VERSIONS)}); not applied: {'; '.join(missing)}")
    if enabled_here or profile_here or env.sync_check or sglang_adapter.argv_requests_flag(FLAG):
        print(msg, file=sys.stderr, flush=True)
        raise SystemExit(1)
    logger.error(msg)
