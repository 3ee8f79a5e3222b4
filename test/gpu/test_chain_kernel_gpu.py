"""GPU tier: the chain verify kernel in bf16 on the real shapes, against the float64 reference.

Fresh random inputs per case, NaN-poisoned outputs and scratch, random page tables; error bound
for bf16 operands with fp32 accumulation: relative error < 2e-2 (the usual bf16 tolerance
is 1e-3 to 1e-2; the KV and q are bf16-rounded before the reference sees them, so typical is ~4e-3),
and every (token, head) row within 3e-2 of its reference row.

The ``_tp`` cases run the head shapes one tensor-parallel rank launches at TP 2 / 4 / 8
(``kernel_cases.tp_rank_shapes``): Kimi-K2.5 32 / 16 / 8 heads on one MLA latent (up to six 32-row
blocks), Llama-3.1-8B 16/4, 8/2, 4/1, kimi-small 4 / 2 / 1 heads on the latent; draft extend of
Kimi-K2.5's drafter (groups of 1, up to 32 KV heads) and kimi-small's (groups of 7).
"""

import pytest
import torch

from kernel_cases import run_case, tp_rank_shapes

pytestmark = pytest.mark.gpu

LLAMA_8B = dict(heads=32, kv_heads=8, dk=128, dv=128, rope=0)      # one GPU, TP 1
KIMI_TP8 = dict(heads=8, kv_heads=1, dk=576, dv=512, rope=64)       # one TP-8 shard, absorbed MLA
ROW_TOL = 3e-2  # every (token, head) row of the output: one bad row in thousands cannot hide
TP = tp_rank_shapes()
TP_TARGETS = [k for k in TP if "_draft_" not in k]
TP_DRAFTERS = [k for k in TP if "_draft_" in k]


@pytest.mark.parametrize("model", [LLAMA_8B, KIMI_TP8], ids=["llama8b", "kimi_tp8"])
@pytest.mark.parametrize("ndt", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("seq_lens", [[1], [1023], [63, 64, 65, 127, 128, 129], [3000, 17, 900, 2048, 5, 1, 700, 64]])
def test_chain_kernel_bf16_matches_reference(model, ndt, seq_lens):
    err, row = run_case(**model, ndt=ndt, seq_lens=seq_lens, dtype=torch.bfloat16, device="cuda",
                        ctx=4096, pool_slots=40000, seed=ndt * 7 + len(seq_lens), per_row="both")
    assert err < 2e-2, f"relative error {err:.3e}"
    assert row < ROW_TOL, f"per-row relative error {row:.3e}"


@pytest.mark.parametrize("splits", [1, 2, 16, 64])
def test_chain_kernel_any_split_count(splits):
    err, row = run_case(**LLAMA_8B, ndt=3, seq_lens=[2000, 33], dtype=torch.bfloat16, device="cuda",
                        ctx=4096, pool_slots=40000, splits=splits, per_row="both")
    assert err < 2e-2, f"relative error {err:.3e} with {splits} splits"
    assert row < ROW_TOL, f"per-row relative error {row:.3e} with {splits} splits"


@pytest.mark.parametrize("block_rows", [16, 32])
def test_chain_kernel_either_row_block_size(block_rows):
    """48 query rows per KV head (Kimi TP-8 MLA, 6 draft tokens) as three 16-row or two 32-row
    blocks: both tilings give the reference's output (the A/B of ``python -m bench kernel --block-rows``)."""
    err, row = run_case(**KIMI_TP8, ndt=6, seq_lens=[3000, 17, 900, 1], dtype=torch.bfloat16, device="cuda",
                        ctx=4096, pool_slots=40000, block_rows=block_rows, per_row="both")
    assert err < 2e-2, f"relative error {err:.3e} with block_rows={block_rows}"
    assert row < ROW_TOL, f"per-row relative error {row:.3e} with block_rows={block_rows}"


@pytest.mark.parametrize("model", [LLAMA_8B, KIMI_TP8, dict(heads=8, kv_heads=1, dk=128, dv=128, rope=0)],
                         ids=["llama8b", "kimi_tp8_mla", "kimi_tp8_llama_draft"])
@pytest.mark.parametrize("ndt", [3, 4])
def test_draft_extend_lengths_match_reference_per_row(model, ndt):
    """DRAFT_EXTEND_V2 lengths (``seq_lens`` = prefix + ndt; 1 is a padded row of the draft-extend
    graph, prefix 0) on the target shapes and the Kimi shard's Llama-style drafter (8 heads, 1 KV
    head): every (token, head) row within 3e-2 of the float64 reference."""
    seq_lens = [n + ndt for n in (3000, 17, 900, 64)] + [1]
    err = run_case(**model, ndt=ndt, seq_lens=seq_lens, dtype=torch.bfloat16, device="cuda",
                   ctx=4096, pool_slots=40000, seed=ndt, seq_lens_include_chain=True, per_row=True)
    print(f"per-row max relative error {err:.3e}")
    assert err < ROW_TOL, f"per-row relative error {err:.3e}"


@pytest.mark.parametrize("rank_shape", TP_TARGETS)
@pytest.mark.parametrize("ndt", [3, 6])
def test_chain_kernel_at_tp_rank_heads(rank_shape, ndt):
    """One TP rank's heads of each target (``TP_TARGETS``), 3 and 6 draft tokens, page-edge and long
    lengths and a padded row (length 1): whole tensor within 2e-2, every (token, head) row within
    3e-2 of the float64 reference."""
    err, row = run_case(**TP[rank_shape], ndt=ndt, seq_lens=[3000, 17, 64, 129, 1], dtype=torch.bfloat16,
                        device="cuda", ctx=4096, pool_slots=40000, seed=ndt, per_row="both")
    assert err < 2e-2, f"{rank_shape}: relative error {err:.3e}"
    assert row < ROW_TOL, f"{rank_shape}: per-row relative error {row:.3e}"


@pytest.mark.parametrize("rank_shape", TP_DRAFTERS)
def test_draft_extend_at_tp_rank_heads(rank_shape):
    """One TP rank's heads of each EAGLE-3 drafter (``TP_DRAFTERS``) in DRAFT_EXTEND_V2 (lengths with
    the chain, a padded row of length 1), 3 draft tokens: every (token, head) row within 3e-2."""
    seq_lens = [n + 3 for n in (3000, 17, 64)] + [1]
    err = run_case(**TP[rank_shape], ndt=3, seq_lens=seq_lens, dtype=torch.bfloat16, device="cuda",
                   ctx=4096, pool_slots=40000, seed=3, seq_lens_include_chain=True, per_row=True)
    assert err < ROW_TOL, f"{rank_shape}: per-row relative error {err:.3e}"
