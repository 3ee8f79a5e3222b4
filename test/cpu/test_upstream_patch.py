"""scripts/make_upstream_patch.py against the installed SGLang source of the pinned version (0.5.16).

The installed ``sglang`` package is copied to a temp dir, the series is generated for it and
applied with ``git apply`` (and dry-run with ``patch -p1`` where that tool exists); the new and
edited modules must compile, and the patched tree must import and serve the flag natively:
``--enable-verify-cuda-graph`` parses, a conflicting setting raises the one-line error (of the
native error type), the runner, backend, plan, draft-extend and edited modules import, the plan
gives the chain runner to a flag-on target with the chain backend and refuses one whose backend
the flag cannot serve (so does the runner's constructor), ``ModelRunner._forward_raw`` counts a
verify that does not replay the graph and an eager draft extend of the chain draft-extend backend,
and the draft's ``create_draft_extend_backend`` hands its backend to the draft-extend policy's
choice. A missing anchor must stop the script with a clear message.
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

from sglang_verify_graph.compat import sglang_adapter as adapter

pytestmark = pytest.mark.skipif(
    adapter.SGLANG_VERSION != "0.5.16",
    reason=f"the patch series targets the pinned sglang 0.5.16 (installed: {adapter.SGLANG_VERSION})")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_upstream_patch.py"
EDITED = [
    "srt/server_args.py",
    "srt/layers/attention/attention_registry.py",
    "srt/model_executor/model_runner_components/cuda_graph_setup.py",
    "srt/model_executor/model_runner.py",
    "srt/managers/scheduler.py",
    "srt/speculative/eagle_worker_common.py",
    "srt/speculative/draft_utils.py",
    "srt/speculative/eagle_worker_v2.py",
]
NEW = [
    "kernels/ops/attention/chain_verify.py",
    "kernels/ops/attention/chain_verify_triton.py",
    "srt/speculative/verify_graph_errors.py",
    "srt/speculative/verify_graph_env.py",
    "srt/speculative/verify_graph_config.py",
    "srt/speculative/verify_graph_backends.py",
    "srt/layers/attention/chain_verify_backend.py",
    "srt/model_executor/runner/verify_graph_utils.py",
    "srt/model_executor/runner/verify_graph_plan.py",
    "srt/model_executor/runner/verify_cuda_graph_runner.py",
    "srt/model_executor/runner/verify_graph_counters.py",
    "srt/model_executor/runner/verify_graph_buffers.py",
    "srt/model_executor/runner/verify_graph_probes.py",
    "srt/model_executor/runner/verify_graph_debug.py",
    "srt/model_executor/runner/verify_graph_selftest.py",
    "srt/speculative/verify_graph_draft_extend.py",
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
    assert len(patches) == 6
    text = "".join(p.read_text() for p in patches)
    for rel in EDITED:
        assert f"diff --git a/sglang/{rel} b/sglang/{rel}\n" in text, rel
    for rel in NEW:
        assert f"+++ b/sglang/{rel}\n" in text and "new file mode" in text, rel
    # imports rewritten to native names
    assert "import sglang_verify_graph" not in text and "from sglang_verify_graph" not in text
    assert "sglang_verify_graph.kernel" not in text
    # the native modules carry the pinned version's branch only: no switch on newer SGLang
    for name in ("RUNNER_CLS_HOOK", "RESOLVE_ONCE", "_since", "VerifyCudaGraphRunnerFromModelRunner",
                 "sglang_adapter", "triton_attn_backend_cls", "decode_cuda_graph_runner_cls",
                 "verify_graph_capture", "@hook(", "hooks import", "decode_graph_capture"):
        assert name not in text, name
    # SGLang 0.5.16 builds our runner as it builds its own: one constructor, from the model runner
    assert "+            runner = VerifyCudaGraphRunner(model_runner)\n" in text
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
    from types import SimpleNamespace
    import sglang
    assert sglang.__file__.startswith(sys.argv[1]), sglang.__file__
    from sglang.srt.server_args import prepare_server_args
    base = sys.argv[2:]
    on = prepare_server_args(base + ["--enable-verify-cuda-graph"])
    out = {"on": on.enable_verify_cuda_graph,
           "off": prepare_server_args(base).enable_verify_cuda_graph}
    try:
        prepare_server_args(base + ["--enable-verify-cuda-graph", "--speculative-eagle-topk", "4",
                                    "--speculative-num-draft-tokens", "8"])
    except ValueError as e:
        out["error"] = f"{type(e).__name__}: {e}"
        out["error_module"] = type(e).__module__
    for m in ("sglang.srt.model_executor.runner.verify_cuda_graph_runner",
              "sglang.srt.model_executor.runner.verify_graph_plan",
              "sglang.srt.speculative.verify_graph_draft_extend",
              "sglang.srt.speculative.draft_utils", "sglang.srt.speculative.eagle_worker_v2",
              "sglang.srt.layers.attention.attention_registry",
              "sglang.srt.model_executor.model_runner_components.cuda_graph_setup",
              "sglang.srt.model_executor.model_runner",
              "sglang.srt.speculative.eagle_worker_common", "sglang.srt.managers.scheduler"):
        importlib.import_module(m)
    from sglang.srt.model_executor.runner.verify_cuda_graph_runner import VerifyCudaGraphRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.layers.attention.chain_verify_backend import ChainVerifyTritonBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    out["classes"] = (issubclass(VerifyCudaGraphRunner, DecodeCudaGraphRunner)
                      and issubclass(ChainVerifyTritonBackend, TritonAttnBackend))

    # the plan's choice, with the flag on through the native ServerArgs field (no environment):
    # an EAGLE topk=1 target with the chain backend gets our runner; one whose backend is not the
    # chain backend gets none and a one-line error (the runner's constructor refuses it too); the
    # draft gets upstream's, no error
    from sglang.srt.model_executor.runner import verify_graph_plan as plan
    fields = dict(spec_algorithm=SimpleNamespace(is_eagle=lambda: True), is_draft_worker=False,
                  server_args=on)
    target = SimpleNamespace(**fields, attn_backend=object())
    out["kind"] = plan.runner_kind(target)
    out["chain_kind"] = plan.runner_kind(
        SimpleNamespace(**fields, attn_backend=object.__new__(ChainVerifyTritonBackend)))
    try:
        plan.refuse_if_flag_lost(target)
    except ValueError as e:
        out["refusal"] = str(e)
    try:
        VerifyCudaGraphRunner(target)
    except RuntimeError as e:
        out["runner_refusal"] = str(e)
    draft_runner = SimpleNamespace(**{**fields, "is_draft_worker": True}, attn_backend=object())
    plan.refuse_if_flag_lost(draft_runner)
    out["draft_kind"] = plan.verify_plan(draft_runner).kind

    # ModelRunner._forward_raw: a TARGET_VERIFY our runner refuses is counted before it runs eagerly
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.verify_graph_counters import VerifyCounters

    class Eager(Exception):
        pass

    def eager(forward_batch):
        raise Eager

    counters = VerifyCounters()

    class Refusing:
        def __init__(self, counters):
            if counters is not None:
                self.counters = counters

        def can_run_graph(self, forward_batch):
            if getattr(self, "counters", None) is not None:
                self.counters.note_refusal("batch_size_above_max_captured")
            return False

    def forward(mode, runner):
        mr = SimpleNamespace(device="cuda", attn_backend=None, decode_cuda_graph_runner=runner,
                             hisparse_coordinator=None, _prepare_eager_forward_batch=eager)
        try:
            ModelRunner._forward_raw(mr, SimpleNamespace(forward_mode=mode, batch_size=3), None)
        except Eager:
            return "eager"

    out["eager"] = [forward(ForwardMode.TARGET_VERIFY, Refusing(counters)),
                    forward(ForwardMode.DECODE, Refusing(counters)),
                    forward(ForwardMode.TARGET_VERIFY, Refusing(None))]
    out["fallbacks"] = dict(counters.fallbacks)
    out["eager_requests"] = counters.eager_requests

    # EAGLEWorkerV2.verify: SGLang's own count of verify steps and their requests
    from sglang.srt.speculative import eagle_worker_v2

    eagle_worker_v2.run_eagle_verify = lambda batch, **kwargs: "verified"
    worker = SimpleNamespace(**{n: None for n in (
        "target_worker", "req_to_token_pool", "token_to_kv_pool_allocator", "plan_stream",
        "plan_stream_ctx", "topk", "speculative_num_steps", "speculative_num_draft_tokens", "device")})
    verify_graph_counters_mod = importlib.import_module("sglang.srt.model_executor.runner.verify_graph_counters")
    verify_graph_counters_mod.install_counters(counters)
    out["verify"] = eagle_worker_v2.EAGLEWorkerV2.verify(worker, SimpleNamespace(batch_size=lambda: 5))
    out["verify_steps"] = [counters.verify_steps, counters.verify_requests]

    # the draft side: an eager DRAFT_EXTEND_V2 of a draft served by the chain draft-extend backend
    # is counted in _forward_raw (another backend's is not), and the factory's backend goes
    # through the draft-extend policy's choice
    from sglang.srt.layers.attention.chain_verify_backend import ChainDraftExtendTritonBackend
    from sglang.srt.model_executor.runner import verify_graph_counters
    from sglang.srt.speculative import verify_graph_draft_extend
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    verify_graph_counters.install_counters(counters)
    draft = SimpleNamespace(device="cuda", decode_cuda_graph_runner=None, hisparse_coordinator=None,
                            _prepare_eager_forward_batch=eager,
                            attn_backend=object.__new__(ChainDraftExtendTritonBackend))
    for mr in (draft, SimpleNamespace(**{**vars(draft), "attn_backend": object()})):
        try:
            ModelRunner._forward_raw(mr, SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND_V2), None)
        except Eager:
            pass
    out["draft_extend_eager"] = counters.draft_extend_eager
    verify_graph_draft_extend.draft_extend_backend_for = lambda runner, backend: ("chosen", runner, backend)
    factory = SimpleNamespace(server_args=SimpleNamespace(speculative_attention_mode="prefill"),
                              draft_model_runner="draft runner",
                              _create_backend=lambda *a: "triton backend")
    for name in dir(DraftBackendFactory):
        if name.startswith("_create_") and name.endswith("_backend") and name != "_create_backend":
            setattr(factory, name, None)
    out["draft_extend_backend"] = list(DraftBackendFactory.create_draft_extend_backend(factory))
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
    assert out["error_module"] == "sglang.srt.speculative.verify_graph_errors"
    assert out["kind"] is None and out["chain_kind"] == "chain" and out["draft_kind"] == "upstream"
    assert out["runner_refusal"] == "VerifyCudaGraphRunner needs ChainVerifyTritonBackend, got object"
    assert out["refusal"].startswith("--enable-verify-cuda-graph: with --attention-backend triton the "
                                     "verify graph serves ChainVerifyTritonBackend, but this model got "
                                     "another attention backend") and "\n" not in out["refusal"]
    assert out["eager"] == ["eager", "eager", "eager"]
    assert out["fallbacks"] == {"batch_size_above_max_captured": 1} and out["eager_requests"] == 3
    assert out["verify"] == "verified" and out["verify_steps"] == [1, 5]
    assert out["draft_extend_eager"] == 1
    assert out["draft_extend_backend"] == ["chosen", "draft runner", "triton backend"]


@pytest.mark.parametrize("rel, old, new, message", [
    ("srt/layers/attention/attention_registry.py", "    return TritonAttnBackend(runner)\n",
     "    return TritonAttnBackend(runner, None)\n",
     "sglang/srt/layers/attention/attention_registry.py: anchor not found after line 165: "
     "'    return TritonAttnBackend(runner)'"),
    ("srt/model_executor/model_runner.py", "            # Replay cuda graph if applicable\n", "",
     "sglang/srt/model_executor/model_runner.py: anchor not found after line 1393: "
     "'            # Replay cuda graph if applicable'"),
], ids=["attention_registry", "model_runner"])
def test_missing_anchor_fails_loudly(tmp_path, rel, old, new, message):
    pkg = tmp_path / "sglang"
    for edited in EDITED:
        (pkg / edited).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(_installed_sglang() / edited, pkg / edited)
    path = pkg / rel
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    proc = _make(pkg, tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"make_upstream_patch.py: {message}"
    assert not list((tmp_path / "out").glob("*.patch"))


def test_not_an_sglang_tree(tmp_path):
    proc = _make(tmp_path, tmp_path / "out")
    assert proc.returncode != 0 and "no SGLang source tree" in proc.stderr
