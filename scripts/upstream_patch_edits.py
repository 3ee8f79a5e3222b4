"""The edits ``make_upstream_patch.py`` makes: to the plugin modules it copies into SGLang 0.5.16,
and to the existing SGLang files the series changes.

Copied modules: :data:`PROSE` rewrites mentions of the plugin's machinery in docstrings,
:func:`drop_hook_table` drops the plugin's ``@hook(...)`` declarations (the series edits SGLang
at the hooks' targets instead), and :data:`NATIVE_EXTRAS` holds the per-module changes the native
code needs (the flag a ``ServerArgs`` field, SGLang classes imported instead of looked up).

Existing files: each ``edit_<file>(lines, rel, ...)`` takes the file's lines (``rel``: its path in
the patch, for messages) and returns them edited, anchored on stable lines of the pinned version;
a missing anchor raises :class:`AnchorError` naming the file and the anchor. The edits call the
native modules the series adds (``verify_graph_plan``, ``verify_cuda_graph_runner``,
``verify_graph_draft_extend``, ``verify_graph_counters``, ``verify_graph_config``) through
imports inside the edited functions, so SGLang imports them only where the code runs.
"""

from __future__ import annotations

import ast
import re


class AnchorError(RuntimeError):
    pass


# ---- the copied modules: prose, hook table, native transforms -------------------------------
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
    ("``capture.draft_extend_backend_for``", "``verify_graph_draft_extend.draft_extend_backend_for``"),
    ("``draft_extend.draft_extend_backend_for``", "``verify_graph_draft_extend.draft_extend_backend_for``"),
    (", ``plugin.verify_step_hook``", ""),
    ("``debug.selftest.VerifyProbe``", "``verify_graph_probes.VerifyProbe``"),
    ("``debug.make_", "``verify_graph_debug.make_"),
    ("``debug.selftest``", "``verify_graph_selftest``"),
    ("``plan.verify_plan``", "``verify_graph_plan.verify_plan``"),
    ("``config.build_config``", "``verify_graph_config.build_config``"),
)


def drop_hook_table(text: str, module: str) -> str:
    """``text`` without the plugin's hook table: ``@hook(...)`` decorators and the import of
    ``sglang_verify_graph.hooks`` (the series edits SGLang at the hooks' targets instead)."""
    tree, spans = ast.parse(text), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module == "sglang_verify_graph.hooks" or (
                node.module == "sglang_verify_graph" and [a.name for a in node.names] == ["hooks"])):
            spans.append((node.lineno, node.end_lineno))
        for dec in getattr(node, "decorator_list", []):
            func = dec.func if isinstance(dec, ast.Call) else dec
            if getattr(func, "id", getattr(func, "attr", None)) == "hook":
                spans.append((dec.lineno, dec.end_lineno))
    lines = text.splitlines(keepends=True)
    for first, last in sorted(spans, reverse=True):
        del lines[first - 1:last]
    out = "".join(lines)
    if re.search(r"\bhooks?\.(hook|table)\b", out):
        raise AnchorError(f"{module}: uses the plugin's hook table beyond its decorators")
    return out


def _replace_line(text: str, old: str, new: str, module: str) -> str:
    if old not in text:
        raise AnchorError(f"{module}: expected line {old!r}")
    return text.replace(old, new)


NATIVE_IS_ENABLED = '''def is_enabled(server_args: Any, env: Optional[EnvSettings] = None) -> bool:
    """Whether ``--enable-verify-cuda-graph`` is on for these server args: the field
    ``enable_verify_cuda_graph`` is true, else :data:`ENV_ENABLE` is set to a true value (``env``:
    the parsed environment; ``None`` reads it with :func:`read_env`, only when the field is off).
    Raises VerifyGraphConfigError from :func:`read_env` on a malformed variable."""
    if getattr(server_args, "enable_verify_cuda_graph", False):
        return True
    return (read_env() if env is None else env).enable
'''

NATIVE_CHANNELS = '''Two channels carry "the flag is on": the ``ServerArgs`` field ``enable_verify_cuda_graph``
(``--enable-verify-cuda-graph``, ``sglang.Engine(enable_verify_cuda_graph=True)``), and the
environment variable :data:`ENV_ENABLE`, which spawned scheduler processes inherit.

'''


def native_config(text: str) -> str:
    # Native: the flag is a real ServerArgs field (the plugin carries it in the environment only).
    text, n = re.subn(r"One channel carries .*?\n\n", NATIVE_CHANNELS, text, count=1, flags=re.S)
    if not n:
        raise AnchorError("verify_graph_config: expected the paragraph 'One channel carries ...'")
    text = replace_definition(text, "verify_graph_config", "is_enabled", NATIVE_IS_ENABLED)
    return _replace_line(text, "is_enabled(env)", "is_enabled(server_args, env)", "verify_graph_config")


def _name_triton_backend(text: str, line: str, module: str) -> str:
    """``text`` with ``line``'s ``adapter.triton_attn_backend_cls()`` replaced by SGLang's
    ``TritonAttnBackend`` (natively the class is imported, not looked up), and that import."""
    text = _replace_line(text, line, line.replace("adapter.triton_attn_backend_cls()", "TritonAttnBackend"), module)
    return _add_import(text, "from sglang.srt.layers.attention.triton_backend import TritonAttnBackend")


def native_chain_backend(text: str) -> str:
    return _name_triton_backend(text, "class _ChainTritonBackend(adapter.triton_attn_backend_cls()):",
                                "chain_verify_backend")


def native_runner(text: str) -> str:
    text = _replace_line(text, "class VerifyCudaGraphRunner(adapter.decode_cuda_graph_runner_cls()):",
                         "class VerifyCudaGraphRunner(DecodeCudaGraphRunner):", "verify_cuda_graph_runner")
    return _add_import(text, "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner")


def native_draft_extend(text: str) -> str:
    return _name_triton_backend(text, "    if type(backend) is not adapter.triton_attn_backend_cls():",
                                "verify_graph_draft_extend")


NATIVE_DEBUG_DOC = '''"""The verify graph's debug probes, off by default: the graph self-test and its NaN padding
(``verify_graph_selftest``, ``SGLANG_VERIFY_GRAPH_SELFTEST`` / ``_SELFTEST_NAN``).

The runner and the draft extend reach them only through the probe factories below; with the
variables unset the probes do nothing.
"""
'''


def native_debug(text: str) -> str:
    # The plugin's debug package also holds the host-sync check and its hooks: not carried.
    doc = ast.parse(text).body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
        raise AnchorError("verify_graph_debug: expected a module docstring")
    return NATIVE_DEBUG_DOC + "".join(text.splitlines(keepends=True)[doc.end_lineno:])


def _add_import(text: str, line: str) -> str:
    lines = text.splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.startswith(("from ", "import ")))
    if lines[last].rstrip().endswith("("):
        while lines[last].strip() != ")":  # the end of a parenthesised import
            last += 1
    lines.insert(last + 1, line + "\n")
    return "".join(lines)


def top_level(tree: ast.Module) -> dict[str, tuple[ast.stmt, ast.stmt]]:
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


def first_line(node: ast.stmt) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def replace_definition(text: str, module: str, name: str, new: str) -> str:
    """``text`` with the top-level definition ``name`` (decorators included) replaced by ``new``."""
    defs = top_level(ast.parse(text))
    if name not in defs:
        raise AnchorError(f"{module}: definition {name!r} not found")
    first, last = defs[name]
    lines = text.splitlines(keepends=True)
    lines[first_line(first) - 1:last.end_lineno] = [new]
    return "".join(lines)


NATIVE_EXTRAS = {
    "sglang_verify_graph.config": native_config,
    "sglang_verify_graph.chain_backend": native_chain_backend,
    "sglang_verify_graph.runner": native_runner,
    "sglang_verify_graph.draft_extend": native_draft_extend,
    "sglang_verify_graph.debug": native_debug,
}
"""Plugin module -> the change of its rewritten text that the native module needs."""


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
        "    from sglang.srt.model_executor.runner import verify_graph_plan\n",
        "\n",
        "    # --enable-verify-cuda-graph: the EAGLE topk=1 target gets the chain verify backend.\n",
        "    verify_plan = verify_graph_plan.verify_plan(runner)\n",
        "    if verify_plan.kind == verify_graph_plan.CHAIN:\n",
        "        from sglang.srt.layers.attention.chain_verify_backend import (\n",
        "            ChainVerifyTritonBackend,\n",
        "        )\n",
        "\n",
        "        return ChainVerifyTritonBackend(runner, verify_plan.config)\n",
        "\n",
    ]
    return lines


def edit_cuda_graph_setup(lines: list[str], rel: str) -> list[str]:
    i = _find(lines, "def capture_decode_graph(", 0, rel)
    j = _find(lines, "        runner = graph_runners[model_runner.device](model_runner)", i, rel, exact=True)
    lines[j:j + 1] = [
        "        from sglang.srt.model_executor.runner import verify_graph_plan\n",
        "\n",
        "        if verify_graph_plan.runner_kind(model_runner) is not None:\n",
        "            # --enable-verify-cuda-graph: dedicated topk=1 TARGET_VERIFY runner (its capture\n",
        "            # timed and its GPU memory counted; out of memory is a one-line error).\n",
        "            from sglang.srt.model_executor.runner.verify_cuda_graph_runner import (\n",
        "                VerifyCudaGraphRunner,\n",
        "            )\n",
        "\n",
        "            runner = VerifyCudaGraphRunner(model_runner)\n",
        "        else:\n",
        "            # Flag on but the target's attention backend is not one the verify graph\n",
        "            # serves: a one-line error, not upstream's runner.\n",
        "            verify_graph_plan.refuse_if_flag_lost(model_runner)\n",
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
        "                from sglang.srt.speculative import verify_graph_draft_extend\n",
        "\n",
        "                # --enable-verify-cuda-graph: a draft extend that runs without the draft-extend\n",
        "                # graph (its replays never come here), counted when the chain backend serves it.\n",
        "                verify_graph_draft_extend.count_eager_draft_extend(self)\n",
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
        "        from sglang.srt.model_executor.runner import verify_graph_plan\n",
        "\n",
        "        target_runner = target_worker.model_runner\n",
        "        if verify_graph_plan.runner_kind(target_runner) == verify_graph_plan.CHAIN:\n",
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
        "        from sglang.srt.speculative import verify_graph_draft_extend\n",
        "\n",
        "        # --enable-verify-cuda-graph: the chain kernel serves the draft's DRAFT_EXTEND_V2 in\n",
        "        # place of the triton extend kernel (SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream keeps it).\n",
        "        return verify_graph_draft_extend.draft_extend_backend_for(\n",
        "            self.draft_model_runner, backend\n",
        "        )\n",
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
        "                from sglang.srt.speculative import verify_graph_draft_extend\n",
        "\n",
        "                # --enable-verify-cuda-graph: each replay served by the chain draft-extend\n",
        "                # backend is counted (and self-tested when the self-test is on).\n",
        "                draft_logits_output = verify_graph_draft_extend.execute_draft_extend(\n",
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
