#!/usr/bin/env python3
"""Write the patch series that integrates the verify CUDA graph natively into an SGLang checkout.

Usage:
    python scripts/make_upstream_patch.py SGLANG_SRC [--out DIR]

``SGLANG_SRC`` is an SGLang source tree of the pinned version (sglang 0.5.16): either the
``sglang`` package directory (e.g. a copy of ``site-packages/sglang``; patch paths are then
``sglang/...``) or a git checkout's root or its ``python/`` folder (patch paths
``python/sglang/...``). The series (``git format-patch``-style files, ``NNNN-*.patch``, plus
``series``) is written to ``DIR`` (default ``out/upstream_patch``); apply it from the root with
``git apply DIR/*.patch``, ``git am DIR/*.patch`` or ``patch -p1 < DIR/NNNN-*.patch`` in order.

What the series does (docs/upstream_pr.md describes the change):

1. the chain verify attention kernel as ``sglang/kernels/ops/attention/chain_verify.py``;
2. the flag and its validation: ``ServerArgs.enable_verify_cuda_graph`` (``--enable-verify-cuda-graph``)
   validated at the end of ``__post_init__`` by ``sglang/srt/speculative/verify_graph_config.py``
   (with ``verify_graph_errors.py``, ``verify_graph_env.py`` and ``verify_graph_backends.py``);
3. the SGLang accessors ``sglang/srt/model_executor/runner/verify_graph_utils.py``, the attention
   backend ``sglang/srt/layers/attention/chain_verify_backend.py`` and its selection in the
   ``triton`` attention-registry factory;
4. the runner ``sglang/srt/model_executor/runner/verify_cuda_graph_runner.py`` (with its counters,
   static-buffer contract, self-test) and its capture ``verify_graph_capture.py``, selected in
   ``cuda_graph_setup.capture_decode_graph``; every TARGET_VERIFY that does not replay the graph
   counted in ``ModelRunner._forward_raw``; the counters in ``Scheduler.get_internal_state``;
5. the QLEN_ONLY tree mask in ``build_eagle_verify_input``;
6. the chain attention for the draft's ``DRAFT_EXTEND_V2``: ``ChainDraftExtendTritonBackend``
   chosen in ``DraftBackendFactory.create_draft_extend_backend``, its graph replays counted at
   the call in ``EAGLEWorkerV2._draft_extend_for_decode`` (eager ones in ``_forward_raw``).

The new modules are this repository's modules with their imports rewritten to native names
(``verify_graph_utils`` is the 0.5.16 branch of ``sglang_adapter.py``: the definitions the other
modules call as ``adapter.<name>``, extracted from it by AST); the edits to existing SGLang files
are generated against the given tree, each anchored on stable lines of the pinned version: a
missing anchor stops the script with the file and the anchor it looked for.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "python" / "sglang_verify_graph"
KERNEL = ROOT / "sgl-kernel" / "sglang_verify_graph.kernel"
AUTHOR = "sglang-verify-graph <sglang-verify-graph@users.noreply.github.com>"
DATE = "Sat, 29 Nov 2026 00:00:00 +0000"
TOTAL = 6

# plugin module -> native module (dotted, under the ``sglang`` package)
NATIVE = {
    "sglang_verify_graph.kernel": "sglang.kernels.ops.attention.chain_verify",
    "sglang_verify_graph.errors": "sglang.srt.speculative.verify_graph_errors",
    "sglang_verify_graph.env": "sglang.srt.speculative.verify_graph_env",
    "sglang_verify_graph.config": "sglang.srt.speculative.verify_graph_config",
    "sglang_verify_graph.backends": "sglang.srt.speculative.verify_graph_backends",
    "sglang_verify_graph.chain_backend": "sglang.srt.layers.attention.chain_verify_backend",
    "sglang_verify_graph.runner": "sglang.srt.model_executor.runner.verify_cuda_graph_runner",
    "sglang_verify_graph.counters": "sglang.srt.model_executor.runner.verify_graph_counters",
    "sglang_verify_graph.buffers": "sglang.srt.model_executor.runner.verify_graph_buffers",
    "sglang_verify_graph.debug.selftest": "sglang.srt.model_executor.runner.verify_graph_selftest",
    "sglang_verify_graph.capture": "sglang.srt.model_executor.runner.verify_graph_capture",
    "sglang_verify_graph.compat.sglang_adapter": "sglang.srt.model_executor.runner.verify_graph_utils",
}

# Mentions of the plugin's own machinery in docstrings and comments -> their native counterparts.
PROSE = (
    ("``sglang_adapter.resolved``", "the adapter's resolved view"),
    ("``sglang_adapter``", "``verify_graph_utils``"),
    ("The command-line flag this plugin adds to SGLang's server arguments",
     "The command-line flag that enables the verify graph"),
    ("The plugin's flag", "The flag"),
    ("The plugin's environment variables", "The verify graph's environment variables"),
    ("belong to this plugin", "belong to this feature"),
    ("(``cli.from_cli_args_hook`` refuses it)", "(refused at launch)"),
    ("``plugin.forward_raw_hook``", "``ModelRunner._forward_raw``"),
    ("(see plugin.build_verify_input_hook)", "(see build_eagle_verify_input)"),
    ("see ``plugin.triton_factory``", "see ``create_triton_backend``"),
    ("TARGET_VERIFY the plugin replaces", "TARGET_VERIFY the verify graph replaces"),
    ("TARGET_VERIFY the plugin's graph replays", "TARGET_VERIFY the verify graph replays"),
    ("``backends.py``", "``verify_graph_backends``"),
    ("Policy for the hooks of ``plugin.py``", "Policy for ``capture_decode_graph``"),
    ("(``sgl-kernel/sglang_verify_graph.kernel``)", "(``sglang.kernels.ops.attention.chain_verify``)"),
    ("``sglang_verify_graph.kernel``", "``chain_verify``"),
    ("sglang_verify_graph.kernel.workspace_numel", "chain_verify.workspace_numel"),
)


class AnchorError(RuntimeError):
    pass


def native_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def rewrite_imports(text: str) -> str:
    """Plugin package names -> native module names (imports, docstrings, logger names)."""
    text = text.replace('logging.getLogger("sglang_verify_graph")', "logging.getLogger(__name__)")
    for old, new in PROSE:
        text = text.replace(old, new)
    for plugin in NATIVE:
        if plugin.startswith("sglang_verify_graph."):
            short = plugin.rpartition(".")[2]
            parent, _, leaf = NATIVE[plugin].rpartition(".")
            text = re.sub(rf"from sglang_verify_graph import {short}\b", f"from {parent} import {leaf}", text)
    for plugin in sorted(NATIVE, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(plugin)}(\.chain_verify_attention)?\b", NATIVE[plugin], text)
    return text


def check_native(name: str, text: str) -> None:
    """No import of the plugin packages may survive the rewrite."""
    for node in ast.walk(ast.parse(text, filename=name)):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module]
        for mod in mods:
            if mod.split(".")[0] in ("sglang_verify_graph", "sglang_verify_graph.kernel"):
                raise AnchorError(f"{name}: import of {mod} survived the rewrite")


def plugin_module(src: Path, native: str, extra=None) -> tuple[str, str]:
    text = rewrite_imports(src.read_text())
    if extra:
        text = extra(text)
    check_native(native, text)
    return native_path(native), text


def _replace_line(text: str, old: str, new: str, module: str) -> str:
    if old not in text:
        raise AnchorError(f"{module}: expected line {old!r}")
    return text.replace(old, new)


def _native_config(text: str) -> str:
    # Native: a real ServerArgs field instead of the plugin's underscore attribute.
    return _replace_line(text, 'ATTR_ENABLE = "_enable_verify_cuda_graph"',
                         'ATTR_ENABLE = "enable_verify_cuda_graph"', "verify_graph_config")


def _name_triton_backend(text: str, line: str, module: str) -> str:
    """``text`` with ``line``'s ``adapter.triton_attn_backend_cls()`` replaced by SGLang's
    ``TritonAttnBackend`` (natively the class is imported, not looked up), and that import."""
    text = _replace_line(text, line, line.replace("adapter.triton_attn_backend_cls()", "TritonAttnBackend"), module)
    return _add_import(text, "from sglang.srt.layers.attention.triton_backend import TritonAttnBackend")


def _native_backend(text: str) -> str:
    return _name_triton_backend(text, "class _ChainTritonBackend(adapter.triton_attn_backend_cls()):",
                                "chain_verify_backend")


def _native_runner(text: str) -> str:
    text = _replace_line(text, "class VerifyCudaGraphRunner(adapter.decode_cuda_graph_runner_cls()):",
                         "class VerifyCudaGraphRunner(DecodeCudaGraphRunner):", "verify_cuda_graph_runner")
    return _add_import(text, "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner")


def _native_capture(text: str) -> str:
    # Natively SGLang 0.5.16 builds the runner in capture_decode_graph: the constructor class of
    # later releases (``cls(model_runner)``) has no caller.
    text = drop_definitions(text, "verify_graph_capture", "VerifyCudaGraphRunnerFromModelRunner")
    return _name_triton_backend(text, "    if type(backend) is not adapter.triton_attn_backend_cls():",
                                "verify_graph_capture")


def _add_import(text: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.startswith(("from ", "import ")))
    if lines[last].rstrip().endswith("("):
        while lines[last].strip() != ")":  # the end of a parenthesised import
            last += 1
    lines.insert(last + 1, line + "\n")
    return "".join(lines)


def _top_level(tree: ast.Module) -> dict[str, tuple[ast.stmt, ast.stmt]]:
    """Top-level functions and assignments: name -> (first node, last node), the last being the
    string statement that documents an assignment, when there is one."""
    out, body = {}, tree.body
    for i, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = (node, node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = nxt if (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                          and isinstance(nxt.value.value, str)) else node
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = (node, doc)
    return out


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def drop_definitions(text: str, module: str, *names: str) -> str:
    """``text`` without the named top-level definitions (decorators and the blank lines after
    each included)."""
    defs = _top_level(ast.parse(text))
    missing = [n for n in names if n not in defs]
    if missing:
        raise AnchorError(f"{module}: definitions {missing} not found")
    lines = text.splitlines(keepends=True)
    for first, last in sorted((defs[n] for n in names), key=lambda fl: -fl[0].lineno):
        start, end = _first_line(first) - 1, last.end_lineno
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[start:end]
    return "".join(lines).rstrip("\n") + "\n"


# ---- verify_graph_utils: the adapter's 0.5.16 branch -----------------------------------------
ADAPTER = PLUGIN / "sglang_adapter.py"


def version_flags() -> frozenset:
    """The adapter's API change points: its top-level names assigned ``_since("<release>")``, each
    True from that release on, so False for the series' 0.5.16."""
    flags = set()
    for node in ast.parse(ADAPTER.read_text()).body:
        value = getattr(node, "value", None)
        if (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name) and value.func.id == "_since"):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flags |= {t.id for t in targets if isinstance(t, ast.Name)}
    return frozenset(flags)


VERSION_FLAGS = version_flags()
"""Read as False when the adapter is folded to its 0.5.16 branch (:func:`fold_version_flag`)."""

UTILS_HEAD = '''"""SGLang accessors of the topk=1 EAGLE verify CUDA graph (``--enable-verify-cuda-graph``): the
small reads of SGLang objects that the verify graph's modules share, which they import as
``from sglang.srt.model_executor.runner import verify_graph_utils as adapter`` and call as
``adapter.<name>``."""

from __future__ import annotations
'''


def _offset(lines: list[bytes], lineno: int, col: int) -> int:
    return sum(len(ln) for ln in lines[:lineno - 1]) + col


def fold_version_flag(src: str, where: str) -> str:
    """``src`` (one top-level definition of ``sglang_adapter.py``) with every name of
    :data:`VERSION_FLAGS` read as False: ``if FLAG:`` blocks without ``else`` dropped,
    ``A if FLAG else B`` -> ``B``, ``not FLAG`` -> ``True``. Any other use of a flag stops the
    script."""
    raw = src.encode()
    lines = raw.splitlines(keepends=True)
    edits = []  # (start, end, replacement) byte offsets

    def is_flag(node) -> bool:
        return isinstance(node, ast.Name) and node.id in VERSION_FLAGS

    tree = ast.parse(src)
    handled = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and is_flag(node.test) and not node.orelse:
            start = _offset(lines, node.lineno, 0)
            end = _offset(lines, node.end_lineno + 1, 0)
            edits.append((start, end, b""))
            handled |= {id(n) for n in ast.walk(node)}
        elif isinstance(node, ast.IfExp) and is_flag(node.test):
            edits.append((_offset(lines, node.lineno, node.col_offset),
                          _offset(lines, node.end_lineno, node.end_col_offset),
                          ast.get_source_segment(src, node.orelse).encode()))
            handled |= {id(n) for n in ast.walk(node.test)} | {id(n) for n in ast.walk(node.body)}
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and is_flag(node.operand):
            edits.append((_offset(lines, node.lineno, node.col_offset),
                          _offset(lines, node.end_lineno, node.end_col_offset), b"True"))
            handled.add(id(node.operand))
    if any(is_flag(n) and id(n) not in handled for n in ast.walk(tree)):
        raise AnchorError(f"sglang_adapter.py: {where} reads a change point in a way the native "
                          "rewrite does not fold (if-without-else, conditional expression, not)")
    for start, end, new in sorted(edits, reverse=True):
        raw = raw[:start] + new + raw[end:]
    return raw.decode()


def _free_names(src: str) -> set[str]:
    tree = ast.parse(src)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef):
            bound.add(node.name)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - bound - set(dir(builtins))


def build_utils(used: set[str]) -> str:
    """``verify_graph_utils``: the definitions of ``sglang_adapter.py`` named in ``used`` and what
    they use in turn, each folded to the 0.5.16 branch (:func:`fold_version_flag`), in the
    adapter's order. Raises AnchorError when a name is not defined by the adapter or a definition
    needs a module-level name the native module does not have."""
    text = ADAPTER.read_text()
    defs = _top_level(ast.parse(text))
    missing = sorted(used - defs.keys())
    if missing:
        raise AnchorError(f"sglang_adapter.py: no definition of {missing} (called as adapter.<name>)")
    lines = text.splitlines(keepends=True)
    sources, todo = {}, sorted(used)
    typing_names = {"Any", "Callable", "Iterable", "Optional"}
    need_typing = set()
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        first, last = defs[name]
        src = fold_version_flag("".join(lines[_first_line(first) - 1:last.end_lineno]), name)
        sources[name] = (first.lineno, src)
        for free in _free_names(src):
            if free in defs and free not in sources:
                todo.append(free)
            elif free in typing_names:
                need_typing.add(free)
            elif free not in defs:
                raise AnchorError(f"sglang_adapter.py: {name} uses {free!r}, which the native "
                                  "verify_graph_utils does not define")
    head = UTILS_HEAD + (f"\nfrom typing import {', '.join(sorted(need_typing))}\n" if need_typing else "")
    body = [src for _, src in sorted(sources.values())]
    return head + "".join("\n\n" + s.rstrip("\n") + "\n" for s in body)


def adapter_names_used(texts: list[str]) -> set[str]:
    return {m for t in texts for m in re.findall(r"\badapter\.([A-Za-z_][A-Za-z0-9_]*)", t)}


def defined_names(text: str) -> set[str]:
    return set(_top_level(ast.parse(text)))


# ---- edits of existing SGLang files ----------------------------------------------------------
def _find(lines: list[str], needle: str, start: int, rel: str, exact: bool = False) -> int:
    for i in range(start, len(lines)):
        if (lines[i].rstrip("\n") == needle) if exact else (needle in lines[i]):
            return i
    raise AnchorError(f"{rel}: anchor not found after line {start + 1}: {needle!r}")


def edit_server_args(lines: list[str], rel: str, help_text: str) -> list[str]:
    i = _find(lines, "    speculative_adaptive_config: A[", 0, rel)
    j = _find(lines, "    ] = ", i, rel)
    field = ["    enable_verify_cuda_graph: A[\n", "        bool,\n"]
    field += [f"        {line}\n" for line in _wrap_str(help_text, 88)]
    field += ["    ] = False\n"]
    lines[j + 1:j + 1] = field
    k = _find(lines, "        materialize_declarations(self)", j, rel, exact=True)
    lines[k + 1:k + 1] = [
        "\n",
        "        # --enable-verify-cuda-graph needs the resolved configuration.\n",
        "        self._handle_verify_cuda_graph()\n",
        "\n",
        "    def _handle_verify_cuda_graph(self):\n",
        "        if not self.enable_verify_cuda_graph:\n",
        "            return\n",
        "        from sglang.srt.speculative.verify_graph_config import build_config\n",
        "\n",
        "        # Raises VerifyGraphConfigError (a ValueError): one line naming the flag and the fix.\n",
        "        build_config(self)\n",
    ]
    return lines


def _wrap_str(text: str, width: int) -> list[str]:
    words, out, cur = text.split(), [], ""
    for w in words:
        if len(cur) + len(w) + 1 > width - 12:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    out.append(cur)
    quoted = [f'"{line} "' for line in out[:-1]] + [f'"{out[-1]}",']
    return quoted


def edit_attention_registry(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def create_triton_backend(runner):", 0, rel)
    j = _find(lines, "    return TritonAttnBackend(runner)", i, rel, exact=True)
    lines[j:j] = [
        "    from sglang.srt.model_executor.runner import verify_graph_utils\n",
        "\n",
        "    if verify_graph_utils.is_eagle_topk1_target(runner):  # --enable-verify-cuda-graph\n",
        "        from sglang.srt.speculative.verify_graph_config import build_config\n",
        "\n",
        "        verify_cfg = build_config(verify_graph_utils.resolved(runner.server_args))\n",
        "        if verify_cfg is not None:\n",
        "            from sglang.srt.layers.attention.chain_verify_backend import (\n",
        "                ChainVerifyTritonBackend,\n",
        "            )\n",
        "\n",
        "            return ChainVerifyTritonBackend(runner, verify_cfg)\n",
        "\n",
    ]
    return lines


def edit_cuda_graph_setup(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def capture_decode_graph(", 0, rel)
    j = _find(lines, "        runner = graph_runners[model_runner.device](model_runner)", i, rel, exact=True)
    lines[j:j + 1] = [
        "        from sglang.srt.model_executor.runner import verify_graph_capture\n",
        "\n",
        "        if verify_graph_capture.verify_runner_kind(model_runner) is not None:\n",
        "            # --enable-verify-cuda-graph: dedicated topk=1 TARGET_VERIFY runner.\n",
        "            runner, _ = verify_graph_capture.capture_verify_runner(model_runner)\n",
        "        else:\n",
        "            # Flag on but the target's attention backend is not one the verify graph\n",
        "            # serves: a one-line error, not upstream's runner.\n",
        "            verify_graph_capture.refuse_if_flag_lost(model_runner)\n",
        "            runner = graph_runners[model_runner.device](model_runner)\n",
    ]
    return lines


def edit_model_runner(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "    def _forward_raw(", 0, rel)
    j = _find(lines, "            can_run_graph = bool(", i, rel, exact=True)
    k = _find(lines, "            # Replay cuda graph if applicable", j, rel, exact=True)
    lines[k:k] = [
        "            verify_counters = getattr(self.decode_cuda_graph_runner, \"counters\", None)\n",
        "            if (\n",
        "                not can_run_graph\n",
        "                and verify_counters is not None\n",
        "                and forward_batch.forward_mode.is_target_verify()\n",
        "            ):\n",
        "                # --enable-verify-cuda-graph: this verify runs without the verify graph;\n",
        "                # counted under the reason its can_run_graph recorded.\n",
        "                verify_counters.count_eager_verify(forward_batch.batch_size)\n",
        "            if forward_batch.forward_mode.is_draft_extend_v2():\n",
        "                from sglang.srt.model_executor.runner import verify_graph_capture\n",
        "\n",
        "                # --enable-verify-cuda-graph: a draft extend that runs without the draft-extend\n",
        "                # graph (its replays never come here), counted when the chain backend serves it.\n",
        "                verify_graph_capture.count_eager_draft_extend(self)\n",
        "\n",
    ]
    return lines


def edit_eagle_worker_common(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def build_eagle_verify_input(", 0, rel)
    j = _find(lines, "        return EagleVerifyInput.create_idle_input(", i, rel)
    k = _find(lines, "        )", j, rel, exact=True)
    lines[k + 1:k + 1] = [
        "\n",
        "    if topk == 1:\n",
        "        from sglang.srt.model_executor.runner import verify_graph_capture\n",
        "\n",
        "        if verify_graph_capture.uses_chain_backend(target_worker.model_runner):\n",
        "            # The chain verify kernel reads no tree mask: build the smallest one.\n",
        "            tree_mask_mode = TreeMaskMode.QLEN_ONLY\n",
    ]
    return lines


def edit_draft_utils(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "    def create_draft_extend_backend(self):", 0, rel, exact=True)
    j = _find(lines, "        return self._create_backend(", i, rel, exact=True)
    k = _find(lines, "        )", j, rel, exact=True)
    lines[j] = "        backend = self._create_backend(\n"
    lines[k + 1:k + 1] = [
        "        from sglang.srt.model_executor.runner import verify_graph_capture\n",
        "\n",
        "        # --enable-verify-cuda-graph: the chain kernel serves the draft's DRAFT_EXTEND_V2 in\n",
        "        # place of the triton extend kernel (SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream keeps it).\n",
        "        return verify_graph_capture.draft_extend_backend_for(self.draft_model_runner, backend)\n",
    ]
    return lines


def edit_eagle_worker_v2(lines: list[str], rel: str) -> list[str]:
    v = _find(lines, "    def verify(self, batch: ScheduleBatch):", 0, rel, exact=True)
    w = _find(lines, "        return run_eagle_verify(", v, rel, exact=True)
    lines[w:w] = [
        "        from sglang.srt.model_executor.runner.verify_graph_counters import get_counters\n",
        "\n",
        "        verify_counters = get_counters()\n",
        "        if verify_counters is not None:  # --enable-verify-cuda-graph: SGLang's own step count\n",
        "            verify_counters.count_verify_step(batch.batch_size())\n",
    ]
    i = _find(lines, "    def _draft_extend_for_decode(", 0, rel)
    j = _find(lines, "                draft_logits_output = self.cuda_graph_runner_for_draft_extend.execute(",
              i, rel, exact=True)
    k = _find(lines, "                )", j, rel, exact=True)
    if lines[j + 1:k] != ["                    forward_batch\n"]:
        raise AnchorError(f"{rel}: expected execute(forward_batch) after line {j + 1}")
    lines[j:k + 1] = [
        "                from sglang.srt.model_executor.runner import verify_graph_capture\n",
        "\n",
        "                # --enable-verify-cuda-graph: each replay served by the chain draft-extend\n",
        "                # backend is counted (and self-tested when the self-test is on).\n",
        "                draft_logits_output = verify_graph_capture.execute_draft_extend(\n",
        "                    type(self.cuda_graph_runner_for_draft_extend).execute,\n",
        "                    self.cuda_graph_runner_for_draft_extend,\n",
        "                    forward_batch,\n",
        "                )\n",
    ]
    return lines


def edit_scheduler(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "    def get_internal_state(self, recv_req: GetInternalStateReq):", 0, rel)
    j = _find(lines, "        return GetInternalStateReqOutput(internal_state=msgspec_to_builtins(ret))", i, rel,
              exact=True)
    lines[j:j] = [
        "        from sglang.srt.model_executor.runner.verify_graph_counters import get_counters\n",
        "\n",
        "        verify_counters = get_counters()\n",
        "        if verify_counters is not None:  # --enable-verify-cuda-graph\n",
        '            ret["verify_cuda_graph"] = verify_counters.snapshot()\n',
        "\n",
    ]
    return lines


# ---- patch writing ---------------------------------------------------------------------------
def locate(src: Path) -> tuple[Path, str]:
    """(root the patch applies in, path prefix of the sglang package inside it)."""
    src = src.resolve()
    if (src / "srt" / "server_args.py").is_file():
        return src.parent, src.name + "/"
    for prefix in ("python/sglang", "sglang"):
        if (src / prefix / "srt" / "server_args.py").is_file():
            return src, prefix + "/"
    raise SystemExit(f"make_upstream_patch.py: no SGLang source tree at {src} "
                     "(expected sglang/srt/server_args.py, python/sglang/srt/server_args.py, or srt/server_args.py)")


def file_diff(path: str, old: str | None, new: str) -> str:
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    head = f"diff --git a/{path} b/{path}\n"
    if old is None:
        head += "new file mode 100644\n"
    body = "".join(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{path}", f"b/{path}", n=3))
    if not body.endswith("\n"):
        body += "\n\\ No newline at end of file\n"
    return head + body


def write_patch(out: Path, number: int, subject: str, body: str, diffs: list[str]) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")[:52]
    path = out / f"{number:04d}-{slug}.patch"
    text = (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: {AUTHOR}\nDate: {DATE}\n"
            f"Subject: [PATCH {number:d}/{TOTAL}] {subject}\n\n{body.strip()}\n---\n" + "".join(diffs) + "-- \n2.43.0\n\n")
    path.write_text(text)
    return path


def native_modules() -> dict[str, str]:
    """Plugin module -> its native text, ``verify_graph_utils`` included (nothing written)."""
    extras = {"sglang_verify_graph.config": _native_config,
              "sglang_verify_graph.chain_backend": _native_backend,
              "sglang_verify_graph.runner": _native_runner,
              "sglang_verify_graph.capture": _native_capture}
    texts = {}
    for plugin in NATIVE:
        if plugin == "sglang_verify_graph.compat.sglang_adapter":
            continue
        src = (KERNEL / "chain_verify_attention.py" if plugin == "sglang_verify_graph.kernel"
               else PLUGIN / (plugin.rpartition(".")[2] + ".py"))
        texts[plugin] = plugin_module(src, NATIVE[plugin], extras.get(plugin))[1]
    used = adapter_names_used(list(texts.values()))
    utils = build_utils(used)
    check_native("verify_graph_utils", utils)
    lacking = used - defined_names(utils)
    if lacking:
        raise AnchorError(f"verify_graph_utils lacks {sorted(lacking)} called as adapter.<name>")
    texts["sglang_verify_graph.compat.sglang_adapter"] = utils
    return texts


def build(src: Path, out: Path) -> list[Path]:
    root, prefix = locate(src)
    pkg = root / prefix
    sys.path.insert(0, str(PLUGIN.parent))
    from sglang_verify_graph.cli import HELP  # the flag's help text, shared with the plugin

    native_help = HELP.split(" Python API:")[0]  # natively, Engine(enable_verify_cuda_graph=True)
    texts = native_modules()

    def new(short: str) -> str:
        plugin = short if short == "sglang_verify_graph.kernel" else f"sglang_verify_graph.{short}"
        rel = prefix + native_path(NATIVE[plugin])[len("sglang/"):]
        if (root / rel).exists():
            raise AnchorError(f"{rel} already exists in {root}: is the series applied already?")
        return file_diff(rel, None, texts[plugin])

    def edit(rel_in_pkg: str, fn, *args) -> str:
        rel = prefix + rel_in_pkg
        path = pkg / rel_in_pkg
        if not path.is_file():
            raise AnchorError(f"{rel}: file missing from the SGLang tree")
        old = path.read_text()
        lines = fn(old.splitlines(keepends=True), rel, *args)
        return file_diff(rel, old, "".join(lines))

    specs = [  # every diff is computed before anything is written: a missing anchor writes nothing
        (1, "kernels: split-KV chain verify attention for topk=1 EAGLE verify",
                    "A decode-class Triton kernel for the target verify of a linear (topk=1) draft chain:\n"
                    "reads the page table directly, folds the draft tokens and the GQA group (or MLA's\n"
                    "heads) into one tile, masks per draft position (no tree mask), splits the KV.",
                    [new("sglang_verify_graph.kernel")]),
        (2, "server_args: --enable-verify-cuda-graph and its validation",
                    "Adds ServerArgs.enable_verify_cuda_graph and validates the resolved configuration at the\n"
                    "end of __post_init__ (EAGLE/EAGLE3 topk 1, a served attention backend, decode CUDA graphs\n"
                    "on; no DP attention, PP, TBO or adaptive speculation): one-line errors naming the flag and\n"
                    "the fix. The error type, the environment variables and the backend policy are their own\n"
                    "modules.",
                    [new("errors"), new("env"), new("backends"), new("config"),
                     edit("srt/server_args.py", edit_server_args, native_help)]),
        (3, "attention: chain verify backend for the topk=1 EAGLE target",
                    "TritonAttnBackend whose TARGET_VERIFY runs the chain kernel with no per-replay metadata;\n"
                    "selected by the triton factory for the EAGLE topk=1 target when the flag is on.\n"
                    "verify_graph_utils holds the small SGLang accessors the verify graph's modules share.",
                    [new("sglang_adapter"), new("chain_backend"),
                     edit("srt/layers/attention/attention_registry.py", edit_attention_registry)]),
        (4, "cuda graph: dedicated topk=1 verify runner with counters",
                    "VerifyCudaGraphRunner (DecodeCudaGraphRunner subclass) replaces the target's decode/verify\n"
                    "runner (verify_graph_capture: which target gets it, its timed capture, a one-line error\n"
                    "when the flag is on but the backend is not served): padded buckets with neutralised rows,\n"
                    "every replay counted, every TARGET_VERIFY that runs without the graph counted by reason in\n"
                    "ModelRunner._forward_raw, optional graph-vs-eager self-test; counters in /get_server_info.",
                    [new("counters"), new("buffers"), new("selftest"), new("runner"), new("capture"),
                     edit("srt/model_executor/model_runner_components/cuda_graph_setup.py", edit_cuda_graph_setup),
                     edit("srt/model_executor/model_runner.py", edit_model_runner),
                     edit("srt/managers/scheduler.py", edit_scheduler)]),
        (5, "eagle: QLEN_ONLY tree mask for the chain verify",
                    "The chain verify kernel reads no tree mask: build SGLang's smallest mask (bs * ndt^2)\n"
                    "instead of the full ndt * (seq_len + ndt) mask and its per-step memset.",
                    [edit("srt/speculative/eagle_worker_common.py", edit_eagle_worker_common)]),
        (6, "eagle: chain attention for the draft extend (DRAFT_EXTEND_V2)",
                    "With the flag on, the draft's triton draft-extend backend becomes\n"
                    "ChainDraftExtendTritonBackend: the split-KV chain kernel with the prefix read from\n"
                    "seq_lens - num_draft_tokens, no kv_indices built per replay, in place of the extend\n"
                    "kernel whose cost grows with the context. Replays of the draft-extend graph it serves\n"
                    "are counted at the call in EAGLEWorkerV2._draft_extend_for_decode, eager draft\n"
                    "extends in ModelRunner._forward_raw; SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream keeps\n"
                    "the extend kernel.",
                    [edit("srt/speculative/draft_utils.py", edit_draft_utils),
                     edit("srt/speculative/eagle_worker_v2.py", edit_eagle_worker_v2)]),
    ]
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    patches = [write_patch(out, *spec) for spec in specs]
    (out / "series").write_text("".join(p.name + "\n" for p in patches))
    return patches


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sglang_src", type=Path, help="sglang package dir, or a checkout (root or python/)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "upstream_patch")
    args = ap.parse_args(argv)
    try:
        patches = build(args.sglang_src, args.out)
    except AnchorError as e:
        print(f"make_upstream_patch.py: {e}", file=sys.stderr)
        return 1
    root, prefix = locate(args.sglang_src)
    print(f"wrote {len(patches)} patches to {args.out} (paths {prefix}..., apply in {root}):")
    for p in patches:
        print(f"  {p.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
