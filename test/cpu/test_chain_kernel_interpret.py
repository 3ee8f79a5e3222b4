"""CPU tier: the chain verify Triton kernel under TRITON_INTERPRET=1 against the float64 reference.

Guards the kernel's indexing (page-table reads, causal limit per draft position, GQA row folding,
MLA 512+64 split tile, split-KV merge, empty splits) without a GPU. Runs in a subprocess because
TRITON_INTERPRET must be set before triton.jit decorates the kernels.

The test faults (the kernel's ``fault=`` launch argument, which the chain backends pass from
``SGLANG_VERIFY_GRAPH_TEST_FAULT`` when a server test proves that its model sees the verify or the
draft-extend attention): each fault, on its own launch (verify, or draft extend for the
``draft_extend_`` names), makes the kernel disagree with the correct float64 reference in some
(token, head) row and agree with the reference of that fault in every row; without one (every
other case here) the kernel computes the correct attention.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_cases import rank_heads, tp_rank_shapes

ROOT = Path(__file__).resolve().parents[2]
TP = tp_rank_shapes()


def _at_tp(name: str, ndt: int, seq_lens: list, splits: int = 2, draft_extend: bool = False) -> tuple:
    """A case (the tuple of ``CASES``) at the head shape of one tensor-parallel rank (``TP[name]``),
    ``splits`` KV splits (few: the interpreter runs every program of the grid, empty splits too)."""
    m = TP[name]
    return (m["heads"], m["kv_heads"], m["dk"], m["dv"], ndt, seq_lens, m["rope"], splits, 0.0, "float32", 0,
            draft_extend)


CASES = [
    # heads, kv_heads, dk, dv, ndt, seq_lens, rope, splits, cap
    (4, 2, 64, 64, 3, [5, 100, 200], 0, 4, 0.0),          # GQA, 3 requests, split boundary inside drafts
    (4, 1, 64, 64, 2, [1, 63, 130], 0, None, 0.0),        # MQA, seq_len 1 (padded-row value)
    (8, 1, 192, 128, 3, [70, 10], 64, 2, 0.0),             # MLA-style latent: main 128 + rope 64, V = K[..., :128]
    (4, 2, 64, 64, 4, [300], 0, 8, 5.0),                   # logit soft cap
    (6, 2, 80, 48, 6, [129, 64, 65], 0, 3, 0.0),           # non power-of-two head dims, ndt 6 (num_steps 5)
    (16, 1, 576, 512, 2, [40], 64, None, 0.0),             # real MLA widths (kv_lora 512 + rope 64), 16 heads
    (4, 2, 64, 64, 3, [70, 130], 0, 4, 0.0, "float16"),    # half operands (the interpreter's bf16 dot is unusable)
    (8, 1, 192, 128, 6, [70, 1, 129], 64, 2, 0.0),         # 48 rows per KV head: three 16-row blocks (MLA, 6 tokens)
    (8, 1, 192, 128, 5, [33, 200], 64, None, 0.0),         # 40 rows: three 16-row blocks, the last one half padding
    (8, 1, 192, 128, 6, [70, 1, 129], 64, 2, 0.0, "float32", 32),  # 48 rows as two 32-row blocks (block_rows=32)
    # DRAFT_EXTEND_V2: seq_lens include the chain (prefix + ndt); 1 is a padded row (prefix 0)
    (4, 2, 64, 64, 3, [8, 103, 1, 203], 0, 4, 0.0, "float32", 0, True),
    (8, 1, 192, 128, 4, [5, 1, 134], 64, 2, 0.0, "float32", 0, True),  # MLA-style latent
    # launch settings of the tuning harness (launch_with_config): 16-key blocks, 8 warps, 1 stage
    (8, 1, 192, 128, 4, [70, 1, 129], 64, 4, 0.0, "float32", 0, False, {"BLOCK_N": 16}),
    (8, 1, 192, 128, 3, [5, 1, 134], 64, 2, 0.0, "float32", 0, True, {"num_warps": 8}),
    (4, 2, 64, 64, 3, [5, 100, 200], 0, 8, 0.0, "float32", 0, False, {"BLOCK_N": 16, "num_stages": 1}),
    # one tensor-parallel rank's heads (the cheapest of test_chain_kernel_gpu.py's TP cases):
    _at_tp("kimi_small_tp8", 6, [70, 1]),        # 1 query head on the latent (multi-GPU tier, TP 8)
    _at_tp("llama_8b_tp8", 6, [70, 1]),          # 4 query heads / 1 KV head of 128
    _at_tp("kimi_k25_tp2", 6, [70]),             # 32 heads on the latent: 192 rows, six 32-row blocks
    _at_tp("kimi_small_draft_tp8", 3, [8, 1, 73], draft_extend=True),  # groups of 7 query heads
]

SCRIPT = """
import sys, json, torch
sys.path.insert(0, {test!r})
from kernel_cases import run_case
h, kvh, dk, dv, ndt, seqs, rope, splits, cap, *extra = json.loads(sys.argv[1])
err = run_case(heads=h, kv_heads=kvh, dk=dk, dv=dv, ndt=ndt, seq_lens=seqs, rope=rope,
               splits=splits, cap=cap, ctx=512, pool_slots=2048,
               dtype=getattr(torch, extra[0]) if extra else torch.float32,
               block_rows=extra[1] if len(extra) > 1 else 0,
               seq_lens_include_chain=bool(extra[2]) if len(extra) > 2 else False,
               stage1_overrides=extra[3] if len(extra) > 3 else None)
print("ERR", err)
"""


@pytest.mark.parametrize("case", CASES, ids=[f"h{c[0]}kv{c[1]}d{c[2]}ndt{c[4]}" + (f"r{c[10]}" if len(c) > 10 and c[10] else "")
                                     + ("-draft-extend" if len(c) > 11 and c[11] else "")
                                     + ("-" + "-".join(f"{k}{v}" for k, v in c[12].items()) if len(c) > 12 else "")
                                     for c in CASES])
def test_chain_kernel_matches_reference_in_interpreter(case):
    import json

    code = SCRIPT.format(test=str(ROOT / "test"))
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(case)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    err = float(r.stdout.split("ERR")[-1])
    bound = 2e-3 if len(case) > 9 and case[9] == "float16" else 1e-4  # fp16 operands, fp32 accumulation
    assert err < bound, f"relative error {err:.3e}"


def test_tp_rank_shapes_are_the_models_heads_per_rank():
    """The TP cases' head shapes: Kimi-K2.5 (64 heads, MLA 512 + 64), Llama-3.1-8B (32 / 8 KV heads
    of 128), kimi-small (8 heads, MLA) and its drafter (56 / 8 of 128) split over 2, 4 or 8 ranks;
    a KV head fewer than the ranks is replicated; a split that is not even is refused."""
    mla = dict(kv_heads=1, dk=576, dv=512, rope=64)
    assert [TP[f"kimi_k25_tp{tp}"] for tp in (2, 4, 8)] == [dict(heads=h, **mla) for h in (32, 16, 8)]
    assert [TP[f"kimi_small_tp{tp}"]["heads"] for tp in (2, 4, 8)] == [4, 2, 1]
    assert [(TP[f"llama_8b_tp{tp}"]["heads"], TP[f"llama_8b_tp{tp}"]["kv_heads"]) for tp in (2, 4, 8)] == [
        (16, 4), (8, 2), (4, 1)]
    assert TP["llama_8b_tp8"]["dk"] == TP["llama_8b_tp8"]["dv"] == 128
    assert (TP["kimi_small_draft_tp8"]["heads"], TP["kimi_small_draft_tp8"]["kv_heads"]) == (7, 1)
    assert rank_heads(dict(num_attention_heads=32, num_key_value_heads=2, head_dim=64), 8)["kv_heads"] == 1
    with pytest.raises(ValueError, match="TP 3"):
        rank_heads(dict(num_attention_heads=64, num_key_value_heads=8, head_dim=128), 3)


FAULT_SCRIPT = """
import sys, torch
sys.path.insert(0, {test!r})
from kernel_cases import run_case
for fault in sys.argv[1:]:
    draft_extend = fault.startswith("draft_extend_")
    # GQA, requests of prefix 5, 70 and 130: total 8 keys (one split: the split faults leave it
    # alone), 73 and 133 (2 and 3 splits: drop_middle_split drops split 1 of 3), and for
    # drop_middle_split 200 (4 splits: it drops split 2); a draft-extend launch's seq_lens include
    # the chain (prefix + 3)
    prefixes = [5, 70, 130] + ([200] if fault == "drop_middle_split" else [])
    case = dict(heads=4, kv_heads=2, dk=64, dv=64, ndt=3, splits=4, ctx=512, pool_slots=2048,
                seq_lens=[p + 3 * draft_extend for p in prefixes], seq_lens_include_chain=draft_extend)
    print("CORRECT", fault, run_case(**case, fault=fault, per_row=True))
    print("FAULTED", fault, run_case(**case, fault=fault, ref_fault=fault, per_row=True))
"""

FAULTS = ["causal_plus_one", "causal_minus_one", "drop_first_split", "middle_page_entry",
          "drop_middle_split", "draft_extend_causal_plus_one", "draft_extend_causal_minus_one",
          "draft_extend_drop_first_split"]


@pytest.fixture(scope="module")
def fault_errors():
    """``{(fault, "CORRECT" | "FAULTED"): largest (token, head) row error}`` of the kernel under
    each of :data:`FAULTS` against the correct float64 reference and against the reference of that
    fault: one interpreter subprocess for all of them (the import is most of a launch's time)."""
    code = FAULT_SCRIPT.format(test=str(ROOT / "test"))
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code, *FAULTS], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return {(f, kind): float(err) for kind, f, err in
            (ln.split() for ln in r.stdout.splitlines() if ln.startswith(("CORRECT", "FAULTED")))}


def test_every_kernel_fault_is_checked_in_the_interpreter():
    from sglang_verify_graph.kernel import TEST_FAULTS

    assert sorted(FAULTS) == sorted(TEST_FAULTS)


@pytest.mark.parametrize("fault", FAULTS)
def test_test_fault_switch_in_interpreter(fault_errors, fault):
    correct, faulted = fault_errors[fault, "CORRECT"], fault_errors[fault, "FAULTED"]
    print(f"{fault}: largest row error against the correct reference {correct:.3f}, against "
          f"the faulted one {faulted:.1e}")
    assert correct > 0.1, f"{fault} left the kernel's output as it was"
    assert faulted < 1e-4, f"{fault}: the kernel computed another fault than the reference's"
