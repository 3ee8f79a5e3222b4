"""The dependency rules of the product package and the lab beside it: imports run one way (no
cycle, counting imports inside functions too), the bottom layer imports nothing from the
package, only the compat layer touches ``sglang.srt``, nothing imports the top module, the core
reaches the debug wing only through its probe factories, the lab (``bench``) may import the
product but never the reverse, and no module grows past the size a reader can hold."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_verify_graph"
LAB = ROOT / "bench"
NAME = "sglang_verify_graph"
BOTTOM = {"compat.sglang_adapter", "errors"}
SGLANG_SRT_ALLOWED = {"compat.sglang_adapter"}
TOP = "plugin"
DEBUG = "debug"
# The core modules that may reach the debug wing: the runner and the draft-extend policy, through
# the probe factories (the sync check's hooks are declared in the wing and imported by the table).
DEBUG_ENTRY = {"runner", "draft_extend"}
MAX_LINES = 400


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: pathlib.Path = PKG) -> dict[str, pathlib.Path]:
    """Dotted module name inside the package (``compat.sglang_adapter``; a package by its
    ``__init__``) -> file; ``__main__`` modules left out."""
    mods = {}
    for p in sorted(root.rglob("*.py")):
        if p.stem == "__main__" or "__pycache__" in p.parts:
            continue
        name = _module_name(p, root)
        if name:
            mods[name] = p
    return mods


def _imports(path: pathlib.Path, package: str = NAME, known: frozenset = frozenset()) -> tuple[set[str], set[str]]:
    """(package modules imported, other top-level dotted names imported) anywhere in the file.
    A ``from package.x import y`` counts ``x.y`` when that is a module of ``known``, else ``x``."""
    ours, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y / from . import x
                base = node.module.split(".")[0] if node.module else None
                ours.update([base] if base else [a.name for a in node.names])
                continue
            names = [node.module or ""]
            mod = node.module or ""
            if mod == package or mod.startswith(package + "."):
                sub = mod[len(package) + 1:]
                for a in node.names:
                    full = f"{sub}.{a.name}" if sub else a.name
                    ours.add(full if full in known or not sub else sub)
                continue
        else:
            continue
        for name in names:
            if name.startswith(package + "."):
                ours.add(name[len(package) + 1:])
            else:
                others.add(name)
    return ours, others


def _graph(root: pathlib.Path = PKG, package: str = NAME) -> dict[str, set[str]]:
    mods = _modules(root)
    known = frozenset(mods)
    return {m: {d for d in _imports(p, package, known)[0] if d in mods and d != m and not m.startswith(d + ".")}
            for m, p in mods.items()}


def find_cycle(graph: dict[str, set[str]]):
    """A list of modules forming an import cycle, or None (depth-first search)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_cycle_finder_sees_a_cycle_through_a_function_level_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_import_reader_counts_imports_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from sglang_verify_graph import runner\n"
                   "    from sglang_verify_graph.config import FLAG\n    from . import cli\n"
                   "    from sglang_verify_graph.compat import sglang_adapter as a\n"
                   "    import sglang_verify_graph.debug.selftest\n")
    assert _imports(src, known=frozenset({"compat.sglang_adapter"}))[0] == {
        "runner", "config", "cli", "compat.sglang_adapter", "debug.selftest"}


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_in_the_lab():
    cycle = find_cycle(_graph(LAB, "bench"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_bottom_layer_imports_nothing_from_the_package():
    graph = _graph()
    for m in BOTTOM:
        assert not graph[m], f"{m} imports {sorted(graph[m])}"


def test_only_the_compat_layer_touches_sglang_srt():
    for m, p in _modules().items():
        srt = sorted(n for n in _imports(p)[1] if n == "sglang.srt" or n.startswith("sglang.srt."))
        if m not in SGLANG_SRT_ALLOWED:
            assert not srt, f"{m} imports {srt}"


def test_nothing_imports_the_top_module():
    importers = sorted(m for m, deps in _graph().items() if TOP in deps)
    assert not importers


def test_the_core_reaches_the_debug_wing_only_through_its_entries():
    for m, deps in _graph().items():
        if m == DEBUG or m.startswith(DEBUG + ".") or m in DEBUG_ENTRY:
            continue
        reached = sorted(d for d in deps if d == DEBUG or d.startswith(DEBUG + "."))
        assert not reached, f"{m} imports the debug wing ({reached})"


def test_the_product_never_imports_the_lab():
    for m, p in _modules().items():
        lab = sorted(n for n in _imports(p)[1] if n == "bench" or n.startswith("bench."))
        assert not lab, f"{m} imports {lab}"


def test_the_wheel_holds_the_product_only(tmp_path):
    """Build the wheel (setuptools, offline) and list it: the package with its kernel, the
    ``.pth`` line and the metadata; no lab module, test or script."""
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"{NAME}/kernel/chain_verify_attention.py" in names
    assert f"{NAME}/advisor/__main__.py" in names
    stray = [n for n in names if not (n.startswith(NAME + "/") or ".dist-info/" in n
                                     or n == "sglang_verify_graph_serve_help.pth")]
    assert not stray, f"the wheel carries {stray}"


@pytest.mark.parametrize("module", sorted([f"{NAME}.{m}" for m in _modules()]
                                          + [f"bench.{m}" for m in _modules(LAB)]))
def test_module_size(module):
    pkg, _, name = module.partition(".")
    path = (_modules() if pkg == NAME else _modules(LAB))[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"
