"""CPU tier: ``bench/parts.py``, the per-part (attention / routed MoE / dense)
verify-vs-decode benchmark of one Kimi-K2.5 TP-8 layer.

Guards: the plan and argument checks (the default sweep, ``--quick``, at least 50 replays); the
bytes model (3 096 576 B per INT4 expert of the shard, computed by hand); the touched-expert count
and its uniform-routing expectation; the routing draws (decode tokens are exactly the verify
chains' first tokens, the ``shared`` overlap); the int4 packing against compressed-tensors'
``pack_to_int32`` and through SGLang's own Triton-layout conversion; percentiles; the per-layer
split (verify / decode = 1 + attention + MoE + dense terms) and the markdown tables. Under
``TRITON_INTERPRET=1`` (subprocesses, the variable must be set before the kernels are decorated):
the attention part end to end (ours, SGLang's decode and extend kernels, their agreement) and the
MoE part through ``CompressedTensorsWNA16TritonMoE.apply_weights`` against the float32 reference.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
import bench.parts as bvp
from bench.parts import cli as parts_cli


# ---- arguments and plan ----

def test_defaults_are_the_full_sweep():
    a = bvp.parse_args([])
    assert (a.batch_sizes, a.contexts, a.ndt) == ([1, 4, 16, 32], [1024, 4096, 16384], [3, 4])
    assert a.routings == ["random", "shared"] and a.parts == ["attention", "moe", "dense"]
    assert a.moe_methods == ["triton"] and a.replays >= 50 and a.shared_p == 0.5


def test_quick_is_a_subset_and_explicit_lists_win():
    a = bvp.parse_args(["--quick"])
    assert (a.batch_sizes, a.contexts, a.ndt) == ([1, 16], [4096], [3])
    a = bvp.parse_args(["--quick", "--contexts=1024,16384", "--batch-sizes", "4"])
    assert (a.batch_sizes, a.contexts, a.ndt) == ([4], [1024, 16384], [3])


@pytest.mark.parametrize("argv", [["--replays", "49"], ["--ndt", "1,3"], ["--routings", "random,zipf"],
                                  ["--parts", "attention,mlp"], ["--shared-p", "1.5"], ["--batch-sizes", "0"],
                                  ["--contexts", "1k"], ["--moe-copies", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bvp.parse_args(argv)
    assert e.value.code == 2


def test_compose_routing_falls_back_to_a_measured_one():
    assert bvp.parse_args(["--routings", "shared"]).compose_routing == "shared"


def test_plan_of_the_default_sweep():
    a = bvp.parse_args([])
    plan = bvp.build_plan(a)
    assert len(plan["attention"]) == 12 and all(p["timings"] == 5 for p in plan["attention"])
    # 4 decode points + 4 bs x 2 ndt x 2 routings verify points
    assert len(plan["moe"]) == 20
    assert sorted(p["tokens"] for p in plan["moe"] if p["role"] == "decode") == [1, 4, 16, 32]
    assert sorted({p["tokens"] for p in plan["moe"] if p["role"] == "verify"}) == [3, 4, 12, 16, 48, 64, 96, 128]
    assert [d["tokens"] for d in plan["dense"]] == [1, 3, 4, 12, 16, 32, 48, 64, 96, 128]
    assert plan["timings"] == 12 * 5 + 20 + 10 * 8
    by = {(p["bs"], p["ctx"]): p for p in plan["attention"]}
    # bs 1, 1k: 1029 slots x 576 x 2 B = 1 185 408 B per KV buffer -> 178 wanted, capped at 64
    assert by[1, 1024]["kv_bytes_per_copy"] == 1_185_408 and by[1, 1024]["copies"] == 64
    assert by[32, 16384]["copies"] == 1  # 604 MB alone exceeds 4 x 50 MiB
    assert plan["moe_weight_set_bytes"] == 384 * 3_096_576
    assert plan["ours_kv_splits"]["bs1_ndt3"] >= plan["ours_kv_splits"]["bs32_ndt4"]


def test_dry_run_prints_the_plan_without_a_gpu(capsys):
    assert parts_cli.main(["--dry-run", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "PLAN attention bs=1 ctx=4096 ndt=[3]" in out
    assert "PLAN moe triton verify bs=16 ndt=3 routing=shared T=48" in out
    assert "PLAN bytes per expert 3096576 (2752512 int4 + 344064 scales)" in out


def test_copies_for():
    mib = 2 ** 20
    assert bvp.copies_for(300 * mib, 50 * mib, 4, 64) == 1
    assert bvp.copies_for(100 * mib, 50 * mib, 4, 64) == 3   # ceil(200 / 100) + 1
    assert bvp.copies_for(1 * mib, 50 * mib, 4, 64) == 64    # 201 capped
    assert bvp.copies_for(1 * mib, 50 * mib, 4, 8) == 8


# ---- bytes model and routing ----

def test_expert_bytes_by_hand():
    # gate + up + down of one shard expert: 3 x 7168 x 256 = 5 505 024 int4 weights = 2 752 512 B;
    # one bf16 scale per 32 of them: 172 032 x 2 B = 344 064 B
    eb = bvp.expert_bytes()
    assert eb == {"weights": 5_505_024, "weight_bytes": 2_752_512, "scale_bytes": 344_064, "bytes": 3_096_576}
    row = bvp.moe_bytes_row(8, bvp.KIMI_K25_TP8, copy_tbps=4.0)
    assert row["touched_bytes"] == 8 * 3_096_576
    assert row["floor_ms_nominal"] == pytest.approx(24_772_608 / 4.8e12 * 1e3)  # 0.00516 ms
    assert row["floor_ms_copy"] == pytest.approx(24_772_608 / 4.0e12 * 1e3)


def test_unique_experts_on_a_hand_made_routing():
    ids = [[0, 1], [1, 2], [5, 0]]
    assert bvp.count_unique_experts(ids) == 4
    assert bvp.count_unique_experts(torch.tensor(ids, dtype=torch.int32)) == 4
    assert bvp.count_unique_experts([[3, -1], [-1, 3]]) == 1  # -1 (no local expert) is not an expert
    assert bvp.count_unique_experts(torch.tensor([[7, 7, 7]])) == 1


def test_uniform_expectation():
    f = bvp.expected_unique_experts_uniform
    assert f(384, 8, 0) == 0 and f(384, 8, 1) == pytest.approx(8)
    assert f(384, 8, 2) == pytest.approx(8 + 8 * (1 - 8 / 384))
    assert f(384, 8, 10_000) == pytest.approx(384)


def test_random_routing_touches_what_uniform_routing_predicts():
    e, k, bs, ndt = 384, 8, 16, 4
    draws = [bvp.draw_routing(bs, ndt, e, k, "random", seed=3, copy=c)[0] for c in range(24)]
    mean = sum(bvp.count_unique_experts(d) for d in draws) / len(draws)
    assert mean == pytest.approx(bvp.expected_unique_experts_uniform(e, k, bs * ndt), rel=0.02)


@pytest.mark.parametrize("mode", ["random", "shared"])
def test_decode_tokens_are_the_verify_chains_first_tokens(mode):
    ids, w = bvp.draw_routing(6, 4, 384, 8, mode, seed=1, copy=2)
    dec, _ = bvp.draw_routing(6, 1, 384, 8, mode, seed=1, copy=2)
    assert ids.shape == (24, 8) and ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids.view(6, 4, 8)[:, 0], dec)
    assert all(len(set(r)) == 8 for r in ids.tolist())  # top-8 distinct per token
    assert torch.allclose(w.sum(-1), torch.ones(24)) and (w > 0).all()
    again, _ = bvp.draw_routing(6, 4, 384, 8, mode, seed=1, copy=2)
    assert torch.equal(ids, again)
    assert not torch.equal(ids, bvp.draw_routing(6, 4, 384, 8, mode, seed=1, copy=3)[0])


def test_shared_routing_overlap():
    def overlap(p):
        ids, _ = bvp.draw_routing(64, 4, 384, 8, "shared", p_share=p, seed=0)
        v = ids.view(64, 4, 8)
        return sum(len(set(v[r, 0].tolist()) & set(v[r, j].tolist())) for r in range(64) for j in (1, 2, 3)) / (64 * 3)

    assert overlap(1.0) == 8 and overlap(0.0) == 0
    assert overlap(0.5) == pytest.approx(4, abs=0.4)
    ids_s, _ = bvp.draw_routing(16, 4, 384, 8, "shared", seed=0)
    ids_r, _ = bvp.draw_routing(16, 4, 384, 8, "random", seed=0)
    assert bvp.count_unique_experts(ids_s) < bvp.count_unique_experts(ids_r)


# ---- int4 packing ----

def test_pack_matches_compressed_tensors_and_round_trips():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (3, 16, 64), generator=g, dtype=torch.int8)
    words = bvp.pack_int4_compressed_tensors(q)
    assert words.shape == (3, 8, 16) and words.dtype == torch.int32
    ckpt = torch.stack([pack_to_int32(q[e], 4) for e in range(3)])  # checkpoint [E, N, K // 8]
    assert torch.equal(words, ckpt.transpose(1, 2))
    assert torch.equal(bvp.unpack_int4_compressed_tensors(words), q)
    with pytest.raises(ValueError):
        bvp.pack_int4_compressed_tensors(torch.full((1, 2, 8), 8, dtype=torch.int8))
    with pytest.raises(ValueError):
        bvp.pack_int4_compressed_tensors(torch.zeros(1, 2, 12, dtype=torch.int8))


def test_sglang_triton_layout_holds_the_packed_values():
    """Packed words through the scheme's own create_weights + process_weights_after_loading
    (CompressedTensorsWNA16TritonMoE) read back, nibble by nibble, as the values packed."""
    from types import SimpleNamespace

    from compressed_tensors import CompressionFormat
    from sglang.srt.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16_moe import (
        CompressedTensorsWNA16TritonMoE,
    )

    e, hidden, inter = 3, 64, 32
    scheme = CompressedTensorsWNA16TritonMoE(
        SimpleNamespace(quant_format=CompressionFormat.pack_quantized.value),
        SimpleNamespace(num_bits=4, strategy="group", group_size=32, actorder=None, symmetric=True))
    layer = torch.nn.Module()
    layer.moe_tp_size = 1
    scheme.create_weights(layer, e, hidden, inter, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    q13 = torch.randint(-8, 8, (e, 2 * inter, hidden), generator=g, dtype=torch.int8)
    q2 = torch.randint(-8, 8, (e, hidden, inter), generator=g, dtype=torch.int8)
    layer.w13_weight_packed.data.copy_(bvp.pack_int4_compressed_tensors(q13))
    layer.w2_weight_packed.data.copy_(bvp.pack_int4_compressed_tensors(q2))
    s13 = torch.rand(layer.w13_weight_scale.shape, generator=g).to(torch.bfloat16)
    layer.w13_weight_scale.data.copy_(s13)
    scheme.process_weights_after_loading(layer)
    assert layer.w13_weight_packed.shape == (e, 2 * inter, hidden // 2)
    assert torch.equal(bvp.unpack_int4_triton_layout(layer.w13_weight_packed), q13)
    assert torch.equal(bvp.unpack_int4_triton_layout(layer.w2_weight_packed), q2)
    assert torch.equal(layer.w13_weight_scale, s13.transpose(1, 2))  # [E, N, K // 32]
    # dequantize reads the checkpoint scale layout [E, K // 32, N]
    w = bvp.dequantize(q13, s13, 32)
    assert w[1, 5, 40].item() == pytest.approx(q13[1, 5, 40].item() * s13[1, 1, 5].float().item())


# ---- statistics, rows, tables ----

def test_percentiles_like_numpy():
    xs = list(range(1, 11))
    assert bvp.percentile(xs, 10) == pytest.approx(1.9) and bvp.percentile(xs, 90) == pytest.approx(9.1)
    s = bvp.summarize([3.0, 1.0, 2.0])
    assert s == {"median_ms": 2.0, "p10_ms": pytest.approx(1.2), "p90_ms": pytest.approx(2.8), "n": 3}


def _t(ms):
    return {"median_ms": ms, "p10_ms": ms * 0.99, "p90_ms": ms * 1.01, "n": 60}


def _synthetic(upstream=True):
    attention = [{"bs": 16, "ctx": 4096, "ndt": 3, "ours": _t(0.050), "decode": _t(0.040),
                  "upstream": _t(0.200) if upstream else None}]
    moe = [{"method": "triton", "role": "verify", "bs": 16, "ndt": 3, "routing": "random", "tokens": 48,
            "time": _t(0.300), "unique_experts": 240.0},
           {"method": "triton", "role": "verify", "bs": 16, "ndt": 3, "routing": "shared", "tokens": 48,
            "time": _t(0.250), "unique_experts": 180.0},
           {"method": "triton", "role": "decode", "bs": 16, "ndt": 1, "routing": "first", "tokens": 16,
            "time": _t(0.150), "unique_experts": 110.0}]
    ops = {k: _t(0.001) for k in bvp.DENSE_OPS}
    dense = [{"tokens": 48, "ops": {k: _t(0.002) for k in bvp.DENSE_OPS}}, {"tokens": 16, "ops": ops}]
    return attention, moe, dense


def test_layer_split_by_hand():
    a = bvp.parse_args([])
    (r,) = bvp.combine_rows(a, *_synthetic())
    # decode: 0.040 + 0.150 + 8 x 0.001 = 0.198; verify: 0.050 + 0.300 + 8 x 0.002 = 0.366
    assert r["layer_decode_ms"] == pytest.approx(0.198) and r["layer_verify_ms"] == pytest.approx(0.366)
    assert r["layer_ratio"] == pytest.approx(0.366 / 0.198)
    assert r["attn_contrib"] == pytest.approx(0.010 / 0.198) and r["moe_contrib"] == pytest.approx(0.150 / 0.198)
    assert r["dense_contrib"] == pytest.approx(0.008 / 0.198)
    assert 1 + r["attn_contrib"] + r["moe_contrib"] + r["dense_contrib"] == pytest.approx(r["layer_ratio"])
    assert r["bytes_ratio"] == pytest.approx(240 / 110) and r["moe_time_ratio"] == pytest.approx(2.0)
    assert r["layer_upstream_ratio"] == pytest.approx((0.200 + 0.300 + 0.016) / 0.198)
    assert r["layers_verify_ms_extrapolated"] == pytest.approx(61 * 0.366)
    (s,) = bvp.combine_rows(bvp.parse_args(["--compose-routing", "shared"]), *_synthetic())
    assert s["moe_verify_ms"] == 0.250 and s["experts_verify"] == 180.0


def test_main_table_row():
    a = bvp.parse_args([])
    table = bvp.format_table(bvp.combine_rows(a, *_synthetic()))
    head, rule, row = table.splitlines()
    assert head.startswith("| bs | ctx | ndt | attn ms ours / decode / upstream | MoE ms verify / decode |")
    assert "61 x layer ms verify / decode (extrapolated)" in head
    assert rule.count("---|") == head.count("|") - 1
    assert row == ("| 16 | 4096 | 3 | 0.0500 / 0.0400 / 0.2000 | 0.3000 / 0.1500 | 240.0 / 110.0 | 2.18 | 2.00 | "
                   "0.0160 / 0.0080 | **1.85** | 1 + 0.051 + 0.758 + 0.040 | 2.61 | 22.33 / 12.08 |")
    no_up = bvp.format_table(bvp.combine_rows(a, *_synthetic(upstream=False)), with_dense=False)
    assert "| 0.0500 / 0.0400 / - |" in no_up and "| - |" in no_up


def test_moe_and_dense_tables():
    _, moe, dense = _synthetic()
    t = bvp.format_moe_table(moe, copy_tbps=4.0)
    lines = t.splitlines()
    assert len(lines) == 2 + 3 and "floor ms @copy 4.00 TB/s" in lines[0]
    # 240 experts x 3 096 576 B = 743.2 MB; / 4.0 TB/s = 0.1858 ms; 0.300 / 0.1858 = 1.61
    assert "| triton | verify | 16 | 3 | random | 48 | 0.3000 (0.2970-0.3030) | 240.0 |" in lines[2]
    assert "| 743.2 | 0.1548 | 0.1858 | 1.61 |" in lines[2]
    d = bvp.format_dense_table(dense).splitlines()
    assert d[0] == "| T | " + " | ".join(bvp.DENSE_OPS) + " | sum |"
    assert d[2].endswith("| 0.0160 |")


# ---- end to end in the Triton interpreter ----

_E2E = r"""
import json, sys, torch
from dataclasses import replace
import bench.parts as bvp
from bench.parts import cli as parts_cli

def once(calls, replays, warmup, min_calls):  # runs every call; no CUDA graph on the CPU
    for f in calls:
        f()
    return {{"median_ms": 0.1 * len(calls), "p10_ms": 0.1, "p90_ms": 0.1, "n": 1, "input_sets": len(calls)}}

part = sys.argv[1]
out = {{}}
if part == "attention":
    shape = replace(bvp.KIMI_K25_TP8, max_context_len=256)   # real MLA widths: 8 heads, 576 / 512
    a = bvp.parse_args(["--batch-sizes", "2", "--contexts", "40", "--ndt", "3"])
    res = parts_cli.bench_attention(a, shape, 40, 2, 2, 4, True, device="cpu", dtype=torch.float32, timer=once)
    out["attention"] = [{{k: r[k] for k in ("check", "decode_meta", "ours_kv_splits", "copies", "ndt")}} for r in res]
else:
    import sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe as fm
    import sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config as fc
    if part == "moe":
        # SGLang's moe_align_block_size calls a CUDA op (sgl_kernel) that the CPU build lacks:
        # a Python version of its contract (per expert, token-slot ids padded to the block size;
        # padding ids = T * top_k; one expert id per block)
        def align(topk_ids, n_ids, block, sorted_ids, expert_ids, n_post, cumsum, pad, ignore=False):
            flat = topk_ids.reshape(-1).tolist()
            sorted_ids.fill_(len(flat)); expert_ids.fill_(-1)
            pos = blk = 0
            for e in range(n_ids - 1):
                toks = [i for i, x in enumerate(flat) if x == e]
                if toks:
                    sorted_ids[pos:pos + len(toks)] = torch.tensor(toks, dtype=torch.int32)
                    n = -(-len(toks) // block)
                    expert_ids[blk:blk + n] = e
                    pos, blk = pos + n * block, blk + n
            n_post.fill_(pos)
        mab = sys.modules["sglang.srt.layers.moe.moe_runner.triton_utils.moe_align_block_size"]
        mab.sgl_moe_align_block_size = align
        # the registered op sglang::outplace_fused_experts has a CUDA kernel only: call its body
        fm.outplace_fused_experts = lambda *p, **k: fm.fused_experts_impl(*p[:7], False, *p[7:], **k)
        # no device name on the CPU: no tuned config file, SGLang's default config
        fc.get_device_name = lambda: "cpu"
    shape = replace(bvp.KIMI_K25_TP8, hidden=64, moe_inter=64, num_experts=4, top_k=2)
    a = bvp.parse_args(["--batch-sizes", "2", "--ndt", "3", "--moe-copies", "2"])
    parts_cli._install_sglang_runtime()
    out["check"] = parts_cli.check_moe(a, "triton", shape, tokens=3, device="cpu", dtype=torch.float16)
    holder = parts_cli._SchemeHolder("triton", shape, 2, 0, device="cpu", dtype=torch.float16)
    moe = [parts_cli.bench_moe(a, holder, "decode", 2, 1, "first", timer=once),
           parts_cli.bench_moe(a, holder, "verify", 2, 3, "random", timer=once)]
    out["moe"] = [{{k: m[k] for k in ("role", "tokens", "unique_experts", "unique_experts_per_draw",
                                       "kernel_config", "time")}} for m in moe]
    dense = [parts_cli.bench_dense(a, bvp.KIMI_K25_TP8, t, 50 * 2 ** 20, device="cpu", timer=once) for t in (2, 6)]
    att = [{{"bs": 2, "ctx": 40, "ndt": 3, "ours": once([lambda: 0], 0, 0, 0), "decode": once([lambda: 0], 0, 0, 0),
             "upstream": None}}]
    rows = bvp.combine_rows(a, att, moe, dense)
    out["table"] = bvp.format_table(rows)
    out["moe_table"] = bvp.format_moe_table(moe, shape, 3.0)
print("RESULT " + json.dumps(out))
"""


def _run_e2e(part: str) -> dict:
    code = _E2E.format()
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", code, part], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-2000:] + r.stderr[-4000:])
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def test_attention_part_end_to_end_in_the_interpreter():
    """Ours, SGLang's grouped MLA decode kernel and its extend kernel (TARGET_VERIFY arguments) on
    the same KV and q: ours == upstream for every row, decode == ours' first row of each chain."""
    (r,) = _run_e2e("attention")["attention"]
    c = r["check"]
    assert c["ours_finite"] and c["upstream_finite"] and c["decode_finite"]
    assert c["ours_vs_upstream_rel_err"] < 1e-5 and c["decode_vs_ours_first_row_rel_err"] < 1e-5
    assert r["decode_meta"]["max_kv_splits"] == 8  # _mla_decode_kv_splits_cap(8, 4 SMs, 256)
    assert r["copies"] == 2 and r["ndt"] == 3


@pytest.mark.skipif(__import__("sglang").__version__ != "0.5.16",
                    reason="the MoE part calls SGLang 0.5.16's CompressedTensorsWNA16TritonMoE internals")
def test_moe_part_end_to_end_in_the_interpreter():
    """``CompressedTensorsWNA16TritonMoE.apply_weights`` (MoeRunner -> fused_experts ->
    fused_moe_kernel_gptq_awq, int4, group 32) on weights made by the scheme from random packed
    words, against ``reference_moe`` on the dequantized checkpoint words; then the rows and tables
    from the real point records. Three CPU stand-ins, named in the script: the alignment op, the
    CUDA-only op registration, the device name."""
    out = _run_e2e("moe")
    c = out["check"]
    assert c["finite"] and c["ref_rms"] > 0.05
    assert c["rel_err_vs_fp32_reference"] < 5e-3, c  # fp16 operands, fp32 accumulation
    dec, ver = out["moe"]
    assert dec["tokens"] == 2 and ver["tokens"] == 6
    assert all(1 <= u <= 4 for u in ver["unique_experts_per_draw"])
    assert dec["kernel_config"]["up"]["BLOCK_SIZE_M"] == 16  # SGLang's default for M <= E
    assert "| 2 | 40 | 3 |" in out["table"] and "**" in out["table"]
    assert "| triton | verify | 2 | 3 | random | 6 |" in out["moe_table"]


def test_sglang_fused_moe_as_is_in_the_interpreter():
    """Without the stand-ins: runs only if SGLang's fused_moe gains a CPU path."""
    code = _E2E.format()
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, "-c", code, "moe-as-is"], env=env, capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        errs = [ln for ln in r.stderr.splitlines() if re.search(r"\w+Error: ", ln)] or r.stderr.splitlines()[-1:]
        pytest.skip(f"SGLang's fused_moe does not run in the Triton interpreter as is: {errs[-1].strip()[:300]}")
    c = json.loads(r.stdout.split("RESULT ", 1)[1])["check"]
    assert c["finite"] and c["rel_err_vs_fp32_reference"] < 5e-3


# ---- the run's orchestration, with every GPU part replaced by a stand-in ----

def _fake_gpu(monkeypatch, attn_err=1e-3):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(L2_cache_size=50 * 2 ** 20, multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "stand-in GPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(parts_cli, "measure_copy_bandwidth",
                        lambda gib, replays: {"bytes_each_side": 1, "time": _t(1.0), "tbps": 4.0})
    monkeypatch.setattr(parts_cli, "_install_sglang_runtime", lambda: None)

    def attention(a, shape, ctx, bs, copies, num_sms, checks, **kw):
        return [{"bs": bs, "ctx": ctx, "ndt": n, "copies": copies, "ours": _t(0.01 * n), "decode": _t(0.02),
                 "upstream": _t(0.05 * n),
                 **({"check": {"ours_finite": True, "upstream_finite": True, "decode_finite": True,
                               "ours_vs_upstream_rel_err": attn_err, "decode_vs_ours_first_row_rel_err": 1e-3}}
                    if checks else {})} for n in a.ndt]

    class Holder:
        def __init__(self, method, shape, copies, seed, **kw):
            self.method = method

    def moe(a, holder, role, bs, ndt, routing, **kw):
        t = bs * ndt
        return {"method": holder.method, "role": role, "bs": bs, "ndt": ndt, "routing": routing, "tokens": t,
                "unique_experts": bvp.expected_unique_experts_uniform(384, 8, t), "time": _t(0.05 + 0.002 * t)}

    monkeypatch.setattr(parts_cli, "bench_attention", attention)
    monkeypatch.setattr(parts_cli, "_SchemeHolder", Holder)
    monkeypatch.setattr(parts_cli, "bench_moe", moe)
    monkeypatch.setattr(parts_cli, "check_moe", lambda a, m, shape: {"method": m, "finite": True,
                                                               "rel_err_vs_fp32_reference": 4e-3})
    monkeypatch.setattr(parts_cli, "bench_dense", lambda a, shape, t, l2: {"tokens": t, "ops": {k: _t(0.001 * t)
                                                                                         for k in bvp.DENSE_OPS}})


def test_run_writes_every_part_and_ends_with_the_layer_table(monkeypatch, tmp_path, capsys):
    _fake_gpu(monkeypatch)
    out = tmp_path / "parts.json"
    assert parts_cli.main(["--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().splitlines()[-1].startswith("| 16 | 4096 | 3 |")  # the per-layer table comes last
    assert "REPEAT " in text and "CHECK FAILED" not in text and "ERROR" not in text
    d = json.loads(out.read_text())
    assert [(r["bs"], r["ctx"], r["ndt"]) for r in d["rows"]] == [(1, 4096, 3), (16, 4096, 3)]
    assert len(d["moe"]) == 2 + 2 * 2 and len(d["dense"]) == 4  # T = 1, 3, 16, 48
    assert d["meta"]["shape"]["num_experts"] == 384 and d["meta"]["expert_bytes"]["bytes"] == 3_096_576
    assert d["meta"]["config"]["replays"] >= 50 and "extrapolated" in d["meta"]["extrapolation"]
    r = d["rows"][1]
    assert r["layer_ratio"] == pytest.approx(r["layer_verify_ms"] / r["layer_decode_ms"])
    assert {x["part"] for x in d["repeat"]} == {"attention", "moe"}
    assert d["repeat"][0]["ours"]["change"] == 0.0


def test_run_fails_on_a_bad_check(monkeypatch, capsys):
    _fake_gpu(monkeypatch, attn_err=0.5)
    assert parts_cli.main(["--quick", "--parts", "attention"]) == 1
    assert "CHECK FAILED attention ctx=4096 bs=1 ndt=3" in capsys.readouterr().out
