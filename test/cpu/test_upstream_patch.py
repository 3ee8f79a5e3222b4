"""scripts/make_upstream_patch.py against the SGLang 0.5.23 source.

The source is the ``sglang`` package of an SGLang 0.5.23 install: this interpreter's when it is
0.5.23, else the 0.5.23 CPU venv (``scripts/sglang_versions.sh --venv 0.5.23``, made by
``scripts/setup_cpu_env.sh``); without one the module is skipped with that one reason. The package
is laid out as an upstream checkout (``<tmp>/python/sglang``, hard links), the series is generated
by a Python that cannot import SGLang (``-I -S``), and then:

- each patch applies in order with ``git apply`` (checked first), and with ``patch -p1`` without
  offset or fuzz; PR 1 alone applies and compiles too;
- every new and edited module compiles;
- in the 0.5.23 interpreter, with the patched tree first on ``sys.path`` and ``TRITON_INTERPRET=1``:
  the patched ``TritonAttnBackend`` is constructed for real (stand-in runtime contexts and model
  runner) with the switches off and on. Off, it imports no new module and keeps SGLang's path
  (FULL_MASK, ``extend_attention_fwd``). On, it takes the QLEN_ONLY mask, its TARGET_VERIFY
  (eager and CUDA-graph metadata) runs the chain kernel, a call the kernel refuses and a ragged
  verify run ``extend_attention_fwd`` reading no mask, and the draft's DRAFT_EXTEND_V2 runs the
  chain kernel with its own switch. Every output matches a float64 reference. The construction
  gate refuses topk > 1, sliding window, DCP, deterministic inference, translated KV ids and
  non-CUDA;
- the series' own kernel test (``test/registered/attention/test_chain_verify.py``) passes there,
  and fails on a kernel copy whose causal limit is off by one;
- a missing anchor, an older release and a folder that is no SGLang tree each end the generator
  with one line.
"""

import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_upstream_patch.py"
TARGET = "0.5.23"
KERNEL = "python/sglang/kernels/ops/attention/chain_verify.py"
TRITON_BACKEND = "python/sglang/srt/layers/attention/triton_backend.py"
ENVIRON = "python/sglang/srt/environ.py"
ATTENTION_OPS = "python/sglang/kernels/ops/attention/__init__.py"
KERNEL_TEST = "test/registered/attention/test_chain_verify.py"
KERNEL_BENCH = "benchmark/kernels/chain_verify_triton/bench_chain_verify.py"
PR_FILES = {
    1: [KERNEL, ATTENTION_OPS, ENVIRON, TRITON_BACKEND, KERNEL_TEST, KERNEL_BENCH],
    2: [ENVIRON, TRITON_BACKEND, KERNEL_TEST],
}
_PROBE = ("import importlib.util, importlib.metadata, json; s = importlib.util.find_spec('sglang'); "
          "print(json.dumps([list(s.submodule_search_locations)[0], importlib.metadata.version('sglang')]"
          " if s else None))")


def _sglang_at(python: str):
    """(package dir, version) of ``python``'s sglang, found without importing it; None if none."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
    return (Path(found[0]), found[1]) if found else None


@pytest.fixture(scope="module")
def source():
    """(sglang package dir, python) of the SGLang 0.5.23 install the series is checked against."""
    venv = subprocess.run(["bash", str(ROOT / "scripts" / "sglang_versions.sh"), "--venv", TARGET],
                          capture_output=True, text=True).stdout.strip()
    candidates = [sys.executable] + ([f"{venv}/bin/python"] if venv else [])
    for python in candidates:
        if os.path.exists(python):
            found = _sglang_at(python)
            if found and found[1] == TARGET:
                return found[0], python
    pytest.skip(f"no SGLang {TARGET} source: neither this interpreter's sglang nor "
                f"{venv or 'its CPU venv'} is {TARGET} (make it: SGLANG_VERSION={TARGET} "
                "bash scripts/setup_cpu_env.sh)")


def _checkout(pkg: Path, root: Path) -> Path:
    """``root`` laid out as an upstream checkout: ``root/python/sglang`` = ``pkg`` as hard links
    (copies where linking fails); the files a patch touches are made real copies before it is
    applied (:func:`_apply`), so the source install is never written."""
    try:
        shutil.copytree(pkg, root / "python" / "sglang", copy_function=os.link)
    except OSError:
        shutil.rmtree(root / "python" / "sglang", ignore_errors=True)
        shutil.copytree(pkg, root / "python" / "sglang")
    return root


def _touched(patch: Path) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), re.M)


def _apply(root: Path, patch: Path) -> None:
    for rel in _touched(patch):
        path = root / rel
        if path.exists():  # break the hard link: the patch replaces a private copy
            data = path.read_bytes()
            path.unlink()
            path.write_bytes(data)
    check = subprocess.run(["git", "apply", "--check", "-v", str(patch)], cwd=root,
                           capture_output=True, text=True)
    assert check.returncode == 0, f"{patch.name} does not apply: {check.stderr.strip()}"
    subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)


def _make(src: Path, out: Path):
    # -I -S: no site-packages, so neither SGLang nor this repository's package is importable
    return subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), str(src), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def series(source, tmp_path_factory):
    """(the pristine checkout, the patch files), generated for it."""
    root = _checkout(source[0], tmp_path_factory.mktemp("pristine"))
    out = tmp_path_factory.mktemp("patches")
    proc = _make(root / "python" / "sglang", out)
    assert proc.returncode == 0, proc.stderr
    patches = sorted(out.glob("*.patch"))
    assert [p.name for p in patches] == (out / "series").read_text().split()
    return root, patches


@pytest.fixture(scope="module")
def applied(source, series, tmp_path_factory):
    root = _checkout(source[0], tmp_path_factory.mktemp("applied"))
    for patch in series[1]:
        _apply(root, patch)
    return root


def test_generator_cannot_import_sglang():
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", "import sglang"], capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "No module named 'sglang'" in proc.stderr


def test_series_shape(series):
    _, patches = series
    assert len(patches) == 2
    for number, patch in enumerate(patches, 1):
        text = patch.read_text()
        head = text.splitlines()[:4]
        assert head[1].startswith("From: ") and head[3].startswith(f"Subject: [PATCH {number}/2] ")
        assert _touched(patch) == PR_FILES[number], patch.name
        # nothing of this repository, no test scaffolding in what SGLang gets
        for word in (r"sglang_verify_graph", r"\bplugin\b", r"\bFAULT\b", r"\bfault\b",
                     r"SGLANG_VERIFY_GRAPH", r"--enable-verify-cuda-graph"):
            assert not re.search(word, text), (patch.name, word)
    first = patches[0].read_text()
    for new in (KERNEL, KERNEL_TEST, KERNEL_BENCH):
        assert f"+++ b/{new}\n" in first and f"diff --git a/{new} b/{new}\nnew file mode" in first
    assert "register_cuda_ci(est_time=30, stage=\"base-b\", runner_config=\"1-gpu-small\")" in first
    # the kernel is imported only where the switch is on (inside __init__, under the decision)
    assert re.search(r"\+        if self\.use_chain_verify:\n"
                     r"\+            from sglang\.kernels\.ops\.attention\.chain_verify import", first)


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch(1) not installed")
def test_every_patch_applies_with_patch_p1_without_offset_or_fuzz(series, tmp_path):
    root, patches = series
    for rel in {r for p in patches for r in _touched(p)}:
        if (root / rel).exists():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / rel, tmp_path / rel)
    for patch in patches:  # in order: PR 2 edits what PR 1 wrote
        proc = subprocess.run(["patch", "-p1", "--forward", "-i", str(patch)], cwd=tmp_path,
                              capture_output=True, text=True)
        assert proc.returncode == 0, (patch.name, proc.stdout, proc.stderr)
        assert not re.search(r"offset|fuzz", proc.stdout, re.I), proc.stdout


def test_pr1_alone_applies_and_compiles(source, series, tmp_path):
    root = _checkout(source[0], tmp_path)
    _apply(root, series[1][0])
    for rel in PR_FILES[1]:
        py_compile.compile(str(root / rel), doraise=True,
                           cfile=str(tmp_path / "pyc" / (rel.replace("/", "_") + "c")))
    assert "use_chain_draft_extend" not in (root / TRITON_BACKEND).read_text()


def test_patched_modules_compile(applied, tmp_path):
    for rel in PR_FILES[1]:
        py_compile.compile(str(applied / rel), doraise=True,
                           cfile=str(tmp_path / (rel.replace("/", "_") + "c")))


_DRIVER = textwrap.dedent('''
    import importlib.util, json, os, sys, types, unittest
    from types import SimpleNamespace

    import torch

    TREE = sys.argv[1]
    import sglang

    assert sglang.__file__.startswith(TREE + "/python/"), sglang.__file__
    CHAIN_MOD = "sglang.kernels.ops.attention.chain_verify"
    out = {}

    import sglang.srt.layers.attention.triton_backend as tb
    from sglang.srt.environ import envs
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    out["imported_with_backend"] = CHAIN_MOD in sys.modules
    out["env_defaults"] = [envs.SGLANG_ENABLE_CHAIN_VERIFY.get(),
                           envs.SGLANG_ENABLE_CHAIN_DRAFT_EXTEND.get()]
    H, KVH, D, NDT, CTX, SLOTS = 4, 2, 64, 3, 256, 8 * 256 + 1


    class Pool:  # a one-layer MHA KV pool on the CPU
        def __init__(self, g):
            self.k = torch.randn(SLOTS, KVH, D, generator=g)
            self.v = torch.randn(SLOTS, KVH, D, generator=g)
            self.start_layer = 0

        def get_key_buffer(self, layer_id):
            return self.k

        def get_value_buffer(self, layer_id):
            return self.v

        def get_kv_buffer(self, layer_id):
            return self.k, self.v

        def set_kv_buffer(self, layer, loc, k, v, *args, **kwargs):
            self.k[loc.loc] = k
            self.v[loc.loc] = v


    class Translator:  # req_to_token holds slot ids: the read stream is a gather of it
        is_translating = False

        def __init__(self, req_to_token):
            self.req_to_token = req_to_token

        def pack_read_stream(self, plan, *, req_pool_indices, seq_lens, indptr, out, **kw):
            for i in range(seq_lens.shape[0]):
                n, at = int(seq_lens[i]), int(indptr[i])
                out[at:at + n] = self.req_to_token[int(req_pool_indices[i]), :n]
            return True


    # the runtime contexts of a resolved EAGLE3 topk-1 launch (triton, TP 1, 4 KV splits)
    tb.get_exec = lambda: SimpleNamespace(
        kernel=SimpleNamespace(enable_lean_attention=None, triton_attention_num_kv_splits=4,
                               triton_attention_split_tile_size=None),
        deterministic=SimpleNamespace(enable_deterministic_inference=False),
        dllm=SimpleNamespace(dllm_algorithm=None))
    tb.get_spec = lambda: SimpleNamespace(speculative_num_draft_tokens=NDT,
                                          speculative_num_steps=NDT - 1, speculative_eagle_topk=1)
    tb.get_parallel = lambda: SimpleNamespace(attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0)
    tb.get_schedule = lambda: SimpleNamespace(chunked_prefill_size=8192)
    tb.mambaish_config = lambda mc: None
    tb.get_device_core_count = lambda gpu_id: 4
    tb.cuda_graph_fully_disabled = lambda: False
    tb.check_cuda_graph_backend = lambda *a: False
    tb.is_arch_support_pdl = lambda: False


    def backend(is_draft, cuda, env, g):
        # 8 page-table rows of distinct slots (slot 0 unused, as in SGLang's pools)
        req_to_token = (torch.randperm(SLOTS - 1, generator=g)[: 8 * CTX] + 1).view(8, CTX)
        req_to_token = req_to_token.to(torch.int32)
        mc = SimpleNamespace(
            attention_arch=None, hf_config=SimpleNamespace(), context_len=CTX, head_dim=D,
            v_head_dim=D, swa_v_head_dim=None, is_encoder_decoder=False,
            get_max_num_attention_heads=lambda: H, get_num_kv_heads=lambda tp, dcp=1: KVH)
        runner = SimpleNamespace(
            req_to_token_pool=SimpleNamespace(size=8, req_to_token=req_to_token),
            sliding_window_size=None, token_to_kv_pool=Pool(g), token_to_kv_pool_allocator=None,
            page_size=1, kv_index_translator=Translator(req_to_token),
            decode_num_tokens_per_req=lambda: NDT, model_config=mc, is_draft_worker=is_draft,
            spec_algorithm=SimpleNamespace(is_dspark=lambda: False), gpu_id=0, device="cpu",
            kv_cache_dtype=torch.float32)
        tb._is_cuda = cuda
        os.environ.update(env)
        try:
            return tb.TritonAttnBackend(runner)
        finally:
            for name in env:
                del os.environ[name]


    def layer(**kw):
        fields = dict(layer_id=0, tp_q_head_num=H, tp_k_head_num=KVH, qk_head_dim=D,
                      v_head_dim=D, scaling=D ** -0.5, logit_cap=0.0, logit_capping_method="tanh",
                      k_scale=None, v_scale=None, k_scale_float=1.0, v_scale_float=1.0,
                      sliding_window_size=-1, is_cross_attention=False,
                      attn_type=AttentionType.DECODER, xai_temperature_len=-1)
        fields.update(kw)
        return SimpleNamespace(**fields)


    def batch(be, mode, prefix, g):
        """A batch of ``mode``: request i has prefix[i] keys before its chain, whose slots are
        req_to_token[req, prefix : prefix + NDT] (out_cache_loc)."""
        bs = len(prefix)
        rpi = torch.randperm(8, generator=g)[:bs].long()
        rows = be.req_to_token[rpi].long()
        loc = torch.cat([rows[i, p:p + NDT] for i, p in enumerate(prefix)])
        de = mode == ForwardMode.DRAFT_EXTEND_V2
        seq_lens = torch.tensor([p + NDT if de else p for p in prefix])
        # SGLang's FULL_MASK of a chain: row j of request i sees prefix_i + j + 1 keys
        mask = torch.cat([torch.ones(NDT, p + NDT, dtype=torch.uint8).tril(p).reshape(-1)
                          for p in prefix])
        spec = SimpleNamespace(custom_mask=mask, num_tokens_per_req=NDT,
                               extend_seq_lens_tensor=torch.full((bs,), NDT),
                               ragged_verify_layout=None)
        return SimpleNamespace(
            forward_mode=mode, batch_size=bs, req_pool_indices=rpi, seq_lens=seq_lens,
            seq_lens_sum=int(seq_lens.sum()), spec_info=spec, out_cache_loc=loc,
            out_cache_loc_is_physical=False, kv_loc_plan=None, encoder_lens=None,
            extend_prefix_lens=torch.tensor(prefix), extend_prefix_lens_cpu=list(prefix),
            extend_seq_lens=torch.full((bs,), NDT), extend_seq_lens_cpu=[NDT] * bs,
            mha_one_shot=False, attn_attend_prefix_cache=None, positions=None)


    def reference(be, fb, q, prefix, lay):
        """Float64 chain attention; with KV scales (extend_attention_fwd's FP8 path) the prefix
        keys' scores are scaled by k_scale and their values by v_scale, the chain's not."""
        kd = lay.k_scale_float if lay.k_scale is not None else 1.0
        vd = lay.v_scale_float if lay.k_scale is not None else 1.0
        k, v = be.token_to_kv_pool.k.double(), be.token_to_kv_pool.v.double()
        res = torch.empty(len(prefix) * NDT, H, D, dtype=torch.float64)
        for i, p in enumerate(prefix):
            row = be.req_to_token[int(fb.req_pool_indices[i])].long()
            for j in range(NDT):
                locs = row[: p + j + 1]
                ks = torch.ones(p + j + 1, dtype=torch.float64)
                ks[:p] = kd
                vs = torch.ones(p + j + 1, 1, dtype=torch.float64)
                vs[:p] = vd
                for h in range(H):
                    s = k[locs, h // (H // KVH)] @ q[i * NDT + j, h].double() * lay.scaling * ks
                    res[i * NDT + j, h] = s.softmax(0) @ (v[locs, h // (H // KVH)] * vs)
        return res


    def run(be, mode, prefix, lay, graph, seed, ragged=False):
        """One forward_extend of ``mode``: which kernels ran, whether the metadata carried a
        custom mask / the chain's scratch, and whether the output matches the reference."""
        g = torch.Generator().manual_seed(seed)
        fb = batch(be, mode, prefix, g)
        if ragged:
            fb.spec_info.ragged_verify_layout = object()
        q = torch.randn(len(prefix) * NDT, H * D, generator=g)
        k = torch.randn(len(prefix) * NDT, KVH, D, generator=g)
        v = torch.randn(len(prefix) * NDT, KVH, D, generator=g)
        if graph:
            be.init_forward_metadata_out_graph(fb, in_capture=True)
        else:
            be.init_forward_metadata(fb)
        md = be.forward_metadata
        info = {"mask": md.custom_mask is not None, "scratch": md.attn_logits is not None}
        calls = []
        wrapped = {}
        for attr, name in (("extend_attention_fwd", "extend"), ("chain_verify_fwd", "chain")):
            if hasattr(be, attr):
                wrapped[attr] = real = getattr(be, attr)
                setattr(be, attr, lambda *a, _r=real, _n=name, **kw: (calls.append(_n), _r(*a, **kw))[1])
        o = be.forward_extend(q, k, v, lay, fb)
        for attr, real in wrapped.items():
            setattr(be, attr, real)
        ref = reference(be, fb, q.view(-1, H, D), prefix, lay)
        err = ((o.view(-1, H, D).double() - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
        info.update(calls=calls, ok=err < 1e-4)
        return info


    g = torch.Generator().manual_seed(0)
    TV, DE = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2
    PREFIX = [5, 130, 200]

    off = backend(False, True, {}, g)
    off.init_cuda_graph_state(4, 4 * NDT)
    out["off"] = {"use": off.use_chain_verify,
                  "mask_mode": [off.verify_mask.mode.name, off.verify_mask.is_read],
                  "eager": run(off, TV, PREFIX, layer(), False, 1),
                  "graph": run(off, TV, PREFIX, layer(), True, 2),
                  "draft_extend": run(off, DE, PREFIX, layer(), False, 3)}
    out["on_without_cuda"] = backend(False, False, {"SGLANG_ENABLE_CHAIN_VERIFY": "1"}, g).use_chain_verify
    out["imported_while_off"] = CHAIN_MOD in sys.modules

    on = backend(False, True, {"SGLANG_ENABLE_CHAIN_VERIFY": "1"}, g)
    on.init_cuda_graph_state(4, 4 * NDT)
    out["on"] = {
        "use": on.use_chain_verify, "draft_extend_use": on.use_chain_draft_extend,
        "imported": CHAIN_MOD in sys.modules,
        "mask_mode": [on.verify_mask.mode.name, on.verify_mask.is_read],
        "eager": run(on, TV, PREFIX, layer(), False, 1),
        "graph": run(on, TV, PREFIX, layer(), True, 2),
        "kernel_refuses": run(on, TV, PREFIX, layer(k_scale=1.0, v_scale=1.0, k_scale_float=0.5),
                              False, 4),
        "ragged": run(on, TV, PREFIX, layer(), False, 5, ragged=True),
        "draft_extend": run(on, DE, PREFIX, layer(), False, 3),
        "draft_runner": backend(True, True, {"SGLANG_ENABLE_CHAIN_VERIFY": "1"}, g).use_chain_verify,
    }

    de = backend(True, True, {"SGLANG_ENABLE_CHAIN_DRAFT_EXTEND": "1"}, g)
    de.init_cuda_graph_state(4, 4 * NDT)
    out["draft_extend_on"] = {
        "use": de.use_chain_draft_extend, "verify_use": de.use_chain_verify,
        "eager": run(de, DE, PREFIX + [0], layer(), False, 6),
        "graph": run(de, DE, PREFIX, layer(), True, 7),
        "target_use": backend(False, True, {"SGLANG_ENABLE_CHAIN_DRAFT_EXTEND": "1"}, g).use_chain_draft_extend,
    }

    def gate(*args, cuda=True):
        tb._is_cuda = cuda
        return bool(tb._can_use_chain_kernel(*args))

    ok = SimpleNamespace(is_translating=False)
    out["gate"] = {
        "ok": gate(1, None, 1, False, ok), "topk2": gate(2, None, 1, False, ok),
        "sliding_window": gate(1, 4096, 1, False, ok), "dcp": gate(1, None, 2, False, ok),
        "deterministic": gate(1, None, 1, True, ok),
        "translating": gate(1, None, 1, False, SimpleNamespace(is_translating=True)),
        "no_cuda": gate(1, None, 1, False, ok, cuda=False),
    }

    # the series' own kernel test (CustomTestCase is unittest.TestCase's subclass; a CPU venv
    # without sglang.test.test_utils' serving dependencies gets unittest.TestCase itself)
    try:
        from sglang.test.test_utils import CustomTestCase  # noqa: F401
        out["custom_test_case"] = "sglang"
    except ImportError:
        stub = types.ModuleType("sglang.test.test_utils")
        stub.CustomTestCase = unittest.TestCase
        sys.modules["sglang.test.test_utils"] = stub
        out["custom_test_case"] = "unittest.TestCase"


    def load(path, name):
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up
        spec.loader.exec_module(mod)
        return mod


    def run_tests(mod):
        res = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(
            unittest.defaultTestLoader.loadTestsFromModule(mod))
        return {"run": res.testsRun, "failures": len(res.failures), "errors": len(res.errors),
                "skipped": len(res.skipped),
                "failed": sorted({getattr(t, "test_case", t)._testMethodName
                                  for t, _ in res.failures + res.errors})}


    reg = load(os.path.join(TREE, "test/registered/attention/test_chain_verify.py"), "test_chain_verify")
    out["registered"] = run_tests(reg)
    # the same test against a kernel whose causal limit lets each draft see the next key
    src = open(os.path.join(TREE, "python/sglang/kernels/ops/attention/chain_verify.py")).read()
    broken = src.replace("limit = prefix + j + 1", "limit = prefix + j + 2")
    assert broken != src
    path = os.path.join(sys.argv[2], "chain_verify_broken.py")
    open(path, "w").write(broken)
    mutant = load(path, "chain_verify_broken")
    reg.chain_verify_fwd = mutant.chain_verify_fwd
    out["registered_broken_kernel"] = run_tests(reg)
    print("RESULT " + json.dumps(out))
''')


def test_patched_tree_serves_the_chain(source, applied, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_ENABLE_CHAIN")}
    env.update(PYTHONPATH=str(applied / "python"), TRITON_INTERPRET="1",
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([source[1], "-c", _DRIVER, str(applied), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    chain = {"mask": False, "scratch": True, "calls": ["chain"], "ok": True}
    extend_full_mask = {"mask": True, "scratch": False, "calls": ["extend"], "ok": True}
    extend_no_mask = {"mask": False, "scratch": False, "calls": ["extend"], "ok": True}
    # off (the default): SGLang's path, and the kernel module never imported
    assert out["env_defaults"] == [False, False]
    assert out["imported_with_backend"] is False and out["imported_while_off"] is False
    assert out["off"] == {"use": False, "mask_mode": ["FULL_MASK", True],
                          "eager": extend_full_mask, "graph": extend_full_mask,
                          "draft_extend": extend_no_mask}
    assert out["on_without_cuda"] is False
    # on: the QLEN_ONLY mask, the chain kernel eager and under graph metadata; a call the kernel
    # refuses and a ragged verify run extend_attention_fwd, reading no mask
    on = out["on"]
    assert (on["use"], on["draft_extend_use"], on["imported"]) == (True, False, True)
    assert on["mask_mode"] == ["QLEN_ONLY", False]
    assert on["eager"] == chain and on["graph"] == chain
    assert on["kernel_refuses"] == {"mask": False, "scratch": True, "calls": ["chain", "extend"],
                                    "ok": True}
    assert on["ragged"] == {"mask": False, "scratch": True, "calls": ["extend"], "ok": True}
    assert on["draft_extend"] == extend_no_mask and on["draft_runner"] is False
    de = out["draft_extend_on"]
    assert (de["use"], de["verify_use"], de["target_use"]) == (True, False, False)
    assert de["eager"] == chain and de["graph"] == chain
    assert out["gate"] == {"ok": True, "topk2": False, "sliding_window": False, "dcp": False,
                           "deterministic": False, "translating": False, "no_cuda": False}
    # the series' kernel test passes here (the CUDA-only comparison skipped), and fails on a
    # kernel whose causal limit is one key too far
    reg = out["registered"]
    assert reg["failures"] == reg["errors"] == 0 and reg["run"] >= 7 and reg["skipped"] == 1, reg
    broken = out["registered_broken_kernel"]
    assert "test_matches_reference_per_row" in broken["failed"], broken
    assert "test_draft_extend_lengths_match_reference_per_row" in broken["failed"], broken


def _minimal_tree(pkg: Path, root: Path) -> Path:
    """The three files the series edits, under ``root/python/sglang``."""
    for rel in (TRITON_BACKEND, ENVIRON, ATTENTION_OPS):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pkg / rel[len("python/sglang/"):], root / rel)
    return root / "python" / "sglang"


@pytest.mark.parametrize("rel, old, new, message", [
    (TRITON_BACKEND, "            is_read=True,\n", "            is_read=bool(True),\n",
     f"{TRITON_BACKEND}: anchor not found after line "),
    (ENVIRON, "    SGLANG_ENABLE_SPLITKV_VERIFY = EnvBool(True)\n", "",
     f"{ENVIRON}: anchor not found after line 1: "
     "'    SGLANG_ENABLE_SPLITKV_VERIFY = EnvBool(True)'"),
    (TRITON_BACKEND, "        self.is_draft_runner = model_runner.is_draft_worker\n", "",
     f"{TRITON_BACKEND}: anchor not found after line "),
], ids=["verify_mask", "environ", "init"])
def test_missing_anchor_fails_loudly(source, tmp_path, rel, old, new, message):
    pkg = _minimal_tree(source[0], tmp_path / "tree")
    path = tmp_path / "tree" / rel
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    proc = _make(pkg, tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"make_upstream_patch.py: {message}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "out").glob("*.patch"))


def test_older_release_is_one_line(source, tmp_path):
    pkg = _minimal_tree(source[0], tmp_path / "tree")
    (pkg / "_version.py").write_text("__version__ = version = '0.5.16'\n")
    proc = _make(pkg, tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"make_upstream_patch.py: SGLANG_SRC is sglang 0.5.16; the series targets {TARGET} or "
        f"later: pass a {TARGET} package or a checkout of main")


def test_not_an_sglang_tree(tmp_path):
    proc = _make(tmp_path, tmp_path / "out")
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith(f"make_upstream_patch.py: SGLANG_SRC {tmp_path}: no SGLang "
                                          "source tree there")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_kernel_copy_refuses_a_surviving_fault_branch():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from upstream_patch_edits import AnchorError
        from upstream_patch_kernel import strip_program_faults
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    program = ("def f(X, FAULT: tl.constexpr = 0):\n    a = 1\n    if FAULT == 1:\n        a = 2\n"
               "    b = a + FAULT\n")
    with pytest.raises(AnchorError, match="FAULT read outside"):
        strip_program_faults(program)
    assert "FAULT" not in strip_program_faults(program.replace("    b = a + FAULT\n", ""))
