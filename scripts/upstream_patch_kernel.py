"""The kernel module of the upstream series, ``sglang/kernels/ops/attention/chain_verify.py``,
assembled from this repository's kernel files as text (nothing is imported).

Sources: ``python/sglang_verify_graph/kernel/chain_verify_attention.py`` (the launcher and its
policy), ``kernel/triton_chain.py`` (the two ``@triton.jit`` programs) and ``chain_backend.py``
(``rope_tile``); ``scripts/upstream_pr/kernel_api.py`` gives the module docstring, the imports and
the entry points the Triton backend calls (``chain_verify_fwd``, ``can_handle``,
``workspace_numel_bound``), with ``# <kernel-body>`` where the copied definitions go.

The copy carries no test scaffolding: the test-fault switch (stage 1's ``FAULT`` constexpr and its
branches, the launcher's ``fault`` argument) is stripped, the float64 reference and the fault
module are not carried, and docstrings and comments that describe the repository or its
measurements are replaced. :func:`kernel_module` raises :class:`AnchorError` (one line naming the
file and what it looked for) when a definition it copies is missing, a fault branch survives, or
the assembled module reads a name it does not define.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

from upstream_patch_edits import AnchorError

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = ROOT / "python" / "sglang_verify_graph" / "kernel"
CHAIN_BACKEND = ROOT / "python" / "sglang_verify_graph" / "chain_backend.py"
API_TEMPLATE = Path(__file__).resolve().parent / "upstream_pr" / "kernel_api.py"
BODY_MARK = "# <kernel-body>\n"

# name -> the comment written above it in the copy (the values are the launcher's own)
CONSTANTS = {
    "MIN_KEYS_PER_SPLIT": "# Keys per split never go below this: short requests use fewer splits.",
    "MAX_KV_SPLITS": "# Upper bound on splits per request (keeps the fp32 partials small).",
    "PROGRAMS_PER_SM": "# Stage-1 programs per SM the split count aims for.",
    "BLOCK_R_CHOICES": (
        "# Query rows per program (BLOCK_R): tl.dot needs >= 16, and 32 is the register cap\n"
        "# with MLA's 512-wide fp32 accumulator."
    ),
    "STAGE1_NUM_STAGES": (
        "# Software-pipeline depths of stage 1, preferred first; a device whose shared memory\n"
        "# per block cannot hold the first build gets the next (same arithmetic, no prefetch)."
    ),
}
LAUNCHER_DEFS = ("ChainVerifyShape", "choose_num_kv_splits", "workspace_numel", "launch_config",
                 "choose_num_stages", "_stage1_num_stages", "_workspace_views",
                 "launch_with_config", "chain_verify_attention_fwd")
PROGRAMS = ("_chain_verify_stage1", "_chain_verify_stage2")

FWD_DOC = '''    """Run the two-stage chain attention; writes and returns ``o`` ([T, H, Dv], T = bs x
    ``shape.num_draft_tokens``).

    ``att_out_flat`` / ``att_lse_flat``: 1-D fp32 scratch with at least ``workspace_numel(shape,
    bs, num_kv_splits)`` elements (static buffers under a CUDA graph). ``seq_lens_include_chain``:
    ``seq_lens`` holds the length with the chain (``DRAFT_EXTEND_V2``: prefix +
    ``num_draft_tokens``); the prefix is then ``max(seq_lens - num_draft_tokens, 0)``, so a padded
    row with ``seq_lens`` 1 reads only its ``num_draft_tokens`` chain slots. Launch settings come
    from :func:`launch_config`, with stage 1's pipeline depth lowered on a device whose shared
    memory cannot hold the default (:func:`choose_num_stages`).

    Raises:
        ValueError: inconsistent shapes or strides, or a workspace too small for the batch (one
            line each).
    """
'''

# Words the copy must not carry (repository, test scaffolding, measurements); case-insensitive.
FORBIDDEN = (r"\bfaults?\b", r"sglang_verify_graph", r"\bplugin", r"\bmeasured\b", r"\bh200\b",
             r"\bdocs/", r"\btest/", r"\btests only\b")


def _defs(tree: ast.Module) -> dict[str, ast.stmt]:
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name):
                    out[t.id] = node
    return out


def _segment(text: str, node: ast.stmt) -> str:
    """The source lines of ``node``, decorators included."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(text.splitlines(keepends=True)[first - 1:node.end_lineno])


def _drop_spans(text: str, spans: list[tuple[int, int]]) -> str:
    lines = text.splitlines(keepends=True)
    for first, last in sorted(spans, reverse=True):
        del lines[first - 1:last]
    return "".join(lines)


def _uses(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _need(defs: dict, names, where: Path) -> None:
    missing = [n for n in names if n not in defs]
    if missing:
        raise AnchorError(f"{where.relative_to(ROOT)}: definition(s) {missing} not found")


def strip_program_faults(text: str, where: str = "triton_chain.py") -> str:
    """``text`` (one ``@triton.jit`` program) without the ``FAULT`` constexpr: its parameter and
    every ``if FAULT ...:`` block. Raises AnchorError if ``FAULT`` is read any other way."""
    text = re.sub(r",?\s*FAULT: tl\.constexpr = 0(?=,?\s*\))", "", text)
    text = re.sub(r"\s*FAULT: tl\.constexpr = 0,", "", text)
    func = ast.parse(text).body[0]
    spans = [(n.lineno, n.end_lineno) for n in ast.walk(func)
             if isinstance(n, ast.If) and _uses(n.test, "FAULT")]
    text = _drop_spans(text, spans)
    if re.search(r"\bFAULT\b", text):
        raise AnchorError(f"{where}: FAULT read outside an 'if FAULT ...:' block")
    return text


def strip_launcher_fault(text: str, where: str = "chain_verify_attention.py") -> str:
    """``chain_verify_attention_fwd``'s text without its ``fault`` argument and the statements
    that read it, its docstring replaced by :data:`FWD_DOC`."""
    text, n = re.subn(r"\s*fault: str \| None = None,", "", text)
    if n != 1:
        raise AnchorError(f"{where}: chain_verify_attention_fwd has no 'fault: str | None = None' "
                          "argument")
    func = ast.parse(text).body[0]
    text = _drop_spans(text, [(s.lineno, s.end_lineno) for s in func.body if _uses(s, "fault")])
    doc = ast.parse(text).body[0].body[0]
    if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
        raise AnchorError(f"{where}: chain_verify_attention_fwd has no docstring")
    lines = text.splitlines(keepends=True)
    lines[doc.lineno - 1:doc.end_lineno] = [FWD_DOC]
    return "".join(lines)


def _free_names(text: str) -> set[str]:
    tree = ast.parse(text)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.comprehension):
            bound |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - bound


def kernel_module() -> str:
    """The text of ``chain_verify.py`` for the series (see the module docstring)."""
    launcher_path = KERNEL_DIR / "chain_verify_attention.py"
    programs_path = KERNEL_DIR / "triton_chain.py"
    launcher = launcher_path.read_text()
    programs = programs_path.read_text()
    backend = CHAIN_BACKEND.read_text()
    l_defs, p_defs, b_defs = _defs(ast.parse(launcher)), _defs(ast.parse(programs)), _defs(ast.parse(backend))
    _need(l_defs, list(CONSTANTS) + list(LAUNCHER_DEFS) + ["_STAGE1_STAGES"], launcher_path)
    _need(p_defs, PROGRAMS, programs_path)
    _need(b_defs, ("_TILE_SPLITS", "rope_tile"), CHAIN_BACKEND)

    parts = []
    for name, comment in CONSTANTS.items():
        value = ast.literal_eval(l_defs[name].value)
        parts.append(f"{comment}\n{name} = {value!r}\n")
    parts.append(f"# Trailing widths of Dk loaded as a separate (rope) tile.\n"
                 f"_TILE_SPLITS = {ast.literal_eval(b_defs['_TILE_SPLITS'].value)!r}\n")
    body = "\n".join(parts) + "\n"
    for name in PROGRAMS:
        body += "\n" + strip_program_faults(_segment(programs, p_defs[name])) + "\n"
    body += "\n" + _segment(backend, b_defs["rope_tile"]) + "\n"
    for name in LAUNCHER_DEFS:
        seg = _segment(launcher, l_defs[name])
        if name == "chain_verify_attention_fwd":
            seg = strip_launcher_fault(seg)
        if name == "_stage1_num_stages":
            body += ("\n# (device, dtypes, stage-1 config) -> the num_stages chosen there; filled on "
                     "first use.\n_STAGE1_STAGES: dict = {}\n\n")
        body += "\n" + seg + "\n"

    template = API_TEMPLATE.read_text()
    if template.count(BODY_MARK) != 1:
        raise AnchorError(f"{API_TEMPLATE.name}: expected one line {BODY_MARK.strip()!r}")
    text = template.replace(BODY_MARK, body.strip("\n") + "\n\n")
    text = re.sub(r"\n{3,}(?=[^\n])", "\n\n\n", text)  # two blank lines between definitions
    found = [w for w in FORBIDDEN if re.search(w, text, re.IGNORECASE)]
    if found:
        raise AnchorError(f"chain_verify.py: the copy still mentions {found}")
    free = _free_names(text)
    if free:
        raise AnchorError(f"chain_verify.py: reads undefined name(s) {sorted(free)}")
    return text
