"""The package's dependency rules: imports run one way (no cycle, counting imports inside
functions too), the bottom layer imports nothing from the package, only the adapter touches
``sglang.srt``, nothing imports the top module, and no module grows past the size a reader can
hold."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_verify_graph"
NAME = "sglang_verify_graph"
BOTTOM = {"sglang_adapter", "errors"}
SGLANG_SRT_ALLOWED = {"sglang_adapter"}
TOP = "plugin"
MAX_LINES = 400


def _modules() -> dict[str, pathlib.Path]:
    return {p.stem: p for p in sorted(PKG.glob("*.py")) if p.stem != "__init__"}


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(package modules imported, other top-level dotted names imported) anywhere in the file."""
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
            if node.module == NAME:
                ours.update(a.name for a in node.names)
                continue
        else:
            continue
        for name in names:
            if name.startswith(NAME + "."):
                ours.add(name.split(".")[1])
            else:
                others.add(name)
    return ours, others


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {d for d in _imports(p)[0] if d in mods and d != m} for m, p in mods.items()}


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
                   "    from sglang_verify_graph.config import FLAG\n    from . import cli\n")
    assert _imports(src)[0] == {"runner", "config", "cli"}


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_bottom_layer_imports_nothing_from_the_package():
    graph = _graph()
    for m in BOTTOM:
        assert not graph[m], f"{m} imports {sorted(graph[m])}"


def test_only_the_adapter_touches_sglang_srt():
    for m, p in _modules().items():
        srt = sorted(n for n in _imports(p)[1] if n == "sglang.srt" or n.startswith("sglang.srt."))
        if m not in SGLANG_SRT_ALLOWED:
            assert not srt, f"{m} imports {srt}"


def test_nothing_imports_the_top_module():
    importers = sorted(m for m, deps in _graph().items() if TOP in deps)
    assert not importers


@pytest.mark.parametrize("module", sorted(_modules()))
def test_module_size(module):
    lines = len(_modules()[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}.py has {lines} lines (at most {MAX_LINES})"
