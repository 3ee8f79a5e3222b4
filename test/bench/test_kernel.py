"""``python -m bench kernel``: its dry run names the kernel's row-block policy per shape and draft
length, takes ``--block-rows`` of the kernel's choices and refuses others (exit 2); the tuning
grid is the bench's own (no kernel knob), and its split count is a power of two within the cap.
The head to head with upstream's split-KV verify kernels: every kernel checked against the float32
chain reference under the Triton interpreter, 0.5.23's kernels loaded by path (never a silent
fallback to the installed release), and the check fails on a wrong chain mask."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def _kernel(*args):
    return subprocess.run([sys.executable, "-m", "bench", "kernel", *args], capture_output=True, text=True,
                          timeout=120, env=ENV, cwd=str(ROOT))


def test_bench_kernel_dry_run_and_block_rows_check():
    r = _kernel("--dry-run", "--shapes", "kimi_tp8_mla", "--ndt", "3", "6", "--block-rows", "16", "32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kimi_tp8_mla ndt=3 policy block_r=32" in r.stdout
    assert "kimi_tp8_mla ndt=6 policy block_r=16" in r.stdout and "forced=[16, 32]" in r.stdout
    bad = _kernel("--dry-run", "--block-rows", "24")
    assert bad.returncode == 2 and "--block-rows [24]" in bad.stderr


def test_tune_grid_and_split_count():
    from bench.kernel import tune as kernel
    from sglang_verify_graph.kernel import ChainVerifyShape

    cands = kernel.tune_candidates()
    assert len(cands) == 36 and all(set(c) == set(kernel.TUNE_GRID) for c in cands)
    shape = ChainVerifyShape(8, 1, 576, 512, 3, 64)
    for pps in (2, 4, 8):
        n = kernel.tune_splits(shape, 8, 132, pps, 256)
        assert n & (n - 1) == 0 and 1 <= n <= 256
    assert kernel.tune_splits(shape, 1, 132, 8, 16) == 16  # capped
    assert kernel.tune_splits(shape, 1, 132, 2, 256) == 256  # 2 * 132 / 1 = 264 -> 512, capped at 256


# ---------------------------------------------------------------- head to head with upstream's kernels
V23_SGLANG = sorted(ROOT.glob(".venv23/lib/python3*/site-packages/sglang"))


def _upstream_tarball(tmp_path) -> pathlib.Path:
    """The tarball scripts/pack_upstream_src.sh writes from .venv23 (0.5.23), in ``tmp_path``."""
    if not V23_SGLANG or not (V23_SGLANG[0] / "kernels/ops/attention/verify_mla.py").is_file():
        import pytest

        pytest.skip("no SGLang 0.5.23 source in .venv23 (scripts/setup_cpu_env.sh makes it)")
    r = subprocess.run(["bash", str(ROOT / "scripts/pack_upstream_src.sh"), str(V23_SGLANG[0])],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, OUTD=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    return tmp_path / "upstream_src.tar.xz"


def test_head_to_head_every_kernel_checked_in_interpreter(tmp_path):
    """``--device cpu`` under TRITON_INTERPRET=1, both shapes, with 0.5.23's kernels loaded by path
    from the packed tarball: every requested kernel has a status in every row; every kernel that
    ran has its accuracy check (one entry per draft row) and passes it; 0.5.23's verify_splitkv
    declines MLA (reported, not dropped); splitkv and shared_kv came from the tarball's files
    (origin source, version 0.5.23, the sha256 of .venv23's files), not the installed release."""
    import hashlib

    tar = _upstream_tarball(tmp_path)
    out = tmp_path / "k.json"
    kernels = ["extend", "splitkv", "shared_kv", "ours"]
    r = subprocess.run([sys.executable, "-m", "bench", "kernel", "--device", "cpu", "--contexts", "128", "--bs", "1",
                        "--ndt", "3", "--num-sms", "8", "--upstream-src", str(tar), "--kernels", *kernels,
                        "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(ENV, TRITON_INTERPRET="1", TMPDIR=str(tmp_path)), cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(out.read_text())
    att = V23_SGLANG[0] / "kernels/ops/attention"
    for name, module in (("splitkv", "verify_splitkv"), ("shared_kv", "verify_mla")):
        src = d["upstream"][name]
        assert src["origin"] == "source" and src["version"] == "0.5.23" and not src["error"], src
        assert src["sha256"] == hashlib.sha256((att / f"{module}.py").read_bytes()).hexdigest()
        assert str(tar) in src["archive"] and "/.venv/" not in src["path"]
    assert [(x["shape"], x["bs"]) for x in d["rows"]] == [("llama8b_tp1", 1), ("kimi_tp8_mla", 1)]
    for row in d["rows"]:
        assert sorted(row["kernels"]) == sorted(kernels), row["shape"]
        for k, v in row["kernels"].items():
            if (row["shape"], k) == ("kimi_tp8_mla", "splitkv"):
                assert v["status"] == "declined" and "can_handle" in v["error"] and v["acc"] is None
                continue
            assert v["status"] == "ok", (row["shape"], k, v["error"], v["acc"])
            acc = v["acc"]
            assert acc is not None and acc["rows"] == 3 and len(acc["max_abs_by_draft"]) == 3, (row["shape"], k)
            assert acc["pass"] and acc["nan_rows"] == 0
            # float32 inputs: ~1e-6, except shared_kv's bfloat16 split partials
            assert acc["max_abs"] < (1e-2 if k == "shared_kv" else 1e-4), (row["shape"], k, acc["max_abs"])
            assert v["ms"] is None  # no timing off a GPU
    assert "SUMMARY kimi_tp8_mla ours/splitkv: not compared at 1 points" in r.stdout


def test_upstream_loader_never_falls_back(tmp_path):
    """A source without verify_mla.py: shared_kv is an error naming the missing file (no installed
    copy taken instead), splitkv still comes from the source; a release without verify_mla.py and
    no --upstream-src: an error naming --upstream-src; a bad path: one line, exit 2."""
    import shutil

    from bench import upstream_kernels as uk

    if not V23_SGLANG:
        import pytest

        pytest.skip("no SGLang 0.5.23 source in .venv23")
    att = tmp_path / "sglang/kernels/ops/attention"
    att.mkdir(parents=True)
    shutil.copy(V23_SGLANG[0] / "_version.py", tmp_path / "sglang/_version.py")
    shutil.copy(V23_SGLANG[0] / "kernels/ops/attention/verify_splitkv.py", att)
    ks = uk.load_kernels(["splitkv", "shared_kv"], str(tmp_path))
    assert ks["splitkv"].fn is not None and ks["splitkv"].origin == "source" and ks["splitkv"].version == "0.5.23"
    assert ks["splitkv"].fn.__module__ == "bench_upstream_src.verify_splitkv"
    assert ks["shared_kv"].fn is None and ks["shared_kv"].origin == "source"
    assert "verify_mla.py: not in the upstream source" in ks["shared_kv"].error
    import sglang.kernels.ops.attention as att_pkg  # the installed package is left as it was

    assert not hasattr(att_pkg, "verify_mla") or "bench_upstream_src" not in att_pkg.verify_mla.__name__
    inst = uk.load_kernels(["shared_kv"])["shared_kv"]
    if (pathlib.Path(att_pkg.__file__).parent / "verify_mla.py").is_file():
        assert inst.origin == "installed" and inst.fn is not None
    else:
        assert inst.fn is None and "--upstream-src" in inst.error
    bad = _kernel("--dry-run", "--upstream-src", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and "--upstream-src" in bad.stderr.strip().splitlines()[-1]


def test_accuracy_check_catches_a_wrong_chain_mask():
    """The reference (float32) agrees with the kernel package's float64 reference on 3 requests;
    with the drafts raised (``boost_drafts``), an output whose rows see one draft too many or too
    few fails :func:`check_rows` at every context of the grid's range, the right one passes."""
    import torch

    from bench.kernel import inputs as kernel
    from sglang_verify_graph.kernel import chain_verify_attention_ref

    s = dict(h=4, kvh=2, dk=64, dv=64, rope=0)
    for ctx in (16, 1024, 16384):
        bs, ndt = (3, 3) if ctx < 1024 else (1, 4)
        inp = kernel.make_inputs(s, ctx, bs, ndt, "cpu", dtype=torch.float32)
        kernel.boost_drafts(s, inp, ndt)
        k, v, r2t, rpi, seq, q = inp
        ref = kernel.chain_reference(q, k, v, r2t, rpi, seq, ndt, 64 ** -0.5)
        if ctx == 16:
            ref64 = chain_verify_attention_ref(q, k, v, r2t, rpi, seq, ndt, 64 ** -0.5)
            assert (ref.double() - ref64).abs().max() < 1e-5
        assert kernel.check_rows(ref.to(torch.bfloat16), ref, ndt)["pass"]
        for shift in (1, -1):
            wrong = kernel.chain_reference(q, k, v, r2t, rpi, seq, ndt, 64 ** -0.5, shift=shift)
            c = kernel.check_rows(wrong, ref, ndt)
            assert not c["pass"] and c["rows_failed"] >= bs * (ndt - 1), (ctx, shift, c)


def test_upstream_gate_lift_is_lab_only_and_counted(tmp_path):
    """``bench.lib.upstream_gate``: on a backend class shaped as 0.5.16's (gate False off gfx95),
    the patched ``__init__`` sets ``use_verify_splitkv`` from the env switch and topk 1 alone and
    counts the calls that ran or declined; a release without the path is refused (one line); the
    sitecustomize shim does nothing without BENCH_LIFT_SPLITKV_GATE=1."""
    import types

    import pytest

    from bench.lib import upstream_gate

    src = tmp_path / "triton_backend.py"
    src.write_text("# self.use_verify_splitkv = is_gfx95_supported() and ...\n")

    class Env:
        def __init__(self, v):
            self.v = v

        def get(self):
            return self.v

    class Backend:
        def __init__(self, topk):
            self.topk, self.use_verify_splitkv = topk, False  # off gfx95
            self.verify_splitkv_fwd = lambda q, *a, **k: q.shape[-1] == 128

    mod = types.SimpleNamespace(__file__=str(src), TritonAttnBackend=Backend,
                                envs=types.SimpleNamespace(SGLANG_ENABLE_SPLITKV_VERIFY=Env(True)))
    upstream_gate.patch_backend_module(mod)
    import torch

    b1, b2 = Backend(1), Backend(3)
    assert b1.use_verify_splitkv and not b2.use_verify_splitkv
    before = upstream_gate.stats()
    assert b1.verify_splitkv_fwd(torch.zeros(2, 4, 128)) and not b1.verify_splitkv_fwd(torch.zeros(2, 4, 576))
    after = upstream_gate.stats()
    assert (after["ran"] - before["ran"], after["declined"] - before["declined"]) == (1, 1)
    src.write_text("# no split-KV verify here\n")
    with pytest.raises(RuntimeError, match="no TritonAttnBackend.use_verify_splitkv"):
        upstream_gate.patch_backend_module(mod)
    site = ROOT / "bench/lib/upstream_gate_site"
    env = {k: v for k, v in ENV.items() if k not in ("BENCH_LIFT_SPLITKV_GATE",)}
    r = subprocess.run([sys.executable, "-c", "import sys; print(any(type(f).__name__ == '_AfterImport' "
                        "for f in sys.meta_path))"], capture_output=True, text=True, timeout=60,
                       env=dict(env, PYTHONPATH=f"{site}{os.pathsep}{env['PYTHONPATH']}"))
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
    r = subprocess.run([sys.executable, "-c", "import sys; print(any(type(f).__name__ == '_AfterImport' "
                        "for f in sys.meta_path))"], capture_output=True, text=True, timeout=60,
                       env=dict(env, PYTHONPATH=f"{site}{os.pathsep}{env['PYTHONPATH']}", BENCH_LIFT_SPLITKV_GATE="1"))
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_head_to_head_table_counts_only_accurate_points():
    """``bench.kernel.table``: ours / it over the points where both are ``ok`` (a declined or
    inaccurate point is listed by status, not averaged), failed rows summed, ours / the fastest
    accurate upstream verify kernel per point, and the rerun line without ``--out``."""
    from bench.kernel import table

    def k(ms, status="ok", failed=0):
        return dict(ms=ms, status=status, acc=dict(rows=6, rows_failed=failed))

    rows = [dict(shape="kimi_tp8_mla", ctx=1024, bs=1, ndt=3,
                 kernels=dict(extend=k(0.4), splitkv=k(None, "declined"), shared_kv=k(0.1), ours=k(0.05))),
            dict(shape="kimi_tp8_mla", ctx=1024, bs=8, ndt=3,
                 kernels=dict(extend=k(0.1), splitkv=k(None, "declined"), shared_kv=k(0.01, "inaccurate", 2),
                              ours=k(0.1)))]
    raw = dict(rows=rows, kernels=["extend", "splitkv", "shared_kv", "ours"],
               argv=["--out", "/tmp/x.json", "--shapes", "kimi_tp8_mla", "--bs", "1", "8"])
    got = {r[1]: r[2:] for r in table.summary_rows(raw)}
    assert got[table.LABEL["extend"]] == ["0.354", "0.125-1.000", "1 / 2", "-", "0 / 12"]  # sqrt(0.125 * 1)
    assert got[table.LABEL["splitkv"]] == ["-", "-", "0 / 0", "2 declined", "0 / 12"]
    assert got[table.LABEL["shared_kv"]] == ["0.500", "0.500-0.500", "1 / 1", "1 inaccurate", "2 / 12"]
    pts = table.point_rows(raw, 3, bs=(1, 8))
    assert [p[-1] for p in pts] == ["0.500", "1.000"]  # bs 8: the inaccurate shared_kv is not the best
    assert pts[1][6] == "inaccurate"
    assert '--out' not in table.command(raw) and 'KBENCH_ARGS="--shapes kimi_tp8_mla --bs 1 8"' in table.command(raw)
