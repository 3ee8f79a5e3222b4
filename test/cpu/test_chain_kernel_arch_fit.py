"""CPU tier: every chain-kernel build the backends can launch fits the shared memory and registers
of sm_80, sm_89, sm_90, sm_100 and sm_120, cross-compiled with Triton (no GPU needed).

Guards the field's GPU: SM120 (RTX PRO 6000 Blackwell) offers 99 KB of shared memory per block,
not Hopper's 227 KB, and Triton refuses to launch a build that needs more (OutOfResources).

Builds. ``chain_verify_attention_fwd`` itself runs on meta tensors with its two kernels replaced
by recorders, so the test sees exactly the constexprs, launch options and argument
specialisations that launch: MHA/GQA head dims 64, 80, 96, 128 and 256 (8 KV heads, groups 1-8),
MLA 576/512 with rope 64 (8 and 16 heads, 1 KV head); 2-8 draft tokens; bf16 and fp16; logit cap
off and on; ``seq_lens`` without and with the chain; 1, 8 and 64 KV splits; page-table rows of
4096 and 4100 slots. Shared memory and registers follow the tiles (BLOCK_*, LK, LV), USE_CAP,
the operand width and the launch options. NDT, GROUP, ROW_BLOCKS, CHAIN_IN_SEQ and the integer
specialisations change index arithmetic only, and bf16 and fp16 are both 2-byte operands: each
class of builds alike but for those is compiled once per arch, as its bf16 member, and
test_class_members_take_the_same_shared_memory checks the claim on samples (fp16 among them).

Per-device choice. Stage 1's ``num_stages`` is what ``choose_num_stages`` picks from the build's
``metadata.shared`` and the arch's limit below, as the launcher does with the device's own limit
at the first launch; on sm_90 (the H200) every class keeps ``STAGE1_NUM_STAGES[0]``. The
launcher's side of it (test_the_launcher_lowers_stage_one_where_shared_memory_is_short): on a
device whose limit the default build exceeds, stage 1 launches at the lowered depth, chosen once
per device (the device and the build's ``metadata.shared`` are stand-ins there).

Limits, from the CUDA C++ Programming Guide, "Compute Capabilities", table "Technical
Specifications per Compute Capability" (maximum shared memory per thread block, opt-in; 64 K
32-bit registers per thread block and 255 per thread on all five):

    arch     shared memory per block
    sm_80    163 KB (166912 B)
    sm_89     99 KB (101376 B)
    sm_90    227 KB (232448 B)
    sm_100   227 KB (232448 B)
    sm_120    99 KB (101376 B)

Measured: shared memory is ``metadata.shared`` of ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", cc, 32))``, the number Triton compares with the device's limit before a
launch (sm_90 and up build for the ``a`` targets, as Triton does). Registers and spills come from
the ``ptxas -v`` log of the bundled ptxas that builds the cubin inside Triton
(TRITON_DUMP_PTXAS_LOG: same binary and flags, so the count is the cubin's, which the driver
reports as ``n_regs`` at load), or, where that log is missing, from running that ptxas with
``-v --gpu-name`` on the build's PTX. A build fits when shared <= limit, registers <= 255 and
registers x 32 x num_warps <= 65536.

Spills. On sm_90 no build spills. Elsewhere only MLA's stage-1 tile at 32 rows (512-wide fp32
accumulator, 4 warps: 255 registers) spills, at most ``SPILL_BOUND_BYTES`` stored and as many
loaded per thread (ptxas' "bytes spill stores / loads"); every other build spills nothing. 8 warps
would remove those spills (about 170 registers), but 4 warps is the faster setting of that tile
where it was timed (sm_90), so the 4-warp build stays until an arch where it spills times both.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

import sglang_verify_graph.kernel.chain_verify_attention as cva  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature
except ImportError as e:  # pragma: no cover - another Triton layout
    pytest.skip(f"Triton {triton.__version__} lacks the cross-compile entry points: {e}",
                allow_module_level=True)

# Max shared memory per block (opt-in, bytes), CUDA C++ Programming Guide, Compute Capabilities.
SHARED_LIMIT = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
REGS_PER_BLOCK = 64 * 1024
REGS_PER_THREAD = 255
# Spill bytes per thread (stores, and loads alike) allowed off sm_90, MLA's 32-row stage-1 tile only.
SPILL_BOUND_BYTES = 64

# The real kernels, taken before any test swaps them for recorders.
KERNELS = {"_chain_verify_stage1": cva._chain_verify_stage1, "_chain_verify_stage2": cva._chain_verify_stage2}
STAGE1 = "_chain_verify_stage1"
# Constexprs that change index arithmetic only.
INDEX_ONLY = ("NDT", "GROUP", "ROW_BLOCKS", "CHAIN_IN_SEQ")


def _shapes():
    """(heads, kv_heads, dk, dv, ndt, rope) the backends build ChainVerifyShape from."""
    for d, group, ndt in itertools.product((64, 80, 96, 128, 256), range(1, 9), range(2, 9)):
        yield 8 * group, 8, d, d, ndt, 0
    for heads, ndt in itertools.product((8, 16), range(2, 9)):
        yield heads, 1, 576, 512, ndt, 64


class _Recorder:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args = tuple(MockTensor(a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            self.calls.append((self.name, args, kwargs))
        return launch


# ---- the launcher's per-device choice ----------------------------------------------------------
class _CudaLooking(torch.Tensor):
    """A CPU tensor that reports ``is_cuda``, so the launcher takes its GPU path."""

    @property
    def is_cuda(self):
        return True


class _Stage1Standin(triton.runtime.JITFunction):
    """Stage 1 to the launcher (a ``JITFunction``, as the real kernel): ``warmup`` compiles nothing
    and returns a build taking ``shared[num_stages]`` bytes; ``kernel[grid](...)`` launches nothing.
    Both are recorded as (args, grid, kwargs)."""

    def __init__(self, shared):
        self.shared, self.warmups, self.launches = shared, [], []

    def __repr__(self):
        return f"_Stage1Standin(warmups={len(self.warmups)}, launches={len(self.launches)})"

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((args, grid, kwargs))
        return SimpleNamespace(metadata=SimpleNamespace(shared=self.shared[kwargs["num_stages"]]))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, grid, kwargs))


def _same_args(a, b):
    """Launch arguments equal: tensors by storage, shape and strides, the rest by value."""
    def key(x):
        return (x.data_ptr(), tuple(x.shape), x.stride()) if isinstance(x, torch.Tensor) else x
    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


def test_the_launcher_lowers_stage_one_where_shared_memory_is_short(monkeypatch):
    """``chain_verify_attention_fwd`` on a GPU asks the device's ``max_shared_mem`` and the stage-1
    build's ``metadata.shared`` (a warmup of exactly the build it launches), and launches stage 1
    at the first ``STAGE1_NUM_STAGES`` depth that fits: on a 99 KB device (sm_120) MLA's 32-row
    build of 106 KB at the default depth launches at the lowered one, on a 227 KB device (sm_90)
    at the default. The choice is made once per device: later launches there compile nothing."""
    default, lowered = cva.STAGE1_NUM_STAGES[0], cva.STAGE1_NUM_STAGES[-1]
    assert default != lowered
    stage1 = _Stage1Standin({default: 106 * 1024, lowered: 70 * 1024})
    limits, device = {0: SHARED_LIMIT[120], 1: SHARED_LIMIT[90]}, [0]
    active = SimpleNamespace(get_current_device=lambda: device[0], utils=SimpleNamespace(
        get_device_properties=lambda d: {"max_shared_mem": limits[d]}))
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=active))
    monkeypatch.setattr(cva, "_chain_verify_stage1", stage1)
    monkeypatch.setattr(cva, "_chain_verify_stage2", _Recorder("_chain_verify_stage2", []))
    monkeypatch.setattr(cva, "_STAGE1_STAGES", {})

    shape = cva.ChainVerifyShape(8, 1, 576, 512, 4, 64)  # 32 query rows per KV head: BLOCK_R 32
    assert shape.block_r == 32
    bs, splits = 2, 4
    k = torch.zeros(64, 1, 576, dtype=torch.bfloat16)
    n_out, n_lse = cva.workspace_numel(shape, bs, splits)
    q = torch.zeros(bs * 4, 8, 576, dtype=torch.bfloat16).as_subclass(_CudaLooking)

    def launch():
        """Stage 1's num_stages at one launch on ``device[0]``."""
        cva.chain_verify_attention_fwd(
            q, k, k[..., :512], torch.zeros(bs * 4, 8, 512, dtype=torch.bfloat16),
            torch.zeros(4, 64, dtype=torch.int32), torch.zeros(bs, dtype=torch.int64),
            torch.tensor([5, 9]), shape, splits, 576 ** -0.5, torch.empty(n_out), torch.empty(n_lse))
        return stage1.launches[-1][2]["num_stages"]

    assert launch() == lowered
    [(args, grid, kwargs)] = stage1.warmups
    launched_args, launched_grid, launched_kwargs = stage1.launches[-1]
    assert kwargs == {**launched_kwargs, "num_stages": default}  # the build launched, at the default
    assert grid == launched_grid and _same_args(args, launched_args)
    assert launch() == lowered and len(stage1.warmups) == 1  # remembered for the device
    device[0] = 1
    assert launch() == default and len(stage1.warmups) == 2
    device[0] = 0
    assert launch() == lowered and len(stage1.warmups) == 2


def _launches():
    """Every (kernel name, args, kwargs) ``chain_verify_attention_fwd`` launches for _shapes() x
    dtypes x cap x chain lengths x splits x page-table rows (tensors as MockTensor)."""
    calls, meta = [], torch.device("meta")
    with pytest.MonkeyPatch.context() as mp:
        for name in KERNELS:
            mp.setattr(cva, name, _Recorder(name, calls))
        for (h, kvh, dk, dv, ndt, rope), dtype, splits, ctx, cap, chain in itertools.product(
                _shapes(), (torch.bfloat16, torch.float16), (8, 1, 64), (4100, 4096), (0.0, 30.0),
                (False, True)):
            shape = cva.ChainVerifyShape(h, kvh, dk, dv, ndt, rope)
            bs = 2
            k = torch.empty(64, kvh, dk, dtype=dtype, device=meta)
            v = k[..., :dv] if rope else torch.empty(64, kvh, dv, dtype=dtype, device=meta)
            n_out, n_lse = cva.workspace_numel(shape, bs, splits)
            cva.chain_verify_attention_fwd(
                torch.empty(bs * ndt, h, dk, dtype=dtype, device=meta), k, v,
                torch.empty(bs * ndt, h, dv, dtype=dtype, device=meta),
                torch.empty(4, ctx, dtype=torch.int32, device=meta),
                torch.zeros(bs, dtype=torch.int64, device=meta), torch.ones(bs, dtype=torch.int64, device=meta),
                shape, splits, dk ** -0.5, torch.empty(n_out, device=meta), torch.empty(n_lse, device=meta),
                cap, seq_lens_include_chain=chain)
    return calls


def _dtypes(args):
    return tuple(str(a.dtype).replace("torch.", "") for a in args if isinstance(a, MockTensor))


def _class_key(name, args, kwargs):
    dtypes = tuple("16-bit" if d in ("bfloat16", "float16") else d for d in _dtypes(args))
    return name, dtypes, tuple(sorted((k, v) for k, v in kwargs.items() if k not in INDEX_ONLY))


class Builds:
    """The launcher's distinct builds (``exact``) and their classes (``classes``: class key ->
    members, the first a bf16 one, the build compiled for the class)."""

    def __init__(self):
        backend = make_backend(GPUTarget("cuda", 90, 32))
        binders = {n: create_function_from_signature(k.signature, k.params, backend) for n, k in KERNELS.items()}
        self.exact = {}
        for name, args, kwargs in _launches():
            _, spec, _ = binders[name](*args, **kwargs)
            ident = (name, tuple(map(str, spec)), tuple(sorted(kwargs.items())))
            self.exact.setdefault(ident, (name, args, kwargs))
        self.classes = {}
        for build in self.exact.values():
            self.classes.setdefault(_class_key(*build), []).append(build)
        for members in self.classes.values():
            members.sort(key=lambda b: "float16" in _dtypes(b[1]))  # stable: bf16 members first


def _arch(cc):
    return f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"


def _ptxas(cc):
    """The ptxas Triton builds the cubin for ``cc`` with."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(cc).path
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other layouts
        return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def _worker_init(cache_dir):
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # ptxas runs (and logs) for every build
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"


def compile_build(job):
    """Compile one build for ``cc`` as ``JITFunction.run`` would on such a device. Returns a dict:
    shared, regs, spill_stores, spill_loads, num_warps, num_stages."""
    name, args, kwargs, cc = job
    kernel = KERNELS[name]
    target = GPUTarget("cuda", cc, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
    log = log.getvalue()
    if "registers" not in log:
        proc = subprocess.run([_ptxas(cc), "-v", f"--gpu-name={_arch(cc)}", "-", "-o", os.devnull],
                              input=compiled.asm["ptx"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        log = proc.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert regs and spills, f"no ptxas -v report for {name} on {_arch(cc)}:\n{log[-2000:]}"
    return dict(shared=compiled.metadata.shared, regs=int(regs.group(1)), spill_stores=int(spills.group(1)),
                spill_loads=int(spills.group(2)), num_warps=options.num_warps, num_stages=options.num_stages)


class Compiler:
    """``compile_build`` over the module's process pool, memoised."""

    def __init__(self, pool):
        self.pool, self.done = pool, {}

    def many(self, cc, builds):
        """Results for ``builds`` ((name, args, kwargs)) on ``cc``, in order."""
        keys = [(cc, name, tuple(str(a.dtype) if isinstance(a, MockTensor) else repr(a) for a in args),
                 tuple(sorted(kwargs.items()))) for name, args, kwargs in builds]
        todo = {k: b for k, b in zip(keys, builds) if k not in self.done}
        # widest tiles first, so the slowest builds do not trail at the end
        order = sorted(todo, key=lambda k: -sum(v for n, v in k[3] if n in ("BLOCK_D", "BLOCK_DV", "BLOCK_R")))
        for k, res in zip(order, self.pool.map(compile_build, [(*todo[k], cc) for k in order])):
            self.done[k] = res
        return [self.done[k] for k in keys]

    def one(self, cc, build):
        return self.many(cc, [build])[0]


@pytest.fixture(scope="module")
def builds():
    return Builds()


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("triton_cache"))
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ProcessPoolExecutor(max(1, min(8, cpus)), mp_context=ctx, initializer=_worker_init,
                             initargs=(cache,)) as pool:
        yield Compiler(pool)


def _with_stages(build, num_stages):
    name, args, kwargs = build
    return name, args, {**kwargs, "num_stages": num_stages}


def _chosen(compiler, cc, reps):
    """{class key: (build, result)}: stage 1 at the ``num_stages`` ``choose_num_stages`` picks for
    ``cc`` (a memoised compile answers each depth it asks about)."""
    limit = SHARED_LIMIT[cc]
    compiler.many(cc, list(reps.values()))
    over = [b for b in reps.values() if b[0] == STAGE1 and compiler.one(cc, b)["shared"] > limit]
    compiler.many(cc, [_with_stages(b, n) for b in over for n in cva.STAGE1_NUM_STAGES[1:]])  # in parallel
    chosen = {}
    for key, build in reps.items():
        if build[0] == STAGE1:
            build = _with_stages(build, cva.choose_num_stages(
                lambda n: compiler.one(cc, _with_stages(build, n))["shared"], limit))
        chosen[key] = (build, compiler.one(cc, build))
    return chosen


def _may_spill(key):
    """The one class allowed to spill (within the bound): MLA's stage-1 tile at 32 rows."""
    name, _, kw = key
    kw = dict(kw)
    return name == STAGE1 and kw["BLOCK_R"] == 32 and kw["BLOCK_DV"] >= 512


def _describe(key):
    name, dtypes, kw = key
    kw = dict(kw)
    tile = " ".join(f"{k}={kw[k]}" for k in ("BLOCK_R", "BLOCK_N", "BLOCK_D", "BLOCK_DPE", "BLOCK_DV", "LK",
                                            "USE_CAP", "num_warps") if k in kw)
    return f"stage{name[-1]} {tile}"


@pytest.mark.parametrize("cc", sorted(SHARED_LIMIT), ids=lambda cc: f"sm_{cc}")
def test_every_chain_build_fits_the_arch(cc, builds, compiler):
    t0 = time.perf_counter()
    reps = {key: members[0] for key, members in builds.classes.items()}
    chosen = _chosen(compiler, cc, reps)
    limit = SHARED_LIMIT[cc]
    bad, lowered, spills, over = [], [], [], []
    for key, (build, res) in chosen.items():
        what = f"{_describe(key)} num_stages={res['num_stages']}"
        threads = 32 * res["num_warps"]
        if res["shared"] > limit or res["regs"] > REGS_PER_THREAD or res["regs"] * threads > REGS_PER_BLOCK:
            bad.append(f"{what}: {res['shared']} B shared (limit {limit}), {res['regs']} registers x {threads} threads")
        if build[2]["num_stages"] != reps[key][2]["num_stages"]:
            lowered.append(f"{what} (from {reps[key][2]['num_stages']}): {res['shared']} B")
        if res["spill_stores"] or res["spill_loads"]:
            spills.append(f"{what}: spills {res['spill_stores']} B stored, {res['spill_loads']} B loaded")
            if cc == 90 or not _may_spill(key) or max(res["spill_stores"], res["spill_loads"]) > SPILL_BOUND_BYTES:
                over.append(spills[-1])
    top_shared = max(chosen.items(), key=lambda kv: kv[1][1]["shared"])
    top_regs = max(chosen.items(), key=lambda kv: kv[1][1]["regs"])
    print(f"\n{_arch(cc)}: {len(builds.exact)} builds, {len(chosen)} classes compiled; max shared "
          f"{top_shared[1][1]['shared']} B of {limit} ({_describe(top_shared[0])}); max registers "
          f"{top_regs[1][1]['regs']} ({_describe(top_regs[0])}); {time.perf_counter() - t0:.1f} s")
    for line in [f"lowered: {x}" for x in lowered] + spills:
        print("  " + line)
    assert not bad, f"builds that do not fit {_arch(cc)}:\n" + "\n".join(bad)
    assert not over, (f"builds that spill past the bound on {_arch(cc)} (0 on sm_90; elsewhere "
                      f"{SPILL_BOUND_BYTES} B, MLA's 32-row stage-1 tile only):\n" + "\n".join(over))
    if cc == 90:
        assert not lowered, "the H200 (sm_90) choice changed:\n" + "\n".join(lowered)


def test_class_members_take_the_same_shared_memory(builds, compiler):
    """Members of a class (other NDT / GROUP / ROW_BLOCKS / CHAIN_IN_SEQ, integer specialisations,
    fp16 for bf16) take the class build's shared memory and stay within the register limits:
    for every stage-1 tile without the cap, on sm_120, the class build, an fp16 member and a
    bf16 member of another shape."""
    cc, samples = 120, []
    for key, members in builds.classes.items():
        if key[0] == STAGE1 and not dict(key[2])["USE_CAP"]:
            fp16 = [b for b in members if "float16" in _dtypes(b[1])]
            bf16 = [b for b in members if b not in fp16]
            samples.append((key, [bf16[0], fp16[len(fp16) // 2], bf16[-1]]))
    assert len(samples) == 12, [_describe(k) for k, _ in samples]  # 6 head-dim tiles x 2 row tiles
    results = iter(compiler.many(cc, [b for _, group in samples for b in group]))
    for key, group in samples:
        got = [next(results) for _ in group]
        assert len({r["shared"] for r in got}) == 1, (_describe(key), [
            ({k: b[2][k] for k in INDEX_ONLY}, _dtypes(b[1])[0], r["shared"]) for b, r in zip(group, got)])
        assert all(r["regs"] <= REGS_PER_THREAD and r["regs"] * 32 * r["num_warps"] <= REGS_PER_BLOCK for r in got)
