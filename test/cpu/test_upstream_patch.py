"""scripts/make_upstream_patch.py against the installed SGLang source of the pinned version (0.5.16).

The installed ``sglang`` package is copied to a temp dir, the series is generated for it and
applied with ``git apply`` (and dry-run with ``patch -p1`` where that tool exists); the new and
edited modules must compile, and the patched tree must import and serve the flag natively:
``--enable-verify-cuda-graph`` parses, a conflicting setting raises the one-line error, the runner,
backend and edited modules import. A missing anchor must stop the script with a clear message.
"""

import json
import os
import py_compile
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_verify_graph import sglang_adapter as sa

pytestmark = pytest.mark.skipif(
    sa.SGLANG_VERSION != "0.5.16",
    reason=f"the patch series targets the pinned sglang 0.5.16 (installed: {sa.SGLANG_VERSION})")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_upstream_patch.py"
EDITED = [
    "srt/server_args.py",
    "srt/layers/attention/attention_registry.py",
    "srt/model_executor/model_runner_components/cuda_graph_setup.py",
    "srt/managers/scheduler.py",
    "srt/speculative/eagle_worker_common.py",
]
NEW = [
    "kernels/ops/attention/chain_verify.py",
    "srt/speculative/verify_graph_config.py",
    "srt/layers/attention/chain_verify_backend.py",
    "srt/model_executor/runner/verify_graph_utils.py",
    "srt/model_executor/runner/verify_cuda_graph_runner.py",
    "srt/model_executor/runner/verify_graph_counters.py",
    "srt/model_executor/runner/verify_graph_buffers.py",
    "srt/model_executor/runner/verify_graph_selftest.py",
]


def _installed_sglang() -> Path:
    import sglang

    return Path(sglang.__file__).parent


def _copy_tree(dst: Path) -> Path:
    shutil.copytree(_installed_sglang(), dst / "sglang",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst / "sglang"


def _make(src: Path, out: Path):
    return subprocess.run([sys.executable, str(SCRIPT), str(src), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """(tree root, patch files) with the series generated for, not yet applied to, a copy."""
    root = tmp_path_factory.mktemp("sglang_src")
    pkg = _copy_tree(root)
    out = root / "patches"
    proc = _make(pkg, out)
    assert proc.returncode == 0, proc.stderr
    patches = sorted(out.glob("*.patch"))
    assert [p.name for p in patches] == (out / "series").read_text().split()
    return root, patches


@pytest.fixture(scope="module")
def applied(series):
    root, patches = series
    if shutil.which("git"):
        check = subprocess.run(["git", "apply", "--check", "-v", *map(str, patches)], cwd=root,
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        subprocess.run(["git", "apply", *map(str, patches)], cwd=root, check=True)
    else:  # no git: plain patch(1)
        for p in patches:
            subprocess.run(["patch", "-p1", "--forward", "-i", str(p)], cwd=root, check=True)
    return root


def test_series_shape(series):
    root, patches = series
    assert len(patches) == 5
    text = "".join(p.read_text() for p in patches)
    for rel in EDITED:
        assert f"diff --git a/sglang/{rel} b/sglang/{rel}\n" in text, rel
    for rel in NEW:
        assert f"+++ b/sglang/{rel}\n" in text and "new file mode" in text, rel
    # imports rewritten to native names
    assert "import sglang_verify_graph" not in text and "from sglang_verify_graph" not in text
    assert "sgl_verify_kernel" not in text
    for p in patches:
        head = p.read_text().splitlines()[:4]
        assert head[1].startswith("From: ") and head[3].startswith("Subject: [PATCH ")


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch(1) not installed")
def test_every_patch_applies_with_patch_p1(series):
    root, patches = series
    for p in patches:  # each touches files no other patch touches: independent dry runs
        proc = subprocess.run(["patch", "-p1", "--dry-run", "--forward", "-i", str(p)], cwd=root,
                              capture_output=True, text=True)
        assert proc.returncode == 0, (p.name, proc.stdout, proc.stderr)
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout


def test_patched_modules_compile(applied):
    for rel in EDITED + NEW:
        py_compile.compile(str(applied / "sglang" / rel), doraise=True,
                           cfile=str(applied / "pyc" / (rel.replace("/", "_") + "c")))


_DRIVER = textwrap.dedent("""
    import importlib, json, sys
    import sglang
    assert sglang.__file__.startswith(sys.argv[1]), sglang.__file__
    from sglang.srt.server_args import prepare_server_args
    base = sys.argv[2:]
    out = {"on": prepare_server_args(base + ["--enable-verify-cuda-graph"]).enable_verify_cuda_graph,
           "off": prepare_server_args(base).enable_verify_cuda_graph}
    try:
        prepare_server_args(base + ["--enable-verify-cuda-graph", "--speculative-eagle-topk", "4",
                                    "--speculative-num-draft-tokens", "8"])
    except ValueError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    for m in ("sglang.srt.model_executor.runner.verify_cuda_graph_runner",
              "sglang.srt.layers.attention.attention_registry",
              "sglang.srt.model_executor.model_runner_components.cuda_graph_setup",
              "sglang.srt.speculative.eagle_worker_common", "sglang.srt.managers.scheduler"):
        importlib.import_module(m)
    from sglang.srt.model_executor.runner.verify_cuda_graph_runner import VerifyCudaGraphRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.layers.attention.chain_verify_backend import ChainVerifyTritonBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    out["classes"] = (issubclass(VerifyCudaGraphRunner, DecodeCudaGraphRunner)
                      and issubclass(ChainVerifyTritonBackend, TritonAttnBackend))
    print("RESULT " + json.dumps(out))
""")


def test_patched_tree_serves_the_flag_natively(applied, tiny_model_dirs):
    target, draft = tiny_model_dirs
    env = {k: v for k, v in os.environ.items()
           if k != "SGLANG_ENABLE_VERIFY_CUDA_GRAPH" and not k.startswith("SGLANG_VERIFY_GRAPH_")}
    env["PYTHONPATH"] = str(applied)
    argv = ["--model-path", target, "--device", "cpu", "--skip-tokenizer-init",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", draft,
            "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
            "--attention-backend", "triton"]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(applied), *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["on"] is True and out["off"] is False and out["classes"] is True
    assert out["error"] == ("VerifyGraphConfigError: --enable-verify-cuda-graph: supports only a linear "
                            "draft chain (top-k 1) (--speculative-eagle-topk = 4). "
                            "Fix: pass --speculative-eagle-topk 1.")


def test_missing_anchor_fails_loudly(tmp_path):
    pkg = tmp_path / "sglang"
    for rel in EDITED:
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_installed_sglang() / rel, pkg / rel)
    reg = pkg / "srt/layers/attention/attention_registry.py"
    reg.write_text(reg.read_text().replace("    return TritonAttnBackend(runner)\n",
                                           "    return TritonAttnBackend(runner, None)\n"))
    proc = _make(pkg, tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "make_upstream_patch.py: sglang/srt/layers/attention/attention_registry.py: anchor not "
        "found after line 165: '    return TritonAttnBackend(runner)'")
    assert not list((tmp_path / "out").glob("*.patch"))


def test_not_an_sglang_tree(tmp_path):
    proc = _make(tmp_path, tmp_path / "out")
    assert proc.returncode != 0 and "no SGLang source tree" in proc.stderr
