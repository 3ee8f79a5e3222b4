"""``python -m bench models <builder> [args]``: write model folders for the lab.

    python -m bench models dummy OUT_DIR [--only llama-small,llama-8b,...]
        config-only pairs (target + EAGLE-3 draft) for ``--load-format dummy`` (bench.models.dummy_models)
    python -m bench models pair OUT_DIR [--agree 0.7] [--seed 0] [--attention] [--shape llama8b]
        a target + draft whose agreement is set by construction (bench.models.accept_pair);
        --prefix [--span N]: the prefix-reading pair (bench.models.accept_pair.prefix)
    python -m bench models coverage [--span 1024] [--reference 6] [--out F.json]
        the prefix pair's fault coverage, the simulator checked by the float reference
"""

from __future__ import annotations

import importlib
import sys

BUILDERS = {
    "dummy": ("bench.models.dummy_models", "config-only target + EAGLE-3 draft folders (dummy weights)"),
    "pair": ("bench.models.accept_pair.cli", "a target + EAGLE-3 draft with agreement set by construction"),
    "coverage": ("bench.models.accept_pair.coverage",
                 "the prefix pair's fault coverage, checked by the float reference"),
}
"""Builder -> (module with ``main(argv) -> int``, its one help line)."""


def main(argv=None) -> int:
    """Run the builder named by ``argv[0]`` with the rest; 0 for ``--help``, 2 for no or an
    unknown builder."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m bench models <builder> [args]\n\nbuilders:\n" + "\n".join(
        f"  {name:<8}  {text}" for name, (_, text) in BUILDERS.items())
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] not in BUILDERS:
        print(f"python -m bench models: unknown builder {argv[0]!r}\n\n{usage}", file=sys.stderr)
        return 2
    return importlib.import_module(BUILDERS[argv[0]][0]).main(argv[1:])
