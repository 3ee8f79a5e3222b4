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

1. the chain verify attention kernel as ``sglang/kernels/ops/attention/chain_verify.py`` (the
   launcher) and ``chain_verify_triton.py`` (its two ``@triton.jit`` programs);
2. the flag and its validation: ``ServerArgs.enable_verify_cuda_graph`` (``--enable-verify-cuda-graph``)
   validated at the end of ``__post_init__`` by ``sglang/srt/speculative/verify_graph_config.py``
   (with ``verify_graph_errors.py``, ``verify_graph_env.py`` and ``verify_graph_backends.py``);
3. the SGLang accessors ``sglang/srt/model_executor/runner/verify_graph_utils.py``, the plan
   ``verify_graph_plan.py`` (decided once per model runner: its decode-graph runner ours, with
   which verify attention, upstream's, or refused), the attention backend
   ``sglang/srt/layers/attention/chain_verify_backend.py`` and its selection in the ``triton``
   attention-registry factory;
4. the runner ``sglang/srt/model_executor/runner/verify_cuda_graph_runner.py`` (with its counters,
   static-buffer contract, probes and self-test), built as ``VerifyCudaGraphRunner(model_runner)``
   in ``cuda_graph_setup.capture_decode_graph`` when the plan gives the target ours; the
   draft-extend policy ``sglang/srt/speculative/verify_graph_draft_extend.py``; every
   TARGET_VERIFY that does not replay the graph counted in ``ModelRunner._forward_raw``; the
   counters in ``Scheduler.get_internal_state``;
5. the QLEN_ONLY tree mask in ``build_eagle_verify_input``;
6. the chain attention for the draft's ``DRAFT_EXTEND_V2``: ``ChainDraftExtendTritonBackend``
   chosen in ``DraftBackendFactory.create_draft_extend_backend``, its graph replays counted at
   the call in ``EAGLEWorkerV2._draft_extend_for_decode`` (eager ones in ``_forward_raw``).

The new modules are this repository's modules with their imports rewritten to native names
(``verify_graph_utils`` is the 0.5.16 branch of ``compat/sglang_adapter.py``: the definitions the
other modules call as ``adapter.<name>``, extracted from it by AST; the plugin-only modules, its
hook table ``hooks.py`` included, are not carried); the edits to existing SGLang files
(``upstream_patch_edits.py``) are generated against the given tree, each anchored on stable lines
of the pinned version: a missing anchor stops the script with the file and the anchor it looked
for.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import difflib
import re
import sys
from pathlib import Path

from upstream_patch_edits import (
    NATIVE_EXTRAS,
    PROSE,
    AnchorError,
    drop_hook_table,
    edit_attention_registry,
    edit_cuda_graph_setup,
    edit_draft_utils,
    edit_eagle_worker_common,
    edit_eagle_worker_v2,
    edit_model_runner,
    edit_scheduler,
    edit_server_args,
    first_line,
    top_level,
)

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "python" / "sglang_verify_graph"
AUTHOR = "sglang-verify-graph <sglang-verify-graph@users.noreply.github.com>"
DATE = "Sat, 29 Nov 2026 00:00:00 +0000"
TOTAL = 6

# plugin module -> native module (dotted, under the ``sglang`` package)
NATIVE = {
    "sglang_verify_graph.kernel": "sglang.kernels.ops.attention.chain_verify",
    "sglang_verify_graph.kernel.triton_chain": "sglang.kernels.ops.attention.chain_verify_triton",
    "sglang_verify_graph.kernel.faults": "sglang.kernels.ops.attention.chain_verify_faults",
    "sglang_verify_graph.errors": "sglang.srt.speculative.verify_graph_errors",
    "sglang_verify_graph.env": "sglang.srt.speculative.verify_graph_env",
    "sglang_verify_graph.config": "sglang.srt.speculative.verify_graph_config",
    "sglang_verify_graph.backends": "sglang.srt.speculative.verify_graph_backends",
    "sglang_verify_graph.chain_backend": "sglang.srt.layers.attention.chain_verify_backend",
    "sglang_verify_graph.runner": "sglang.srt.model_executor.runner.verify_cuda_graph_runner",
    "sglang_verify_graph.counters": "sglang.srt.model_executor.runner.verify_graph_counters",
    "sglang_verify_graph.buffers": "sglang.srt.model_executor.runner.verify_graph_buffers",
    "sglang_verify_graph.debug.probes": "sglang.srt.model_executor.runner.verify_graph_probes",
    "sglang_verify_graph.debug": "sglang.srt.model_executor.runner.verify_graph_debug",
    "sglang_verify_graph.debug.selftest": "sglang.srt.model_executor.runner.verify_graph_selftest",
    "sglang_verify_graph.plan": "sglang.srt.model_executor.runner.verify_graph_plan",
    "sglang_verify_graph.draft_extend": "sglang.srt.speculative.verify_graph_draft_extend",
    "sglang_verify_graph.compat.sglang_adapter": "sglang.srt.model_executor.runner.verify_graph_utils",
}
_NATIVE_PREFIXES = tuple(v + "." for v in NATIVE.values())


def native_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def rewrite_imports(text: str) -> str:
    """Plugin package names -> native module names (imports, docstrings, logger names)."""
    text = text.replace('logging.getLogger("sglang_verify_graph")', "logging.getLogger(__name__)")
    for old, new in PROSE:
        text = text.replace(old, new)
    for plugin in NATIVE:  # ``from <package> import <module>``
        package, _, short = plugin.rpartition(".")
        parent, _, leaf = NATIVE[plugin].rpartition(".")
        text = re.sub(rf"from {re.escape(package)} import {short}\b", f"from {parent} import {leaf}", text)
    for plugin in sorted(NATIVE, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(plugin)}(\.chain_verify_attention)?\b", NATIVE[plugin], text)
    return text


def check_native(name: str, text: str) -> None:
    """No import of the plugin packages (nor of a module below a native module, i.e. a plugin
    module the series does not carry) may survive the rewrite."""
    for node in ast.walk(ast.parse(text, filename=name)):
        mods = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module]
        for mod in mods:
            if mod.split(".")[0] == "sglang_verify_graph" or mod.startswith(_NATIVE_PREFIXES):
                raise AnchorError(f"{name}: import of {mod} survived the rewrite (a plugin module "
                                  "the series does not carry?)")


def plugin_source(plugin: str) -> Path:
    """The file of a plugin module (``kernel``: its launcher, which the package re-exports)."""
    if plugin == "sglang_verify_graph.kernel":
        return PLUGIN / "kernel" / "chain_verify_attention.py"
    path = PLUGIN.joinpath(*plugin.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def plugin_module(src: Path, native: str, extra=None) -> tuple[str, str]:
    text = rewrite_imports(drop_hook_table(src.read_text(), native))
    if extra:
        text = extra(text)
    check_native(native, text)
    return native_path(native), text


# ---- verify_graph_utils: the adapter's 0.5.16 branch -----------------------------------------
ADAPTER = PLUGIN / "compat" / "sglang_adapter.py"


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
    defs = top_level(ast.parse(text))
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
        src = fold_version_flag("".join(lines[first_line(first) - 1:last.end_lineno]), name)
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
    return set(top_level(ast.parse(text)))


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
    texts = {}
    for plugin in NATIVE:
        if plugin == "sglang_verify_graph.compat.sglang_adapter":
            continue
        texts[plugin] = plugin_module(plugin_source(plugin), NATIVE[plugin], NATIVE_EXTRAS.get(plugin))[1]
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
        plugin = f"sglang_verify_graph.{short}"
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
                    "heads) into one tile, masks per draft position (no tree mask), splits the KV. The\n"
                    "launcher (shapes, launch policy) is chain_verify.py, its two @triton.jit programs\n"
                    "chain_verify_triton.py.",
                    [new("kernel.triton_chain"), new("kernel.faults"), new("kernel")]),
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
                    "verify_graph_plan decides once per model runner (kept on it) whether its decode-graph\n"
                    "runner becomes the verify graph's, with which verify attention, or must be refused;\n"
                    "verify_graph_utils holds the small SGLang accessors the verify graph's modules share.",
                    [new("compat.sglang_adapter"), new("plan"), new("chain_backend"),
                     edit("srt/layers/attention/attention_registry.py", edit_attention_registry)]),
        (4, "cuda graph: dedicated topk=1 verify runner with counters",
                    "VerifyCudaGraphRunner (DecodeCudaGraphRunner subclass) replaces the target's decode/verify\n"
                    "runner in capture_decode_graph when the model runner's plan gives it one (a one-line error\n"
                    "when the flag is on but the backend is not served). Built as VerifyCudaGraphRunner(\n"
                    "model_runner), it times its capture, counts its GPU memory and turns an out-of-memory\n"
                    "capture into one line: padded buckets with neutralised rows, every replay counted, every\n"
                    "TARGET_VERIFY that runs without the graph counted by reason in ModelRunner._forward_raw,\n"
                    "optional graph-vs-eager self-test (verify_graph_debug's probes, inert by default);\n"
                    "counters in /get_server_info. verify_graph_draft_extend holds the draft-extend policy\n"
                    "(wired into the draft by the last patch); its eager forwards are counted in _forward_raw.",
                    [new("counters"), new("buffers"), new("debug.probes"), new("debug.selftest"), new("debug"),
                     new("runner"), new("draft_extend"),
                     edit("srt/model_executor/model_runner_components/cuda_graph_setup.py", edit_cuda_graph_setup),
                     edit("srt/model_executor/model_runner.py", edit_model_runner),
                     edit("srt/managers/scheduler.py", edit_scheduler)]),
        (5, "eagle: QLEN_ONLY tree mask for the chain verify",
                    "The chain verify kernel reads no tree mask: build SGLang's smallest mask (bs * ndt^2)\n"
                    "instead of the full ndt * (seq_len + ndt) mask and its per-step memset.",
                    [edit("srt/speculative/eagle_worker_common.py", edit_eagle_worker_common)]),
        (6, "eagle: chain attention for the draft extend (DRAFT_EXTEND_V2)",
                    "With the flag on, the draft's triton draft-extend backend becomes\n"
                    "ChainDraftExtendTritonBackend (verify_graph_draft_extend.draft_extend_backend_for): the\n"
                    "split-KV chain kernel with the prefix read from seq_lens - num_draft_tokens, no kv_indices\n"
                    "built per replay, in place of the extend kernel whose cost grows with the context.\n"
                    "Replays of the draft-extend graph it serves are counted at the call in\n"
                    "EAGLEWorkerV2._draft_extend_for_decode, eager draft extends in ModelRunner._forward_raw;\n"
                    "SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream keeps the extend kernel.",
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
