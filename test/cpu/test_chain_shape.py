"""CPU tier: ChainVerifyShape's row tiling (``block_r`` / ``row_blocks``), the policy behind the
kernel's grid. The kernel's time follows the padded query rows at large batch x context
(one program per row block), so the policy picks the row-block size that pads least."""

import pytest

from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits


def kimi(ndt, block_rows=0):  # one Kimi-K2.5 TP-8 shard in absorbed MLA: 8 heads, 1 latent head
    return ChainVerifyShape(8, 1, 576, 512, ndt, 64, block_rows)


@pytest.mark.parametrize("ndt, block_r, row_blocks", [
    (1, 16, 1), (2, 16, 1),   # 8 / 16 rows
    (3, 32, 1), (4, 32, 1),   # 24 / 32 rows: one 32-row block (16 would pad as much, with 2 KV reads)
    (5, 16, 3), (6, 16, 3),   # 40 / 48 rows: three 16-row blocks (48 padded) instead of two 32s (64)
    (7, 32, 2), (8, 32, 2),   # 56 / 64 rows: 64 padded either way, so the fewer blocks
    (9, 16, 5),               # 72 rows: 80 padded (16s) vs 96 (32s)
])
def test_block_r_pads_the_fewest_rows(ndt, block_r, row_blocks):
    s = kimi(ndt)
    assert (s.block_r, s.row_blocks) == (block_r, row_blocks)
    padded = s.block_r * s.row_blocks
    assert padded >= s.rows


def test_gqa_shapes_keep_one_block_up_to_32_rows():
    llama = ChainVerifyShape(32, 8, 128, 128, 6)  # group 4 x 6 tokens = 24 rows
    assert (llama.rows, llama.block_r, llama.row_blocks) == (24, 32, 1)
    assert ChainVerifyShape(32, 8, 128, 128, 3).block_r == 16  # 12 rows


def test_block_rows_forces_the_tiling():
    assert (kimi(6, 32).block_r, kimi(6, 32).row_blocks) == (32, 2)
    assert (kimi(3, 16).block_r, kimi(3, 16).row_blocks) == (16, 2)


@pytest.mark.parametrize("bad", [8, 24, 64, -16, 16.0, True])
def test_block_rows_rejects_other_sizes(bad):
    with pytest.raises(ValueError, match="block_rows"):
        kimi(6, bad)


def test_kv_splits_count_the_row_blocks():
    # 3 row blocks launch 1.5x the programs of 2 per split, so the split count halves at bs 8
    # (both tilings then launch 384 / 512 programs, about 2 per SM on 132 SMs)
    assert choose_num_kv_splits(kimi(6), 8, 132) == 16  # 2 * 132 / (8 * 3) = 11 -> 16
    assert choose_num_kv_splits(kimi(6, 32), 8, 132) == 32  # 2 * 132 / (8 * 2) = 16.5 -> 32
