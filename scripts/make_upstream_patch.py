#!/usr/bin/env python3
"""Write the upstream SGLang patch series of the split-KV chain verify kernel.

Usage:
    python scripts/make_upstream_patch.py SGLANG_SRC [--out DIR]

``SGLANG_SRC`` is an SGLang 0.5.23 (or later) source tree: a git checkout's root, its ``python/``
folder, or an unpacked ``sglang`` package (e.g. a copy of ``site-packages/sglang``). It is read
as text: neither SGLang nor this repository's package is imported, so the script runs on a bare
Python 3.10+. The series (``git format-patch``-style ``NNNN-*.patch`` files and ``series``) is
written to ``DIR`` (default ``out/upstream_patch``) with the paths of the upstream repository
(``python/sglang/...``, ``test/registered/...``, ``benchmark/kernels/...``): apply it from a
checkout's root with ``git apply DIR/*.patch`` (or ``git am``, or ``patch -p1`` in order); for an
unpacked package, from a folder that holds it as ``python/sglang``.

The series (``docs/upstream_pr.md`` is its pull-request text):

1. ``kernels/ops/attention/chain_verify.py``: the chain kernel (from this repository's kernel
   files, without their test scaffolding); the Triton backend's TARGET_VERIFY dispatch for topk
   == 1 chains (MHA/GQA and absorbed MLA) behind ``SGLANG_ENABLE_CHAIN_VERIFY``, with the QLEN_ONLY
   verify mask and ``--triton-attention-num-kv-splits`` as the split cap; the kernel test
   ``test/registered/attention/test_chain_verify.py``; the micro-benchmark
   ``benchmark/kernels/chain_verify_triton/bench_chain_verify.py``.
2. The same kernel for the draft's ``DRAFT_EXTEND_V2`` behind ``SGLANG_ENABLE_CHAIN_DRAFT_EXTEND``,
   and its kernel test.

Every diff is computed before anything is written: a missing anchor (a tree of another layout)
writes nothing and ends with one line naming the file and the anchor.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper modules beside this script

from upstream_patch_edits import (  # noqa: E402
    AnchorError,
    edit_attention_ops_pr1,
    edit_environ_pr1,
    edit_environ_pr2,
    edit_triton_backend_pr1,
    edit_triton_backend_pr2,
    template,
)
from upstream_patch_kernel import kernel_module  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
AUTHOR = "sglang-chain-verify <sglang-chain-verify@users.noreply.github.com>"
DATE = "Sat, 29 Nov 2026 00:00:00 +0000"
TARGET = (0, 5, 23)
"""The release the series is written and checked against (the latest when it was written)."""

KERNEL = "python/sglang/kernels/ops/attention/chain_verify.py"
ATTENTION_OPS = "python/sglang/kernels/ops/attention/__init__.py"
ENVIRON = "python/sglang/srt/environ.py"
TRITON_BACKEND = "python/sglang/srt/layers/attention/triton_backend.py"
KERNEL_TEST = "test/registered/attention/test_chain_verify.py"
KERNEL_BENCH = "benchmark/kernels/chain_verify_triton/bench_chain_verify.py"

SUBJECTS = {
    1: ("triton: split-KV chain verify kernel for topk-1 EAGLE target verify",
        """\
A decode-class Triton kernel for the target verify of a linear (topk == 1)
draft chain, for MHA/GQA and absorbed MLA: grid (bs, kv_heads x row_blocks,
splits); all num_draft_tokens x GQA-group query rows of a KV head (MLA: all
heads on the shared latent) in one tile, so each KV block is read once per
split; a causal limit per draft position instead of a tree mask; key slots
read from req_to_token; splits merged by log-sum-exp.

TritonAttnBackend offers each TARGET_VERIFY forward_extend call to it
(chain_verify_fwd) before the split-KV verify paths when
SGLANG_ENABLE_CHAIN_VERIFY is set (default off), on CUDA, topk == 1, without
sliding window, DCP, deterministic inference or translated KV ids. A call it
does not serve (FP8 KV cache, non-unit KV scales, sinks, sliding-window
layers, xai temperature, ragged verify) returns False and runs
extend_attention_fwd as before. With the switch on the target asks for the
QLEN_ONLY verify mask (is_read=False) and reads no custom mask: for topk == 1
the tree mask is the causal chain. The split count is the kernel's (about two
programs per SM), capped by --triton-attention-num-kv-splits. The kernel is
imported only when the switch is on.

Tests: test/registered/attention/test_chain_verify.py (per-row parity with a
float64 reference and with extend_attention_fwd; GQA 1-16, head dims
64/96/128/256, MLA 576/512 at 8/16/128 heads, logit cap, split counts; the
refused calls). Benchmark: benchmark/kernels/chain_verify_triton/."""),
    2: ("triton: chain verify kernel for the draft's DRAFT_EXTEND_V2",
        """\
The draft's draft-extend backend (a TritonAttnBackend of the draft model
runner) runs DRAFT_EXTEND_V2 with the same kernel when
SGLANG_ENABLE_CHAIN_DRAFT_EXTEND is set (default off): seq_lens include the
chain, so the kernel reads the prefix max(seq_lens - num_draft_tokens, 0)
plus the chain's num_draft_tokens slots from req_to_token, and a padded
graph row (seq_lens 1) reads only its chain slots. Eager batches get fresh
scratch, the draft-extend CUDA graph the backend's cuda_graph_attn_logits.
EAGLEWorkerV2 and EAGLEDraftExtendCudaGraphRunner.execute(forward_batch,
select_index) are unchanged. Calls the kernel does not serve run
extend_attention_fwd as before.

Test: the draft-extend lengths in test_chain_verify.py (padded rows
included)."""),
}


def read_version(pkg: Path) -> tuple[int, ...] | None:
    """The release of the ``sglang`` package at ``pkg`` from its generated ``_version.py`` (ints),
    or None when the tree has none (a checkout that was never built)."""
    path = pkg / "_version.py"
    if not path.is_file():
        return None
    m = re.search(r"^__version__\s*=.*?['\"](\d+)\.(\d+)\.(\d+)", path.read_text(), re.M)
    return tuple(int(x) for x in m.groups()) if m else None


def locate(src: Path) -> Path:
    """The ``sglang`` package directory of ``src`` (a checkout root, its ``python/``, or the
    package itself). Raises SystemExit with one line when there is none."""
    src = src.resolve()
    for pkg in (src, src / "sglang", src / "python" / "sglang"):
        if (pkg / "srt" / "layers" / "attention" / "triton_backend.py").is_file():
            return pkg
    raise SystemExit(f"make_upstream_patch.py: SGLANG_SRC {src}: no SGLang source tree there "
                     "(expected srt/layers/attention/triton_backend.py in it, in sglang/ or in "
                     "python/sglang/); pass a checkout, its python/ folder or an unpacked package")


def file_diff(path: str, old: str | None, new: str) -> str:
    a = old.splitlines(keepends=True) if old is not None else []
    b = new.splitlines(keepends=True)
    head = f"diff --git a/{path} b/{path}\n"
    if old is None:
        head += "new file mode 100644\n"
    body = "".join(difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{path}",
                                        f"b/{path}", n=3))
    if not body.endswith("\n"):
        body += "\n\\ No newline at end of file\n"
    return head + body


def write_patch(out: Path, number: int, total: int, diffs: list[str]) -> Path:
    subject, body = SUBJECTS[number]
    slug = re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")[:52]
    path = out / f"{number:04d}-{slug}.patch"
    path.write_text(
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: {AUTHOR}\n"
        f"Date: {DATE}\nSubject: [PATCH {number}/{total}] {subject}\n\n{body.strip()}\n---\n"
        + "".join(diffs) + "-- \n2.43.0\n\n")
    return path


def series(pkg: Path) -> list[list[str]]:
    """The diffs of each patch, computed against the package at ``pkg`` (nothing written)."""
    def read(rel: str) -> str:
        path = pkg / rel[len("python/sglang/"):]
        if not path.is_file():
            raise AnchorError(f"{rel}: file missing from the SGLang tree")
        return path.read_text()

    for rel in (KERNEL,):
        if (pkg / rel[len("python/sglang/"):]).exists():
            raise AnchorError(f"{rel} already exists: is the series applied already?")

    def edited(rel: str, text: str, edit) -> str:
        return "".join(edit(text.splitlines(keepends=True), rel))

    environ0, backend0, ops0 = read(ENVIRON), read(TRITON_BACKEND), read(ATTENTION_OPS)
    environ1 = edited(ENVIRON, environ0, edit_environ_pr1)
    backend1 = edited(TRITON_BACKEND, backend0, edit_triton_backend_pr1)
    ops1 = edited(ATTENTION_OPS, ops0, edit_attention_ops_pr1)
    environ2 = edited(ENVIRON, environ1, edit_environ_pr2)
    backend2 = edited(TRITON_BACKEND, backend1, edit_triton_backend_pr2)
    test1, test2 = template("kernel_test.py", False), template("kernel_test.py", True)
    pr1 = [
        file_diff(KERNEL, None, kernel_module()),
        file_diff(ATTENTION_OPS, ops0, ops1),
        file_diff(ENVIRON, environ0, environ1),
        file_diff(TRITON_BACKEND, backend0, backend1),
        file_diff(KERNEL_TEST, None, test1),
        file_diff(KERNEL_BENCH, None, template("kernel_bench.py", False)),
    ]
    pr2 = [
        file_diff(ENVIRON, environ1, environ2),
        file_diff(TRITON_BACKEND, backend1, backend2),
        file_diff(KERNEL_TEST, test1, test2),
    ]
    return [pr1, pr2]


def build(src: Path, out: Path) -> list[Path]:
    pkg = locate(src)
    version = read_version(pkg)
    if version is not None and version < TARGET:
        raise AnchorError(
            f"SGLANG_SRC is sglang {'.'.join(map(str, version))}; the series targets "
            f"{'.'.join(map(str, TARGET))} or later: pass a {'.'.join(map(str, TARGET))} package "
            "or a checkout of main")
    patches = series(pkg)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    paths = [write_patch(out, n, len(patches), diffs) for n, diffs in enumerate(patches, 1)]
    (out / "series").write_text("".join(p.name + "\n" for p in paths))
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sglang_src", type=Path,
                    help="SGLang checkout (root or python/) or an unpacked sglang package")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "upstream_patch")
    args = ap.parse_args(argv)
    try:
        paths = build(args.sglang_src, args.out)
    except AnchorError as e:
        print(f"make_upstream_patch.py: {e}", file=sys.stderr)
        return 1
    pkg = locate(args.sglang_src)
    version = read_version(pkg)
    where = pkg.parent.parent if pkg.parent.name == "python" else None
    print(f"wrote {len(paths)} patches to {args.out} (against sglang "
          f"{'.'.join(map(str, version)) if version else 'of unknown version'} at {pkg}):")
    for p in paths:
        print(f"  {p.name}")
    print(f"apply in {where}" if where else
          "apply in a folder that holds this package as python/sglang (repository paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
