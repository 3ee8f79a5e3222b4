"""Makes ``sglang serve --help`` list the plugin's flags.

SGLang's ``sglang serve`` prints its help before it loads plugins (``sglang/cli/serve.py``, 0.5.16
and 0.5.23), so the flags that ``plugin.register`` adds through the ``ServerArgs.add_cli_args``
hook would be missing there (``python -m sglang.launch_server --help`` loads plugins first and
lists them). The package installs ``sglang_verify_graph_serve_help.pth`` into site-packages; its
one line imports this module when the interpreter starts. In a process whose command line asks
``serve`` for help, :func:`install` adds an import finder that, once ``sglang.cli.serve`` is
imported, wraps its ``serve`` so that SGLang's plugins are loaded before the help is printed. In
every other process it reads ``sys.argv`` and does nothing else. Imports nothing at start-up but
the standard library.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys
from typing import Optional, Sequence

SERVE_MODULE = "sglang.cli.serve"
"""The module whose ``serve(args, extra_argv)`` prints ``sglang serve --help``."""


def is_serve_help(argv: Sequence[str]) -> bool:
    """Whether a command line (``sys.argv``) asks ``sglang serve`` for its help."""
    rest = list(argv[1:])
    return "serve" in rest and ("-h" in rest or "--help" in rest)


def wrap_serve(module) -> None:
    """Replace ``module.serve`` by a wrapper that loads SGLang's plugins first (idempotent:
    SGLang's ``load_plugins`` runs once per process)."""
    original = module.serve
    if getattr(original, "_loads_plugins_first", False):
        return

    @functools.wraps(original)
    def serve(args, extra_argv):
        from sglang_verify_graph.compat import sglang_adapter

        sglang_adapter.load_plugins()
        return original(args, extra_argv)

    serve._loads_plugins_first = True
    module.serve = serve


class ServeModuleFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the import of :data:`SERVE_MODULE` it removes itself from
    ``sys.meta_path``, lets the other finders find the module and runs :func:`wrap_serve` right
    after the module's code."""

    def find_spec(self, name, path=None, target=None):
        if name != SERVE_MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            wrap_serve(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


def install(argv: Optional[Sequence[str]] = None) -> bool:
    """Add :class:`ServeModuleFinder` when ``argv`` (default ``sys.argv``) asks ``serve`` for help
    and the module is not imported yet. Returns whether it was added."""
    argv = sys.argv if argv is None else argv
    if not is_serve_help(argv) or SERVE_MODULE in sys.modules:
        return False
    if not any(isinstance(f, ServeModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ServeModuleFinder())
    return True


try:  # the .pth line imports this module at interpreter start: never break a Python start
    install(getattr(sys, "argv", None) or [])
except Exception:  # pragma: no cover
    pass
