"""Installing our hooks while SGLang loads plugins keeps the hooks of plugins loaded after ours."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap




def _clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in ("SGLANG_ENABLE_VERIFY_CUDA_GRAPH", "SGLANG_PLUGINS")
            and not k.startswith("SGLANG_VERIFY_GRAPH_")}


_LATER_PLUGIN = textwrap.dedent("""
    import argparse
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang_verify_graph import plugin

    plugin.register()            # what load_plugins() runs for our entry point ...

    def later_plugin_flag(result, parser):   # ... then for a plugin after us in entry-point order
        parser.add_argument("--later-plugin-flag", action="store_true")

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args",
                          later_plugin_flag, HookType.AFTER)
    HookRegistry.apply_hooks()   # load_plugins() applies all hooks once, at the end

    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    print("LATER", "--later-plugin-flag" in parser._option_string_actions)
    print("OURS", "--enable-verify-cuda-graph" in parser._option_string_actions)
""")


def test_register_keeps_hooks_of_plugins_loaded_after_us():
    """``load_plugins()`` runs every plugin's ``register`` and calls ``HookRegistry.apply_hooks()``
    once at the end; ``apply_hooks`` skips targets already in ``_patched``. Our ``register`` calls
    ``apply_hooks()`` itself, so a plugin loaded after ours that hooks e.g.
    ``ServerArgs.add_cli_args`` (to add its own flag) would be silently ignored unless
    ``sglang_adapter.install_hooks`` hands the registry back empty after applying ours."""
    proc = subprocess.run([sys.executable, "-c", _LATER_PLUGIN], env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OURS True" in proc.stdout
    assert "LATER True" in proc.stdout, proc.stdout
