"""CPU tier: the chain kernel's host side (``kernel/chain_verify_attention.py``), in-process with the
two Triton programs replaced by recorders: the launch settings per head dims (``launch_config``),
the split count (``choose_num_kv_splits``), stage 1's pipeline depth per device
(``choose_num_stages``), the shape / stride / workspace refusals, the grids and every argument of
both launches read against the kernels' own parameter names, and the float64 reference's batch
and soft-cap arithmetic. What the kernels compute is ``test_chain_kernel_interpret.py``."""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
from sglang_verify_graph.kernel import chain_verify_attention as cva  # noqa: E402
from sglang_verify_graph.kernel import triton_chain  # noqa: E402

STAGE1_PARAMS = list(inspect.signature(triton_chain._chain_verify_stage1.fn).parameters)
STAGE2_PARAMS = list(inspect.signature(triton_chain._chain_verify_stage2.fn).parameters)


class _Recorder:
    """Stands in for a ``triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the call as
    ``(grid, {parameter name: value})`` bound to the kernel's own parameter names."""

    def __init__(self, params):
        self.params, self.calls = params, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            bound = dict(zip(self.params, args))
            assert not set(bound) & set(kwargs), "an argument passed twice"
            self.calls.append((grid, {**bound, **kwargs}))
        return launch


@pytest.fixture
def kernels(monkeypatch):
    """``(stage1, stage2)`` recorders in place of the two Triton programs."""
    s1, s2 = _Recorder(STAGE1_PARAMS), _Recorder(STAGE2_PARAMS)
    monkeypatch.setattr(cva, "_chain_verify_stage1", s1)
    monkeypatch.setattr(cva, "_chain_verify_stage2", s2)
    return s1, s2


def _inputs(shape: cva.ChainVerifyShape, bs: int, splits: int, slots: int = 64, **change):
    """Keyword arguments of ``chain_verify_attention_fwd`` for ``bs`` requests of ``shape`` (CPU,
    float32), with ``change`` replacing any of them. ``q`` is a non-contiguous view (a padded last
    dim), so that its strides differ from a contiguous tensor's."""
    t, h, kvh = bs * shape.num_draft_tokens, shape.num_q_heads, shape.num_kv_heads
    n_out, n_lse = cva.workspace_numel(shape, bs, splits)
    args = dict(
        q=torch.randn(t, h, shape.head_dim_qk + 8)[..., :shape.head_dim_qk],
        k_buffer=torch.randn(slots, kvh, shape.head_dim_qk),
        v_buffer=torch.randn(slots, kvh, shape.head_dim_v),
        o=torch.empty(t, h, shape.head_dim_v),
        req_to_token=torch.zeros(4, 40, dtype=torch.int32),
        req_pool_indices=torch.arange(bs, dtype=torch.int64),
        seq_lens=torch.full((bs,), 5, dtype=torch.int64),
        shape=shape, num_kv_splits=splits, sm_scale=0.125,
        att_out_flat=torch.empty(n_out), att_lse_flat=torch.empty(n_lse))
    args.update(change)
    return args


# ---- launch settings -----------------------------------------------------------------------------
# (heads, kv_heads, dk, dv, ndt, rope) -> BLOCK_D, BLOCK_DV, stage 1 BLOCK_N, stage 2 num_warps
LAUNCH = [
    ((32, 8, 128, 128, 4, 0), 128, 128, 64, 2),   # Llama GQA
    ((4, 2, 80, 48, 6, 0), 128, 64, 64, 2),       # non power-of-two head dims
    ((8, 1, 192, 128, 3, 64), 128, 128, 64, 2),   # 128 + a 64-wide rope tile: BLOCK_D is the 128
    ((8, 8, 256, 128, 2, 0), 256, 128, 32, 2),    # Dk 256: 32-key blocks
    ((8, 8, 128, 256, 2, 0), 128, 256, 32, 4),    # Dv 256: 32-key blocks, stage 2 on 4 warps
    ((8, 1, 576, 512, 3, 64), 512, 512, 32, 4),   # absorbed MLA latent 512 + rope 64
]


@pytest.mark.parametrize("dims, block_d, block_dv, block_n, warps2", LAUNCH,
                         ids=["gqa128", "dims80-48", "rope192", "dk256", "dv256", "mla576"])
@pytest.mark.parametrize("cap, chain", [(False, False), (True, True)], ids=["plain", "cap-chain"])
def test_launch_config_per_head_dims(dims, block_d, block_dv, block_n, warps2, cap, chain):
    h, kvh, dk, dv, ndt, rope = dims
    shape = cva.ChainVerifyShape(h, kvh, dk, dv, ndt, rope)
    s1, s2 = cva.launch_config(shape, use_cap=cap, chain_in_seq=chain)
    assert s1 == dict(NDT=ndt, GROUP=h // kvh, ROW_BLOCKS=shape.row_blocks, BLOCK_R=shape.block_r,
                      BLOCK_N=block_n, BLOCK_D=block_d, BLOCK_DPE=rope, BLOCK_DV=block_dv, LK=dk,
                      LV=dv, MIN_SPLIT=cva.MIN_KEYS_PER_SPLIT, USE_CAP=cap, CHAIN_IN_SEQ=chain,
                      num_warps=4, num_stages=cva.STAGE1_NUM_STAGES[0])
    assert s2 == dict(NDT=ndt, BLOCK_DV=block_dv, LV=dv, MIN_SPLIT=cva.MIN_KEYS_PER_SPLIT,
                      CHAIN_IN_SEQ=chain, num_warps=warps2, num_stages=1)
    assert all(type(c[k]) is bool for c in (s1, s2) for k in ("USE_CAP", "CHAIN_IN_SEQ") if k in c)


def test_launch_config_returns_new_dicts():
    shape = cva.ChainVerifyShape(4, 2, 64, 64, 3)
    a, b = cva.launch_config(shape)
    a["num_stages"] = 1
    assert cva.launch_config(shape)[0]["num_stages"] == cva.STAGE1_NUM_STAGES[0]


# ---- split count ---------------------------------------------------------------------------------
@pytest.mark.parametrize("override, want", [(3, 3), (1, 1), (500, cva.MAX_KV_SPLITS), (-2, 1)])
def test_a_users_split_count_is_kept_within_range(override, want):
    shape = cva.ChainVerifyShape(4, 2, 64, 64, 3)
    assert cva.choose_num_kv_splits(shape, 8, 132, override) == want
    assert cva.choose_num_kv_splits(shape, 8, 132, override=override) == want


# shape, bs, SMs -> splits: PROGRAMS_PER_SM x SMs programs over bs x KV heads x row blocks, rounded
# up to a power of two and kept in [1, MAX_KV_SPLITS]
SPLITS = [
    ((4, 2, 64, 64, 2), 1, 2, 2),       # 1 x 2 x 1 = 2 per split; 4 programs wanted: 2 splits
    ((1, 1, 64, 64, 1), 1, 1, 2),       # one program per split; 2 wanted: 2 splits
    ((64, 8, 128, 128, 2), 64, 132, 1),  # 512 per split is more than 264 wanted: 1 split
    ((1, 1, 64, 64, 1), 1, 1000, cva.MAX_KV_SPLITS),  # 2000 wanted: the cap
    ((8, 1, 192, 128, 6, 64), 2, 132, 64),  # 3 row blocks: 6 per split, 44 -> 64
    ((8, 1, 192, 128, 6, 64), 8, 132, 16),  # 24 per split, 11 -> 16
]


@pytest.mark.parametrize("dims, bs, sms, want", SPLITS)
@pytest.mark.parametrize("override", [None, 0])
def test_the_split_policy(dims, bs, sms, want, override):
    assert cva.choose_num_kv_splits(cva.ChainVerifyShape(*dims), bs, sms, override) == want


# ---- stage 1 pipeline depth ----------------------------------------------------------------------
def test_stage_one_keeps_its_depth_where_the_build_fits_exactly():
    shared = {2: 1000, 1: 600}
    assert cva.choose_num_stages(shared.get, 1000) == 2
    assert cva.choose_num_stages(shared.get, 999) == 1
    assert cva.choose_num_stages(shared.get, 100) == cva.STAGE1_NUM_STAGES[-1]


class _NoDriver:
    """``triton.runtime.driver`` that fails the test when the launcher asks it anything."""

    @property
    def active(self):
        raise AssertionError("the launcher queried the GPU driver")


def test_off_a_gpu_stage_one_depth_is_the_default_without_asking_the_driver(monkeypatch):
    """CPU tensors with the real Triton program, or a program that is not a ``JITFunction``
    (a stand-in) with GPU-looking tensors: the configuration's own depth, no driver query."""
    monkeypatch.setattr(triton.runtime, "driver", _NoDriver())
    q = torch.zeros(2, 1, 16)
    assert isinstance(cva._chain_verify_stage1, triton.runtime.JITFunction)
    assert cva._stage1_num_stages((q, q, q), (1, 1, 1), {"num_stages": 7}) == 7

    class CudaLooking(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    monkeypatch.setattr(cva, "_chain_verify_stage1", _Recorder(STAGE1_PARAMS))
    g = q.as_subclass(CudaLooking)
    assert cva._stage1_num_stages((g, g, g), (1, 1, 1), {"num_stages": 5}) == 5


# ---- refusals ------------------------------------------------------------------------------------
SHAPE = cva.ChainVerifyShape(4, 2, 16, 16, 3)


def _refusal(kernels, **change) -> str:
    with pytest.raises(ValueError) as e:
        cva.chain_verify_attention_fwd(**_inputs(SHAPE, 2, 4, **change))
    assert kernels[0].calls == [] and kernels[1].calls == []
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("q_shape, o_shape", [
    ((7, 4, 16), (6, 4, 16)),   # one query row too many
    ((6, 3, 16), (6, 4, 16)),   # a head short
    ((6, 4, 8), (6, 4, 16)),    # Dk 8
    ((6, 4, 16), (5, 4, 16)),   # one output row short
], ids=["q-rows", "q-heads", "q-dk", "o-rows"])
def test_each_shape_mismatch_is_refused_alone(kernels, q_shape, o_shape):
    msg = _refusal(kernels, q=torch.zeros(q_shape), o=torch.zeros(o_shape))
    assert msg == (f"chain verify: q {q_shape} / o {o_shape} do not match bs=2 x num_draft_tokens=3, "
                   "H=4, Dk=16")


def test_query_heads_not_a_multiple_of_kv_heads_are_refused(kernels):
    shape = cva.ChainVerifyShape(6, 4, 16, 16, 3)
    with pytest.raises(ValueError) as e:
        cva.chain_verify_attention_fwd(**_inputs(shape, 2, 4))
    assert str(e.value) == "chain verify: 6 query heads are not a multiple of 4 KV heads (k_buffer (64, 4, 16))"


def test_a_kv_pool_of_other_heads_is_refused(kernels):
    msg = _refusal(kernels, k_buffer=torch.zeros(64, 1, 16))
    assert msg == "chain verify: 4 query heads are not a multiple of 2 KV heads (k_buffer (64, 1, 16))"


@pytest.mark.parametrize("names", [("q",), ("k_buffer",), ("v_buffer",), ("o",), ("q", "o")])
def test_a_non_unit_last_dim_stride_is_refused_naming_the_tensors(kernels, names):
    base = _inputs(SHAPE, 2, 4)
    change = {n: base[n].transpose(-1, -2).contiguous().transpose(-1, -2) for n in names}
    assert all(x.stride(-1) != 1 for x in change.values())
    assert _refusal(kernels, **change) == f"chain verify: {', '.join(names)} need a unit last-dim stride"


@pytest.mark.parametrize("short", ["att_out_flat", "att_lse_flat"])
def test_a_workspace_too_small_for_the_batch_is_refused(kernels, short):
    n = {"att_out_flat": 0, "att_lse_flat": 1}[short]
    size = cva.workspace_numel(SHAPE, 2, 4)[n]
    msg = _refusal(kernels, **{short: torch.empty(size - 1)})
    assert msg == "chain verify: workspace too small for this batch"
    cva.chain_verify_attention_fwd(**_inputs(SHAPE, 2, 4, **{short: torch.empty(size)}))  # exact: fits


# ---- the two launches ----------------------------------------------------------------------------
def _check_launches(kernels, args, cfg_cap, chain, cap):
    (g1, a1), = kernels[0].calls
    (g2, a2), = kernels[1].calls
    shape, bs, splits = args["shape"], args["req_pool_indices"].shape[0], args["num_kv_splits"]
    t, h, dv = bs * shape.num_draft_tokens, shape.num_q_heads, shape.head_dim_v
    q, k, v, o = args["q"], args["k_buffer"], args["v_buffer"], args["o"]
    assert g1 == (bs, shape.num_kv_heads * shape.row_blocks, splits) and g2 == (t, h)
    ao, al = a1["Att_Out"], a1["Att_Lse"]
    assert ao.shape == (t, h, splits, dv) and al.shape == (t, h, splits)
    assert ao.data_ptr() == args["att_out_flat"].data_ptr() and al.data_ptr() == args["att_lse_flat"].data_ptr()
    for name, x in (("Q", q), ("K_Buffer", k), ("V_Buffer", v), ("Req_to_token", args["req_to_token"]),
                    ("Req_pool_indices", args["req_pool_indices"]), ("Seq_lens", args["seq_lens"])):
        assert a1[name] is x, name
    assert a1["sm_scale"] == args["sm_scale"] and a1["logit_cap"] == cap and a1["num_splits"] == splits
    strides = dict(stride_qt=q.stride(0), stride_qh=q.stride(1), stride_kbs=k.stride(0),
                   stride_kh=k.stride(1), stride_vbs=v.stride(0), stride_vh=v.stride(1),
                   stride_r2t=args["req_to_token"].stride(0), stride_ot=ao.stride(0),
                   stride_oh=ao.stride(1), stride_os=ao.stride(2), stride_lt=al.stride(0),
                   stride_lh=al.stride(1))
    assert {n: a1[n] for n in strides} == strides
    assert len(set(strides.values())) >= 8  # distinct strides: a swapped one shows
    assert a1["USE_CAP"] is cfg_cap and a1["CHAIN_IN_SEQ"] is chain and a2["CHAIN_IN_SEQ"] is chain
    assert a2["Att_Out"] is ao and a2["Att_Lse"] is al and a2["O"] is o and a2["Seq_lens"] is args["seq_lens"]
    assert {n: a2[n] for n in ("stride_ot", "stride_oh", "stride_os", "stride_lt", "stride_lh",
                               "stride_obs", "stride_oh_out", "num_splits")} == dict(
        stride_ot=ao.stride(0), stride_oh=ao.stride(1), stride_os=ao.stride(2), stride_lt=al.stride(0),
        stride_lh=al.stride(1), stride_obs=o.stride(0), stride_oh_out=o.stride(1), num_splits=splits)


MLA_ROWS = cva.ChainVerifyShape(8, 1, 192, 128, 6, 64)  # 48 rows: three 16-row blocks
GQA = cva.ChainVerifyShape(4, 2, 16, 16, 3)


@pytest.mark.parametrize("shape", [MLA_ROWS, GQA], ids=["row-blocks", "gqa"])
def test_launch_grids_and_arguments(kernels, shape):
    args = _inputs(shape, 2, 4, o=torch.empty(12 if shape is MLA_ROWS else 6, shape.num_q_heads, 136)[..., :shape.head_dim_v])
    out = cva.chain_verify_attention_fwd(**args)
    assert out is args["o"]
    _check_launches(kernels, args, cfg_cap=False, chain=False, cap=0.0)
    assert kernels[0].calls[0][1]["num_stages"] == cva.STAGE1_NUM_STAGES[0]


def test_a_logit_cap_and_the_chain_lengths_reach_both_launches(kernels):
    args = _inputs(GQA, 2, 4)
    cva.chain_verify_attention_fwd(**args, logit_cap=0.5, seq_lens_include_chain=True)
    _check_launches(kernels, args, cfg_cap=True, chain=True, cap=0.5)


def test_launch_with_config_launches_the_given_settings(kernels):
    args = _inputs(MLA_ROWS, 2, 4)
    s1, s2 = cva.launch_config(MLA_ROWS)
    s1.update(BLOCK_N=16, num_stages=1)
    s2.update(num_warps=8)
    out = cva.launch_with_config(**args, stage1=s1, stage2=s2)
    assert out is args["o"]
    _check_launches(kernels, args, cfg_cap=False, chain=False, cap=0.0)
    assert {k: kernels[0].calls[0][1][k] for k in s1} == s1
    assert {k: kernels[1].calls[0][1][k] for k in s2} == s2


# ---- the float64 reference -----------------------------------------------------------------------
def _ref_inputs(bs=2, h=2, kvh=1, d=8, ndt=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(64, kvh, d, generator=g, dtype=torch.float64)
    v = torch.randn(64, kvh, d, generator=g, dtype=torch.float64)
    q = torch.randn(bs * ndt, h, d, generator=g, dtype=torch.float64)
    r2t = torch.randperm(64, generator=g)[:4 * 16].view(4, 16).to(torch.int32)
    return q, k, v, r2t


def test_the_reference_computes_each_request_on_its_own():
    """Two requests in one batch give the rows each gives alone (rows ``i * ndt + j``)."""
    ndt = 3
    q, k, v, r2t = _ref_inputs(ndt=ndt)
    both = cva.chain_verify_attention_ref(q, k, v, r2t, torch.tensor([2, 1]), torch.tensor([4, 9]), ndt, 0.3)
    first = cva.chain_verify_attention_ref(q[:ndt], k, v, r2t, torch.tensor([2]), torch.tensor([4]), ndt, 0.3)
    second = cva.chain_verify_attention_ref(q[ndt:], k, v, r2t, torch.tensor([1]), torch.tensor([9]), ndt, 0.3)
    torch.testing.assert_close(both, torch.cat([first, second]))
    assert not torch.allclose(first, second)


def test_a_position_left_no_key_is_nan_in_every_head():
    q, k, v, r2t = _ref_inputs(bs=1, h=3)
    out = cva.chain_verify_attention_ref(q, k, v, r2t, torch.tensor([0]), torch.tensor([1]), 3, 0.5,
                                         seq_lens_include_chain=True, fault="draft_extend_causal_minus_one")
    assert out[0].isnan().all() and out[1:].isfinite().all()


def test_the_reference_defaults_to_one_split():
    """Without ``num_kv_splits`` a split fault drops nothing (one split); with the launch's count it
    drops the first split's keys."""
    q, k, v, r2t = _ref_inputs(bs=1)
    r2t = torch.arange(80, dtype=torch.int32).view(1, 80)
    k, v = torch.randn(80, 1, 8, dtype=torch.float64), torch.randn(80, 1, 8, dtype=torch.float64)
    args = (q, k, v, r2t, torch.tensor([0]), torch.tensor([70]), 3, 0.3)
    clean = cva.chain_verify_attention_ref(*args)
    torch.testing.assert_close(cva.chain_verify_attention_ref(*args, fault="drop_first_split"), clean)
    assert not torch.allclose(cva.chain_verify_attention_ref(*args, fault="drop_first_split", num_kv_splits=2), clean)


def test_the_references_refusals_name_the_reference():
    q, k, v, r2t = _ref_inputs(bs=1)
    with pytest.raises(ValueError, match=r"^chain verify reference: fault 'bogus'"):
        cva.chain_verify_attention_ref(q, k, v, r2t, torch.tensor([0]), torch.tensor([5]), 3, 0.3, fault="bogus")


@pytest.mark.parametrize("cap", [0.5, 2.0])
def test_the_reference_soft_caps_the_scores(cap):
    """Logit soft cap ``cap * tanh(s / cap)`` on the scaled scores (SGLang's tanh capping): one
    query, two visible keys and one-hot values, so the output is the two attention weights."""
    q = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    k = torch.tensor([[[3.0, 0.0]], [[-1.0, 0.0]]], dtype=torch.float64)
    v = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    r2t, rpi = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([0])
    scale = 0.7
    out = cva.chain_verify_attention_ref(q, k, v, r2t, rpi, torch.tensor([1]), 1, scale, logit_cap=cap)
    s = [scale * 3.0, scale * -1.0]
    capped = [cap * math.tanh(x / cap) for x in s]
    w0 = 1.0 / (1.0 + math.exp(capped[1] - capped[0]))
    torch.testing.assert_close(out[0, 0], torch.tensor([w0, 1.0 - w0], dtype=torch.float64))
    plain = cva.chain_verify_attention_ref(q, k, v, r2t, rpi, torch.tensor([1]), 1, scale)
    assert plain[0, 0, 0] > out[0, 0, 0]  # capping flattens the weights


class _CudaLooking(torch.Tensor):
    """A CPU tensor that reports ``is_cuda``, so the launcher takes its GPU path."""

    @property
    def is_cuda(self):
        return True


class _Stage1Standin(triton.runtime.JITFunction):
    """Stage 1 on a GPU to the launcher: ``warmup`` records its build and reports ``shared`` bytes,
    ``kernel[grid](...)`` records the launch, both bound to the kernel's parameter names."""

    def __init__(self, shared):
        self.shared, self.warmups, self.launches = shared, [], []

    def __repr__(self):
        return "_Stage1Standin()"

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((grid, {**dict(zip(STAGE1_PARAMS, args)), **kwargs}))
        return SimpleNamespace(metadata=SimpleNamespace(shared=self.shared))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, {**dict(zip(STAGE1_PARAMS, args)), **kwargs}))


def test_the_depth_probe_compiles_the_build_it_launches(monkeypatch):
    """On a GPU the launcher compiles stage 1 (``warmup``) to read its shared memory before the
    first launch: with the launch's grid (several row blocks per KV head) and every argument, the
    strides by name."""
    stage1 = _Stage1Standin(shared=1)
    active = SimpleNamespace(get_current_device=lambda: 0, utils=SimpleNamespace(get_device_properties=lambda d: {"max_shared_mem": 10}))
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=active))
    monkeypatch.setattr(cva, "_chain_verify_stage1", stage1)
    monkeypatch.setattr(cva, "_chain_verify_stage2", _Recorder(STAGE2_PARAMS))
    monkeypatch.setattr(cva, "_STAGE1_STAGES", {})
    shape = cva.ChainVerifyShape(32, 2, 16, 16, 3)  # 48 rows per KV head: three row blocks
    assert shape.row_blocks == 3
    args = _inputs(shape, 2, 4)
    args["q"] = args["q"].as_subclass(_CudaLooking)
    cva.chain_verify_attention_fwd(**args)
    (wgrid, built), = stage1.warmups
    (lgrid, launched), = stage1.launches
    assert wgrid == lgrid == (2, 6, 4)
    strides = [n for n in STAGE1_PARAMS if n.startswith("stride_")]
    assert {n: built[n] for n in strides} == {n: launched[n] for n in strides}
    assert built["stride_kbs"] == args["k_buffer"].stride(0) != built["stride_kh"]
    assert built["stride_vbs"] == args["v_buffer"].stride(0) != built["stride_vh"]
    assert built["num_stages"] == launched["num_stages"] == cva.STAGE1_NUM_STAGES[0]
