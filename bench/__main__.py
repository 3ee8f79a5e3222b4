"""``python -m bench <command> [args]``: the lab's one entry point.

Each command is a module with ``main(argv) -> int``, imported only when it runs (a command's
heavy imports, torch or SGLang, cost nothing to the others; a missing module is one error line).
``python -m bench <command> --help`` gives the command's own flags, the same as its old script's.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "verify": ("bench.verify.cli", "per-step GPU time of the verify: ours vs upstream vs plain decode"),
    "merge": ("bench.verify.merge", "one verify table and --out JSON from earlier runs' JSON files and logs"),
    "speedup": ("bench.speedup.cli", "measured EAGLE-3 speed-up at set accept lengths (attention pair)"),
    "capture": ("bench.capture", "graph-capture time and memory per mode over repeated engine starts"),
    "kernel": ("bench.kernel.cli", "attention-op benchmark: the chain kernel vs SGLang's triton kernels"),
    "parts": ("bench.parts", "the verify step's parts timed one by one (attention, MoE, dense ops)"),
    "demo": ("bench.demo.cli", "plain, upstream and ours on three stock servers: one table, checks"),
    "models": ("bench.models.cli", "write model folders: dummy pairs, accept pairs (dummy, pair)"),
    "report": ("bench.report", "render the results"),
}
"""Command -> (module with ``main(argv) -> int``, the one line ``--help`` shows)."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m bench <command> [args]   (python -m bench <command> --help)", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run ``argv[0]``'s module ``main(argv[1:])``; 0 for ``--help``, 2 for no or an unknown
    command, 1 when the command's module cannot be imported (one line naming it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"python -m bench: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as ex:
        if ex.name and (module == ex.name or module.startswith(ex.name + ".")):
            print(f"python -m bench {name}: its module {module} is not in this checkout", file=sys.stderr)
            return 1
        raise
    return mod.main(rest)


if __name__ == "__main__":
    sys.exit(main())
