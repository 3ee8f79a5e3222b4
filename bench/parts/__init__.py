"""Where one verify layer's time goes, part by part: attention vs routed MoE (vs dense GEMMs), for
verify (``bs x ndt`` tokens) against decode (``bs`` tokens), on one Kimi-K2.5 TP-8 shard layer.

    python -m bench parts [--batch-sizes 1,4,16,32] [--contexts 1024,4096,16384]
        [--ndt 3,4] [--routings random,shared] [--parts attention,moe,dense] [--out parts.json]
        [--quick] [--dry-run]

Layer shapes (``LayerShape``; DeepSeek-V3 architecture, one shard of TP 8): hidden 7168; absorbed
MLA with 8 query heads, one latent KV head, q/k width 576 = kv_lora 512 + rope 64, v width 512;
384 routed experts, top-8, expert width 256 (2048 / 8), INT4 W4A16 weights, symmetric, group 32
along K, bf16 scales (compressed-tensors ``pack-quantized``); shared expert width 256 in bf16;
61 layers.

Parts, each timed alone (one CUDA graph per part and point, ``bench.lib.timing.time_calls``):

(a) attention, KV context ``ctx`` per request:
    ours      ``chain_verify_attention_fwd`` (``sglang_verify_graph.kernel``), T = bs x ndt rows,
              prefix ``seq_lens = ctx``, splits from ``choose_num_kv_splits`` as the plugin's
              backend picks them;
    decode    ``decode_attention_fwd(..., has_mla=True)`` (SGLang 0.5.16
              ``sglang.kernels.ops.attention.decode_attention``, the grouped kernel), 1 token per
              request over ``ctx + 1`` keys; ``max_kv_splits`` from ``_mla_decode_kv_splits_cap``
              and per-request ``num_kv_splits`` from ``get_num_kv_splits_triton``, both as
              ``TritonAttnBackend`` computes them;
    upstream  ``extend_attention_fwd`` (``sglang.kernels.ops.attention.extend_attention``) as
              ``TritonAttnBackend.forward_extend`` calls it in TARGET_VERIFY: prefix through flat
              int64 ``kv_indices``, the draft tokens' K/V as extend tensors, a bool tree mask of
              ``ndt x (ctx + ndt)`` per request, ``is_causal=True``.
(b) routed MoE: ``CompressedTensorsWNA16TritonMoE.apply_weights`` (SGLang's WNA16 Triton MoE
    method: ``MoeRunner(TRITON)`` -> ``fused_experts_none_to_triton`` -> ``fused_experts(...,
    use_int4_w4a16=True, block_shape=[0, 32])``), weights made by the scheme's own
    ``create_weights`` and ``process_weights_after_loading`` from random packed int32 words, for
    T = bs x ndt (verify) and T = bs (decode) tokens, top-8 of 384 from a drawn routing
    (``draw_routing``). ``--moe-methods marlin`` adds ``CompressedTensorsWNA16MoE`` (Marlin, the
    method SGLang picks on CUDA unless ``--moe-runner-backend triton``).
(c) bytes model (``expert_bytes``, ``moe_bytes_row``): experts touched U = distinct expert ids
    over the T tokens' top-8 of the drawn routing; bytes per expert = 3 x 7168 x 256 x 4 bit / 8
    + 3 x 7168 x 256 / 32 bf16 scales = 3 096 576 B; floor = U x bytes / bandwidth, with the
    nominal 4.8 TB/s of an H200 and a measured device-to-device copy (bytes read + written).
(d) dense per-layer GEMMs at T tokens (bf16, ``torch.nn.functional.linear`` / ``torch.bmm`` as
    SGLang's unquantized layers run them): fused q_a + kv_a (7168 -> 1536 + 576), q_b (1536 ->
    8 x 192), absorbed ``w_kc`` (8 x [128 -> 512]) and ``w_vc`` (8 x [512 -> 128]), o_proj
    (1024 -> 7168), shared expert gate_up (7168 -> 2 x 256) and down (256 -> 7168), router gate
    (7168 -> 384).

Per layer: decode = attention(decode) + MoE(T = bs) + dense(T = bs); verify = attention(ours) +
MoE(T = bs x ndt) + dense(T = bs x ndt); verify / decode = 1 + (attention difference + MoE
difference + dense difference) / decode. "61 x layer" figures multiply one layer's parts by 61:
an extrapolation that leaves out the TP all-reduces, norms, rope, top-k selection, KV writes,
embedding / lm_head and launch gaps, and treats the first (dense-MLP) layer like the others.

Timing (``bench.lib.timing.time_calls``): each part's calls are captured into one CUDA graph (after an eager warm-up
that compiles every kernel); the graph is replayed ``--warmup`` times, then ``--replays`` (>= 50)
times between CUDA events; per-call ms = replay time / calls in the graph; median, p10, p90 over
the replays. Inputs that fit in L2 are rotated: attention reads one of several KV buffers per call
(as 61 layers each read their own, through one shared page table), the MoE one of ``--moe-copies``
weight sets, each with its own routing draw, the dense GEMMs one of several weight copies, so that
each set is reused only after ``--l2-multiple`` x L2 bytes of other sets (``copies_for``).

Output: a markdown table per (bs, ctx, ndt) (``format_table``), an MoE table per routing and a
dense table, and ``--out`` JSON: the config, device, versions, copy bandwidth, every timed point
(median, p10, p90, samples), the combined rows and the correctness checks (ours vs upstream and
decode vs ours' first row, relative error; the MoE method against a float32 dequantized reference
at T = 4).
"""

from __future__ import annotations

# The package's modules: model (the layer, bytes model, routing, INT4), tables, attention, moe
# (the GPU parts), cli (flags, plan, main); the timer is bench.lib.timing.
from bench.lib.timing import percentile, summarize, time_calls  # noqa: F401
from bench.parts.model import (  # noqa: F401
    _gen, copies_for, count_unique_experts, DENSE_OPS, dequantize, draw_routing,
    expected_unique_experts_uniform, expert_bytes, EXTRAPOLATION_NOTE, H200_HBM_TBPS, H200_L2_MIB,
    H200_SMS, KIMI_K25_TP8, kv_slots, LayerShape, MIN_REPLAYS, moe_bytes_row, MOE_METHODS,
    pack_int4_compressed_tensors, PARTS, reference_moe, rel_err, ROUTINGS,
    unpack_int4_compressed_tensors, unpack_int4_triton_layout,
)
from bench.parts.tables import (  # noqa: F401
    _f, _ms, combine_rows, format_dense_table, format_moe_table, format_table,
)
from bench.parts.attention import (  # noqa: F401
    bench_attention, measure_copy_bandwidth,
)
from bench.parts.moe import (  # noqa: F401
    _install_sglang_runtime, _SchemeHolder, bench_dense, bench_moe, check_moe,
)
from bench.parts.cli import (  # noqa: F401
    build_plan, format_plan, main, parse_args, parse_int_list, parse_name_list, QUICK,
)
