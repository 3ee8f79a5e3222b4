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
   validated at the end of ``__post_init__`` by ``sglang/srt/speculative/verify_graph_config.py``;
3. the attention backend ``sglang/srt/layers/attention/chain_verify_backend.py`` and its selection
   in the ``triton`` attention-registry factory;
4. the runner ``sglang/srt/model_executor/runner/verify_cuda_graph_runner.py`` (with its counters,
   static-buffer contract, self-test and SGLang helpers), selected in
   ``cuda_graph_setup.capture_decode_graph``; the QLEN_ONLY tree mask in
   ``build_eagle_verify_input``; the counters in ``Scheduler.get_internal_state``.

The new modules are this repository's modules with their imports rewritten to native names; the
edits to existing SGLang files are generated against the given tree, each anchored on stable lines
of the pinned version: a missing anchor stops the script with the file and the anchor it looked for.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "python" / "sglang_verify_graph"
KERNEL = ROOT / "sgl-kernel" / "sgl_verify_kernel"
AUTHOR = "sglang-verify-graph <sglang-verify-graph@users.noreply.github.com>"
DATE = "Sat, 29 Nov 2026 00:00:00 +0000"
TOTAL = 5

# plugin module -> native module (dotted, under the ``sglang`` package)
NATIVE = {
    "sgl_verify_kernel": "sglang.kernels.ops.attention.chain_verify",
    "sglang_verify_graph.config": "sglang.srt.speculative.verify_graph_config",
    "sglang_verify_graph.backends": "sglang.srt.speculative.verify_graph_backends",
    "sglang_verify_graph.chain_backend": "sglang.srt.layers.attention.chain_verify_backend",
    "sglang_verify_graph.runner": "sglang.srt.model_executor.runner.verify_cuda_graph_runner",
    "sglang_verify_graph.counters": "sglang.srt.model_executor.runner.verify_graph_counters",
    "sglang_verify_graph.buffers": "sglang.srt.model_executor.runner.verify_graph_buffers",
    "sglang_verify_graph.selftest": "sglang.srt.model_executor.runner.verify_graph_selftest",
    "sglang_verify_graph.sglang_adapter": "sglang.srt.model_executor.runner.verify_graph_utils",
}


class AnchorError(RuntimeError):
    pass


def native_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def rewrite_imports(text: str) -> str:
    """Plugin package names -> native module names (imports, docstrings, logger names)."""
    text = text.replace('logging.getLogger("sglang_verify_graph")', "logging.getLogger(__name__)")
    for short in ("counters", "sglang_adapter", "buffers", "selftest", "config", "backends",
                  "chain_backend", "runner"):
        parent, _, leaf = NATIVE[f"sglang_verify_graph.{short}"].rpartition(".")
        text = re.sub(rf"from sglang_verify_graph import {short}\b", f"from {parent} import {leaf}", text)
    for plugin in sorted(NATIVE, key=len, reverse=True):
        text = re.sub(rf"\b{re.escape(plugin)}(\.chain_verify_attention)?\b", NATIVE[plugin], text)
    for old, new in (("``sglang_adapter.resolved``", "the adapter's resolved view"),
                     ("The command-line flag this plugin adds", "The command-line flag that enables the verify graph"),
                     ("belong to this plugin", "belong to this feature"),
                     ("``sglang_adapter``", "``verify_graph_utils``")):
        text = text.replace(old, new)
    text = text.replace("sglang_adapter.build_verify_input_hook", "build_eagle_verify_input")
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
            if mod.split(".")[0] in ("sglang_verify_graph", "sgl_verify_kernel"):
                raise AnchorError(f"{name}: import of {mod} survived the rewrite")


def plugin_module(src: Path, native: str, extra=None) -> tuple[str, str]:
    text = rewrite_imports(src.read_text())
    if extra:
        text = extra(text)
    check_native(native, text)
    return native_path(native), text


def _native_config(text: str) -> str:
    # Native: a real ServerArgs field instead of the plugin's underscore attribute.
    old = 'ATTR_ENABLE = "_enable_verify_cuda_graph"'
    if old not in text:
        raise AnchorError(f"verify_graph_config: expected line {old!r}")
    return text.replace(old, 'ATTR_ENABLE = "enable_verify_cuda_graph"')


def _native_backend(text: str) -> str:
    old = "class ChainVerifyTritonBackend(sa.triton_attn_backend_cls()):"
    if old not in text:
        raise AnchorError(f"chain_verify_backend: expected line {old!r}")
    text = text.replace(old, "class ChainVerifyTritonBackend(TritonAttnBackend):")
    return _add_import(text, "from sglang.srt.layers.attention.triton_backend import TritonAttnBackend")


def _native_runner(text: str) -> str:
    old = "class VerifyCudaGraphRunner(sa.decode_cuda_graph_runner_cls()):"
    if old not in text:
        raise AnchorError(f"verify_cuda_graph_runner: expected line {old!r}")
    text = text.replace(old, "class VerifyCudaGraphRunner(DecodeCudaGraphRunner):")
    return _add_import(text, "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner")


def _add_import(text: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.startswith(("from ", "import ")))
    if lines[last].rstrip().endswith("("):
        while lines[last].strip() != ")":  # the end of a parenthesised import
            last += 1
    lines.insert(last + 1, line + "\n")
    return "".join(lines)


# The SGLang helpers the runner / backend / self-test call as ``sa.<name>`` (the 0.5.16 branch of
# python/sglang_verify_graph/sglang_adapter.py, native).
UTILS = '''"""Helpers of the topk=1 EAGLE verify CUDA graph (``--enable-verify-cuda-graph``): which model
runner gets the chain verify backend and the verify runner, and the small SGLang accessors the
runner and the backend share."""

from __future__ import annotations

import logging
from typing import Callable, Optional

logger = logging.getLogger(__name__)

CAN_RUN_GRAPH_CHECKS_HIDDEN_MODE = True


def kv_write_loc(forward_batch):
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    return KVWriteLoc(forward_batch.out_cache_loc, None, full_loc=None)


def kv_translation_active(backend) -> bool:
    return backend._translate_kv_loc is not None


def can_run_dp(forward_batch) -> bool:
    return bool(forward_batch.can_run_dp_cuda_graph)


def logit_cap(layer) -> float:
    from sglang.srt.layers.attention.triton_backend import logit_capping_mod

    return float(logit_capping_mod(layer.logit_capping_method, layer.logit_cap)) if layer.logit_cap else 0.0


@@ADAPTER_FUNCTIONS@@


def is_eagle_topk1_target(model_runner) -> bool:
    algo = model_runner.spec_algorithm
    return (not model_runner.is_draft_worker and algo.is_eagle()
            and (model_runner.server_args.speculative_eagle_topk or 1) == 1)


def chain_verify_config(model_runner):
    """The validated verify-graph config when this runner gets the chain verify backend."""
    if not is_eagle_topk1_target(model_runner):
        return None
    from sglang.srt.speculative.verify_graph_config import build_config

    return build_config(model_runner.server_args)


def uses_verify_cuda_graph(model_runner) -> bool:
    """The chain backend, or the native backend the flag's config chose (by its class)."""
    from sglang.srt.layers.attention.chain_verify_backend import ChainVerifyTritonBackend
    from sglang.srt.speculative.verify_graph_backends import NATIVE_BACKEND_CLASSES

    backend = getattr(model_runner, "attn_backend", None)
    if isinstance(backend, ChainVerifyTritonBackend):
        return True
    cfg = chain_verify_config(model_runner)
    return (cfg is not None and cfg.verify_attention == "native"
            and type(backend).__name__ in NATIVE_BACKEND_CLASSES.get(cfg.attention_backend, ()))


_config_for = chain_verify_config  # the name the shared capture_verify_runner uses


@@ADAPTER_CAPTURE@@


def build_verify_cuda_graph_runner(model_runner):
    """Capture VerifyCudaGraphRunner (timed, GPU memory counted, one log line)."""
    from sglang.srt.model_executor.runner.verify_cuda_graph_runner import VerifyCudaGraphRunner

    return capture_verify_runner(model_runner, VerifyCudaGraphRunner)[0]
'''


def adapter_functions(*names: str) -> str:
    """Source of the named functions of ``sglang_adapter.py`` (shared unchanged with the native
    ``verify_graph_utils``), so the two never drift apart."""
    src = (PLUGIN / "sglang_adapter.py").read_text()
    nodes = {n.name: n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    missing = [n for n in names if n not in nodes]
    if missing:
        raise AnchorError(f"sglang_adapter.py: functions {missing} not found")
    return "\n\n\n".join(ast.get_source_segment(src, nodes[n]) for n in names)


UTILS = UTILS.replace("@@ADAPTER_FUNCTIONS@@",
                      adapter_functions("num_aux_hidden_states", "local_embedding_row")).replace(
    "@@ADAPTER_CAPTURE@@", rewrite_imports(adapter_functions("capture_verify_runner")))


def sa_names_used(texts: list[str]) -> set[str]:
    return {m for t in texts for m in re.findall(r"\bsa\.([A-Za-z_][A-Za-z0-9_]*)", t)}


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
        "    verify_cfg = verify_graph_utils.chain_verify_config(runner)\n",
        "    if verify_cfg is not None:  # --enable-verify-cuda-graph, EAGLE topk=1 target\n",
        "        from sglang.srt.layers.attention.chain_verify_backend import (\n",
        "            ChainVerifyTritonBackend,\n",
        "        )\n",
        "\n",
        "        return ChainVerifyTritonBackend(runner, verify_cfg)\n",
    ]
    return lines


def edit_cuda_graph_setup(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def capture_decode_graph(", 0, rel)
    j = _find(lines, "        runner = graph_runners[model_runner.device](model_runner)", i, rel, exact=True)
    lines[j:j + 1] = [
        "        from sglang.srt.model_executor.runner import verify_graph_utils\n",
        "\n",
        "        if verify_graph_utils.uses_verify_cuda_graph(model_runner):\n",
        "            # --enable-verify-cuda-graph: dedicated topk=1 TARGET_VERIFY runner.\n",
        "            runner = verify_graph_utils.build_verify_cuda_graph_runner(model_runner)\n",
        "        else:\n",
        "            runner = graph_runners[model_runner.device](model_runner)\n",
    ]
    return lines


def edit_eagle_worker_common(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def build_eagle_verify_input(", 0, rel)
    j = _find(lines, "        return EagleVerifyInput.create_idle_input(", i, rel)
    k = _find(lines, "        )", j, rel, exact=True)
    lines[k + 1:k + 1] = [
        "\n",
        "    if topk == 1:\n",
        "        from sglang.srt.model_executor.runner import verify_graph_utils\n",
        "\n",
        "        if verify_graph_utils.uses_verify_cuda_graph(target_worker.model_runner):\n",
        "            # The chain verify kernel reads no tree mask: build the smallest one.\n",
        "            tree_mask_mode = TreeMaskMode.QLEN_ONLY\n",
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


def build(src: Path, out: Path) -> list[Path]:
    root, prefix = locate(src)
    pkg = root / prefix
    sys.path.insert(0, str(PLUGIN.parent))
    from sglang_verify_graph.cli import HELP  # the flag's help text, shared with the plugin

    native_help = HELP.split(" Python API:")[0]  # natively, Engine(enable_verify_cuda_graph=True)

    def new(native: str, text: str) -> str:
        rel = prefix + native_path(native)[len("sglang/"):]
        if (root / rel).exists():
            raise AnchorError(f"{rel} already exists in {root}: is the series applied already?")
        return file_diff(rel, None, text)

    def edit(rel_in_pkg: str, fn, *args) -> str:
        rel = prefix + rel_in_pkg
        path = pkg / rel_in_pkg
        if not path.is_file():
            raise AnchorError(f"{rel}: file missing from the SGLang tree")
        old = path.read_text()
        lines = fn(old.splitlines(keepends=True), rel, *args)
        return file_diff(rel, old, "".join(lines))

    kernel = plugin_module(KERNEL / "chain_verify_attention.py", NATIVE["sgl_verify_kernel"])
    config = plugin_module(PLUGIN / "config.py", NATIVE["sglang_verify_graph.config"], _native_config)
    policy = plugin_module(PLUGIN / "backends.py", NATIVE["sglang_verify_graph.backends"])
    backend = plugin_module(PLUGIN / "chain_backend.py", NATIVE["sglang_verify_graph.chain_backend"], _native_backend)
    runner = plugin_module(PLUGIN / "runner.py", NATIVE["sglang_verify_graph.runner"], _native_runner)
    counters = plugin_module(PLUGIN / "counters.py", NATIVE["sglang_verify_graph.counters"])
    buffers = plugin_module(PLUGIN / "buffers.py", NATIVE["sglang_verify_graph.buffers"])
    selftest = plugin_module(PLUGIN / "selftest.py", NATIVE["sglang_verify_graph.selftest"])
    check_native("verify_graph_utils", UTILS)
    defined = {n.name for n in ast.parse(UTILS).body if isinstance(n, ast.FunctionDef)} | {
        t.id for n in ast.parse(UTILS).body if isinstance(n, ast.Assign) for t in n.targets}
    used = sa_names_used([backend[1], runner[1], selftest[1]])
    if used - defined:
        raise AnchorError(f"verify_graph_utils lacks {sorted(used - defined)} used by the runner/backend")

    specs = [  # every diff is computed before anything is written: a missing anchor writes nothing
        (1, "kernels: split-KV chain verify attention for topk=1 EAGLE verify",
                    "A decode-class Triton kernel for the target verify of a linear (topk=1) draft chain:\n"
                    "reads the page table directly, folds the draft tokens and the GQA group (or MLA's\n"
                    "heads) into one tile, masks per draft position (no tree mask), splits the KV.",
                    [new(NATIVE["sgl_verify_kernel"], kernel[1])]),
        (2, "server_args: --enable-verify-cuda-graph and its validation",
                    "Adds ServerArgs.enable_verify_cuda_graph and validates the resolved configuration at the\n"
                    "end of __post_init__ (EAGLE/EAGLE3 topk 1, triton attention, decode CUDA graphs on; no DP\n"
                    "attention, PP, TBO or adaptive speculation): one-line errors naming the flag and the fix.",
                    [new(NATIVE["sglang_verify_graph.config"], config[1]),
                     new(NATIVE["sglang_verify_graph.backends"], policy[1]),
                     edit("srt/server_args.py", edit_server_args, native_help)]),
        (3, "attention: chain verify backend for the topk=1 EAGLE target",
                    "TritonAttnBackend whose TARGET_VERIFY runs the chain kernel with no per-replay metadata;\n"
                    "selected by the triton factory for the EAGLE topk=1 target when the flag is on.",
                    [new(NATIVE["sglang_verify_graph.sglang_adapter"], UTILS),
                     new(NATIVE["sglang_verify_graph.chain_backend"], backend[1]),
                     edit("srt/layers/attention/attention_registry.py", edit_attention_registry)]),
        (4, "cuda graph: dedicated topk=1 verify runner with counters",
                    "VerifyCudaGraphRunner (DecodeCudaGraphRunner subclass) replaces the target's decode/verify\n"
                    "runner: padded buckets with neutralised rows, every replay and eager fallback counted by\n"
                    "reason, optional graph-vs-eager self-test; counters in /get_server_info.",
                    [new(NATIVE["sglang_verify_graph.counters"], counters[1]),
                     new(NATIVE["sglang_verify_graph.buffers"], buffers[1]),
                     new(NATIVE["sglang_verify_graph.selftest"], selftest[1]),
                     new(NATIVE["sglang_verify_graph.runner"], runner[1]),
                     edit("srt/model_executor/model_runner_components/cuda_graph_setup.py", edit_cuda_graph_setup),
                     edit("srt/managers/scheduler.py", edit_scheduler)]),
        (5, "eagle: QLEN_ONLY tree mask for the chain verify",
                    "The chain verify kernel reads no tree mask: build SGLang's smallest mask (bs * ndt^2)\n"
                    "instead of the full ndt * (seq_len + ndt) mask and its per-step memset.",
                    [edit("srt/speculative/eagle_worker_common.py", edit_eagle_worker_common)]),
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
