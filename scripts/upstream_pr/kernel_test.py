"""Parity of the split-KV chain verify kernel (``chain_verify_fwd``) with a float64 reference of
the topk == 1 chain attention, per (token, head) row, and with ``extend_attention_fwd`` (the
Triton backend's target-verify path on CUDA) on the same batch; and the calls it refuses.

Runs on CUDA. With ``TRITON_INTERPRET=1`` the small cases also run on the CPU in float32.
"""

import os
import unittest

import torch

from sglang.kernels.ops.attention.chain_verify import (
    MAX_KV_SPLITS,
    can_handle,
    chain_verify_fwd,
    workspace_numel_bound,
)
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=30, stage="base-b", runner_config="1-gpu-small")

ON_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = "cuda" if ON_CUDA else "cpu"
# The interpreter's low-precision dot products are not faithful: float32 there.
DTYPES = (torch.bfloat16, torch.float16) if ON_CUDA else (torch.float32,)
TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2, torch.float32: 1e-4}

# (q heads, kv heads, head_dim_qk, head_dim_v, num_draft_tokens, seq_lens, logit_cap)
CUDA_CASES = [
    (32, 8, 128, 128, 4, [1, 63, 64, 65, 1000, 4097], 0.0),  # Llama-3-8B, GQA 4
    (32, 32, 128, 128, 3, [5, 700, 2048], 0.0),  # MHA
    (16, 1, 128, 128, 6, [129, 1, 3000], 0.0),  # GQA 16: 96 rows per KV head
    (8, 4, 64, 64, 2, [17, 300], 0.0),  # head dim 64
    (12, 4, 96, 96, 3, [256, 33], 0.0),  # head dim 96 (not a power of two)
    (16, 2, 256, 256, 4, [77, 1500], 0.0),  # head dim 256
    (8, 2, 128, 128, 5, [300, 2], 30.0),  # logit soft cap
    (8, 1, 576, 512, 3, [1, 64, 2000, 8191], 0.0),  # absorbed MLA, 8 heads (TP 8 shard)
    (16, 1, 576, 512, 4, [900, 33], 0.0),  # absorbed MLA, 16 heads
    (128, 1, 576, 512, 2, [130, 5], 0.0),  # absorbed MLA, all 128 heads
]
INTERPRET_CASES = [
    (4, 2, 64, 64, 3, [5, 130, 1], 0.0),
    (8, 1, 192, 128, 4, [70, 129], 0.0),  # latent-style: 128 + 64 rope, V = K[..., :128]
    (4, 1, 64, 64, 2, [200], 5.0),
]
CASES = CUDA_CASES if ON_CUDA else INTERPRET_CASES
NUM_SMS = 132 if ON_CUDA else 4


def _batch(heads, kv_heads, dk, dv, ndt, seq_lens, dtype, seed=0, chain_in_seq=False):
    """A verify batch: a KV pool, a page table of shuffled slots, queries. Latent-style shapes
    (dk > dv with a rope tail) read V as the first dv columns of K, as SGLang's MLA pool does."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bs = len(seq_lens)
    prefix = [max(s - ndt, 0) if chain_in_seq else s for s in seq_lens]
    ctx = max(prefix) + ndt
    slots = bs * ctx + 8
    k_buffer = torch.randn(slots, kv_heads, dk, generator=g).to(dtype)
    if dk > dv:
        v_buffer = k_buffer[..., :dv]
    else:
        v_buffer = torch.randn(slots, kv_heads, dv, generator=g).to(dtype)
    rows = bs + 2
    req_to_token = torch.stack(
        [torch.randperm(slots - 1, generator=g)[:ctx] + 1 for _ in range(rows)]
    ).to(torch.int32)
    req_pool_indices = torch.randperm(rows, generator=g)[:bs].long()
    q = torch.randn(bs * ndt, heads, dk, generator=g).to(dtype)
    out = dict(
        q=q,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
    )
    out = {name: t.to(DEVICE) for name, t in out.items()}
    if dk > dv:
        out["v_buffer"] = out["k_buffer"][..., :dv]
    out["prefix"] = prefix
    return out


def _reference(b, ndt, sm_scale, logit_cap=0.0):
    """Float64 chain attention: draft position j of request i sees keys [0, prefix_i + j + 1)."""
    q = b["q"].double().cpu()
    k_buffer = b["k_buffer"].double().cpu()
    v_buffer = b["v_buffer"].double().cpu()
    heads, kv_heads = q.shape[1], k_buffer.shape[1]
    group = heads // kv_heads
    out = torch.empty(q.shape[0], heads, v_buffer.shape[2], dtype=torch.float64)
    for i, prefix in enumerate(b["prefix"]):
        row = b["req_to_token"][int(b["req_pool_indices"][i])].cpu()
        locs = row[: prefix + ndt].long()
        k = k_buffer[locs].repeat_interleave(group, dim=1)  # [L, H, Dk]
        v = v_buffer[locs].repeat_interleave(group, dim=1)
        qi = q[i * ndt : (i + 1) * ndt]  # [ndt, H, Dk]
        s = torch.einsum("jhd,lhd->jhl", qi, k) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        cols = torch.arange(prefix + ndt)
        limit = prefix + torch.arange(ndt) + 1
        s = s.masked_fill(cols[None, None, :] >= limit[:, None, None], float("-inf"))
        out[i * ndt : (i + 1) * ndt] = torch.einsum("jhl,lhd->jhd", s.softmax(-1), v)
    return out


def _run_chain(b, ndt, sm_scale, logit_cap=0.0, max_kv_splits=MAX_KV_SPLITS, chain_in_seq=False):
    heads, dv = b["q"].shape[1], b["v_buffer"].shape[2]
    bs = len(b["prefix"])
    n_out, n_lse = workspace_numel_bound(heads, dv, ndt, bs, max_kv_splits, NUM_SMS)
    att_out = torch.full((n_out,), float("nan"), device=DEVICE)
    att_lse = torch.full((n_lse,), float("nan"), device=DEVICE)
    o = torch.full((bs * ndt, heads, dv), float("nan"), dtype=b["q"].dtype, device=DEVICE)
    ran = chain_verify_fwd(
        b["q"],
        o,
        b["k_buffer"],
        b["v_buffer"],
        b["req_to_token"],
        b["req_pool_indices"],
        b["seq_lens"],
        ndt,
        sm_scale,
        att_out,
        att_lse,
        max_kv_splits=max_kv_splits,
        num_sms=NUM_SMS,
        logit_cap=logit_cap,
        seq_lens_include_chain=chain_in_seq,
    )
    return ran, o


def _max_row_error(out, ref):
    out = out.double().cpu()
    err = (out - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-12)
    return err.max().item()


@unittest.skipUnless(ON_CUDA or INTERPRET, "needs CUDA, or TRITON_INTERPRET=1 on the CPU")
class TestChainVerifyKernel(CustomTestCase):
    def test_matches_reference_per_row(self):
        for heads, kv_heads, dk, dv, ndt, seq_lens, cap in CASES:
            for dtype in DTYPES:
                with self.subTest(heads=heads, kv_heads=kv_heads, dk=dk, ndt=ndt, dtype=dtype):
                    b = _batch(heads, kv_heads, dk, dv, ndt, seq_lens, dtype)
                    ran, o = _run_chain(b, ndt, dk**-0.5, cap)
                    self.assertTrue(ran)
                    self.assertFalse(torch.isnan(o).any().item(), "unwritten output rows")
                    ref = _reference(b, ndt, dk**-0.5, cap)
                    self.assertLess(_max_row_error(o, ref), TOL[dtype])

    def test_split_count_does_not_change_the_result(self):
        heads, kv_heads, dk, dv, ndt, seq_lens, _ = CASES[0]
        b = _batch(heads, kv_heads, dk, dv, ndt, seq_lens, DTYPES[0])
        ref = _reference(b, ndt, dk**-0.5)
        for max_kv_splits in (1, 2, 8, MAX_KV_SPLITS):
            with self.subTest(max_kv_splits=max_kv_splits):
                ran, o = _run_chain(b, ndt, dk**-0.5, max_kv_splits=max_kv_splits)
                self.assertTrue(ran)
                self.assertLess(_max_row_error(o, ref), TOL[DTYPES[0]])

    @unittest.skipUnless(ON_CUDA, "extend_attention_fwd is compared on CUDA only")
    def test_matches_extend_attention(self):
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        for heads, kv_heads, dk, dv, ndt, seq_lens, cap in CASES:
            with self.subTest(heads=heads, kv_heads=kv_heads, dk=dk, ndt=ndt):
                b = _batch(heads, kv_heads, dk, dv, ndt, seq_lens, torch.bfloat16)
                ran, o = _run_chain(b, ndt, dk**-0.5, cap)
                self.assertTrue(ran)
                bs = len(seq_lens)
                rows = b["req_to_token"][b["req_pool_indices"]].long()
                prefix = torch.tensor(b["prefix"], device=DEVICE)
                kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=DEVICE)
                kv_indptr[1:] = torch.cumsum(prefix, 0)
                kv_indices = torch.cat([rows[i, :p] for i, p in enumerate(b["prefix"])])
                chain = torch.stack([rows[i, p : p + ndt] for i, p in enumerate(b["prefix"])])
                chain = chain.reshape(-1)
                o_ext = torch.empty_like(o)
                extend_attention_fwd(
                    b["q"],
                    b["k_buffer"][chain].contiguous(),
                    b["v_buffer"][chain].contiguous(),
                    o_ext,
                    b["k_buffer"],
                    b["v_buffer"],
                    torch.arange(0, (bs + 1) * ndt, ndt, dtype=torch.int32, device=DEVICE),
                    kv_indptr,
                    kv_indices.to(torch.int64),
                    None,
                    True,
                    torch.zeros(bs + 1, dtype=torch.int64, device=DEVICE),
                    ndt,
                    1.0,
                    1.0,
                    dk**-0.5,
                    logit_cap=cap,
                )
                ref = _reference(b, ndt, dk**-0.5, cap)
                self.assertLess(_max_row_error(o, ref), TOL[torch.bfloat16])
                self.assertLess(_max_row_error(o_ext, ref), TOL[torch.bfloat16])
# <draft-extend>

    def test_draft_extend_lengths_match_reference_per_row(self):
        # DRAFT_EXTEND_V2: seq_lens include the chain; 1 is a padded row (prefix 0).
        for heads, kv_heads, dk, dv, ndt, seq_lens, cap in CASES:
            with self.subTest(heads=heads, kv_heads=kv_heads, dk=dk, ndt=ndt):
                lens = [s + ndt for s in seq_lens] + [1]
                b = _batch(heads, kv_heads, dk, dv, ndt, lens, DTYPES[0], chain_in_seq=True)
                ran, o = _run_chain(b, ndt, dk**-0.5, cap, chain_in_seq=True)
                self.assertTrue(ran)
                ref = _reference(b, ndt, dk**-0.5, cap)
                self.assertLess(_max_row_error(o, ref), TOL[DTYPES[0]])
# </draft-extend>


class TestChainVerifyRefusals(CustomTestCase):
    """Calls ``chain_verify_fwd`` does not serve: it returns False and writes nothing (the
    backend then runs ``extend_attention_fwd``). No kernel runs, so these need no GPU."""

    def _args(self, **tensors):
        b = _batch(4, 2, 64, 64, 3, [10, 20], torch.float32)
        b.pop("prefix")
        o = torch.full((6, 4, 64), float("nan"), device=DEVICE)
        args = dict(b, o=o, num_draft_tokens=3)
        args.update(tensors)
        return args

    def _refused(self, tensors=None, workspace=10**6, **kwargs):
        a = self._args(**(tensors or {}))
        ran = chain_verify_fwd(
            a["q"],
            a["o"],
            a["k_buffer"],
            a["v_buffer"],
            a["req_to_token"],
            a["req_pool_indices"],
            a["seq_lens"],
            a["num_draft_tokens"],
            0.125,
            torch.empty(workspace, device=DEVICE),
            torch.empty(workspace, device=DEVICE),
            max_kv_splits=8,
            num_sms=NUM_SMS,
            **kwargs,
        )
        return not ran and bool(torch.isnan(a["o"]).all().item())

    def test_refused_calls_write_nothing(self):
        fp8 = torch.zeros(64, 2, 64, dtype=torch.float8_e4m3fn, device=DEVICE)
        cases = {
            "sinks": dict(sinks=torch.zeros(4)),
            "sliding window": dict(sliding_window_size=128),
            "not causal": dict(is_causal=False),
            "xai temperature": dict(xai_temperature_len=4096),
            "non-unit KV scale": dict(k_scale=0.5),
            "tensor KV scale": dict(v_scale=torch.ones(())),
            "FP8 KV cache": dict(tensors=dict(k_buffer=fp8, v_buffer=fp8)),
            "ragged chain": dict(tensors=dict(num_draft_tokens=2)),
            "scratch too small": dict(workspace=16),
        }
        for name, change in cases.items():
            with self.subTest(name):
                self.assertTrue(self._refused(**change))

    def test_can_handle_the_plain_chain(self):
        a = self._args()
        self.assertTrue(
            can_handle(
                a["q"],
                a["o"],
                a["k_buffer"],
                a["v_buffer"],
                a["req_to_token"],
                a["req_pool_indices"],
                3,
            )
        )

    def test_workspace_bound_covers_every_layout(self):
        from sglang.kernels.ops.attention.chain_verify import (
            chain_verify_shape,
            choose_num_kv_splits,
            workspace_numel,
        )

        for heads, kv_heads, dk, dv in ((32, 8, 128, 128), (8, 1, 576, 512), (64, 64, 64, 64)):
            for ndt in (2, 4, 6):
                shape = chain_verify_shape(heads, kv_heads, dk, dv, ndt)
                for max_kv_splits in (1, 8, 256):
                    for bs in (1, 2, 3, 7, 8, 33, 160, 512):
                        splits = max(1, min(choose_num_kv_splits(shape, bs, 132), max_kv_splits))
                        need = workspace_numel(shape, bs, splits)
                        have = workspace_numel_bound(heads, dv, ndt, bs, max_kv_splits, 132)
                        self.assertLessEqual(need[0], have[0])
                        self.assertLessEqual(need[1], have[1])


if __name__ == "__main__":
    unittest.main()
