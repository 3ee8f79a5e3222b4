#!/usr/bin/env python3
"""Where one verify layer's time goes, part by part: attention vs routed MoE (vs dense GEMMs), for
verify (``bs x ndt`` tokens) against decode (``bs`` tokens), on one Kimi-K2.5 TP-8 shard layer.

    python3 bench/parts.py [--batch-sizes 1,4,16,32] [--contexts 1024,4096,16384]
        [--ndt 3,4] [--routings random,shared] [--parts attention,moe,dense] [--out parts.json]
        [--quick] [--dry-run]

Layer shapes (``LayerShape``; DeepSeek-V3 architecture, one shard of TP 8): hidden 7168; absorbed
MLA with 8 query heads, one latent KV head, q/k width 576 = kv_lora 512 + rope 64, v width 512;
384 routed experts, top-8, expert width 256 (2048 / 8), INT4 W4A16 weights, symmetric, group 32
along K, bf16 scales (compressed-tensors ``pack-quantized``); shared expert width 256 in bf16;
61 layers.

Parts, each timed alone (one CUDA graph per part and point, see ``time_calls``):

(a) attention, KV context ``ctx`` per request:
    ours      ``chain_verify_attention_fwd`` (``sgl-kernel/sglang_verify_graph.kernel``), T = bs x ndt rows,
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

Timing (``time_calls``): each part's calls are captured into one CUDA graph (after an eager warm-up
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

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

PARTS = ("attention", "moe", "dense")
ROUTINGS = ("random", "shared")
MOE_METHODS = ("triton", "marlin")
MIN_REPLAYS = 50
H200_HBM_TBPS = 4.8
H200_L2_MIB = 50
H200_SMS = 132
DENSE_OPS = ("qkv_a", "q_b", "w_kc", "w_vc", "o_proj", "shared_gate_up", "shared_down", "router")
EXTRAPOLATION_NOTE = ("61 x layer = one layer's timed parts x 61 (extrapolated; no all-reduce, norms, rope, "
                      "top-k, KV writes, embedding / lm_head or launch gaps; the first, dense-MLP layer "
                      "counted as a MoE layer)")


@dataclass(frozen=True)
class LayerShape:
    """One decoder layer of a Kimi-K2.5 TP-8 shard (DeepSeek-V3 architecture), widths in elements.

    heads: query heads of the shard (64 / 8); kv_lora + rope: the absorbed-MLA latent (q/k width
    576, v width 512 = kv_lora); qk_nope / v_head: per-head widths of ``w_kc`` / ``w_vc``;
    moe_inter / shared_inter: routed / shared expert width of the shard (2048 / 8);
    group / num_bits: INT4 W4A16 quantization (symmetric, one bf16 scale per 32 weights along K).
    sm_scale = (qk_nope + rope) ** -0.5 (the softmax scale of DeepSeek-V3 MLA without the YaRN
    mscale, which only rescales the logits).
    """

    hidden: int = 7168
    heads: int = 8
    kv_lora: int = 512
    rope: int = 64
    qk_nope: int = 128
    v_head: int = 128
    q_lora: int = 1536
    num_experts: int = 384
    top_k: int = 8
    moe_inter: int = 256
    shared_inter: int = 256
    group: int = 32
    num_bits: int = 4
    scale_bytes: int = 2
    layers: int = 61
    max_context_len: int = 262144

    @property
    def qk_dim(self) -> int:
        return self.kv_lora + self.rope

    @property
    def sm_scale(self) -> float:
        return (self.qk_nope + self.rope) ** -0.5


KIMI_K25_TP8 = LayerShape()


# ------------------------------------------------------------------ model of bytes (CPU) -----

def expert_bytes(shape: LayerShape = KIMI_K25_TP8) -> dict:
    """Bytes of one routed expert of the shard: gate and up ([moe_inter, hidden] each) and down
    ([hidden, moe_inter]) at ``num_bits`` per weight, plus one ``scale_bytes`` scale per ``group``
    weights along K. Kimi-K2.5 TP 8: 3 x 7168 x 256 = 5 505 024 weights -> 2 752 512 B + 172 032
    scales x 2 B = 344 064 B -> 3 096 576 B."""
    weights = 3 * shape.hidden * shape.moe_inter
    w_bytes = weights * shape.num_bits // 8
    s_bytes = weights // shape.group * shape.scale_bytes
    return {"weights": weights, "weight_bytes": w_bytes, "scale_bytes": s_bytes, "bytes": w_bytes + s_bytes}


def count_unique_experts(topk_ids) -> int:
    """Distinct expert ids (>= 0) in ``topk_ids`` ([T, top_k] int tensor or nested lists)."""
    if hasattr(topk_ids, "reshape"):
        flat = topk_ids.reshape(-1).tolist()
    else:
        flat = [e for row in topk_ids for e in row]
    return len({int(e) for e in flat if int(e) >= 0})


def expected_unique_experts_uniform(num_experts: int, top_k: int, tokens: int) -> float:
    """E[distinct experts] when each of ``tokens`` tokens picks ``top_k`` distinct experts
    uniformly and independently: an expert is missed by one token with probability
    ``1 - top_k / E``, so E[U] = E x (1 - (1 - top_k / E) ** T)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def moe_bytes_row(unique_experts: float, shape: LayerShape, copy_tbps: float | None,
                  nominal_tbps: float = H200_HBM_TBPS) -> dict:
    """Touched-expert bytes (MB = 1e6 B) and the time floors (ms) they give at the nominal and the
    measured bandwidth (TB/s = 1e12 B/s): floor_ms = bytes / (TB/s x 1e12) x 1e3."""
    b = unique_experts * expert_bytes(shape)["bytes"]
    row = {"touched_bytes": b, "touched_mb": b / 1e6, "floor_ms_nominal": b / (nominal_tbps * 1e12) * 1e3}
    if copy_tbps:
        row["floor_ms_copy"] = b / (copy_tbps * 1e12) * 1e3
    return row


# ------------------------------------------------------------------ routing (CPU) ------------

def _gen(*key: int):
    """CPU generator seeded from integers (the same seed in every process)."""
    import torch

    g = torch.Generator()
    g.manual_seed(sum(int(k) * 1_000_003 ** i for i, k in enumerate(key)) % (2 ** 62))
    return g


def draw_routing(bs: int, ndt: int, num_experts: int, top_k: int, mode: str = "random",
                 p_share: float = 0.5, seed: int = 0, copy: int = 0):
    """Top-k routing of ``bs`` requests x ``ndt`` tokens (token t = request t // ndt, position
    t % ndt, the layout of a verify batch). Returns ``(topk_ids [bs*ndt, top_k] int32,
    topk_weights [bs*ndt, top_k] float32, rows summing to 1)`` on the CPU.

    Each request's first token draws ``top_k`` distinct experts uniformly, from a generator keyed
    by (seed, bs, copy) only, so ``draw_routing(bs, 1, ...)`` (decode) gives exactly the first
    tokens of every ``ndt``. Later tokens: ``random`` draws them the same way, independently;
    ``shared`` keeps each of the first token's experts with probability ``p_share`` and replaces
    the others by experts outside the first token's set (expected overlap ``p_share x top_k``).
    """
    import torch

    if mode not in ROUTINGS:
        raise ValueError(f"routing {mode!r}: use one of {ROUTINGS}")
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k {top_k} of {num_experts} experts")
    g_first = _gen(seed, bs, copy, 1)
    g_rest = _gen(seed, bs, ndt, ROUTINGS.index(mode), copy, 2)
    ids = torch.empty(bs * ndt, top_k, dtype=torch.int64)
    for r in range(bs):
        first = torch.randperm(num_experts, generator=g_first)[:top_k]
        ids[r * ndt] = first
        for j in range(1, ndt):
            if mode == "random":
                ids[r * ndt + j] = torch.randperm(num_experts, generator=g_rest)[:top_k]
                continue
            keep = torch.rand(top_k, generator=g_rest) < p_share
            outside = torch.ones(num_experts, dtype=torch.bool)
            outside[first] = False
            pool = torch.nonzero(outside).flatten()
            fresh = pool[torch.randperm(pool.numel(), generator=g_rest)[:top_k]]
            ids[r * ndt + j] = torch.where(keep, first, fresh)
    w = torch.rand(bs * ndt, top_k, generator=g_rest) + 0.1
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).to(torch.float32)


# ------------------------------------------------------------------ int4 packing (CPU/GPU) ---

def pack_int4_compressed_tensors(q):
    """Pack int4 values ``q`` ([E, N, K] integer tensor in [-8, 7], K % 8 == 0) into the int32 layout
    SGLang's ``CompressedTensorsWNA16MoE.create_weights`` holds after loading (``is_transposed``):
    ``[E, K // 8, N]``, word ``[e, j, n]`` holding ``q[e, n, 8j + i] + 8`` in bits ``4i .. 4i + 3``
    (compressed-tensors ``pack_to_int32``, ``num_bits=4``, on the checkpoint's [N, K] weight,
    then transposed)."""
    import torch

    e, n, k = q.shape
    if k % 8:
        raise ValueError(f"K = {k} is not a multiple of 8")
    if int(q.min()) < -8 or int(q.max()) > 7:
        raise ValueError("int4 values must lie in [-8, 7]")
    u = (q.to(torch.int64) + 8).view(e, n, k // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device)
    words = (u << shifts).sum(-1)  # [E, N, K // 8] in [0, 2**32)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return words.transpose(1, 2).contiguous()


def unpack_int4_compressed_tensors(words):
    """Inverse of ``pack_int4_compressed_tensors``: ``[E, K // 8, N]`` int32 -> ``[E, N, K]`` int8 in
    [-8, 7]."""
    import torch

    e, k8, n = words.shape
    w = words.to(torch.int64)
    nib = torch.stack([(w >> (4 * i)) & 0xF for i in range(8)], dim=2)  # [E, K//8, 8, N]
    return (nib.permute(0, 3, 1, 2).reshape(e, n, k8 * 8) - 8).to(torch.int8)


def unpack_int4_triton_layout(w_u8):
    """``[E, N, K // 2]`` uint8 (the layout ``CompressedTensorsWNA16TritonMoE
    .process_weights_after_loading`` makes, read by ``fused_moe_kernel_gptq_awq``: byte ``k // 2``,
    low nibble for even k, value - 8) -> ``[E, N, K]`` int8 in [-8, 7]."""
    import torch

    w = w_u8.to(torch.int16)
    lo, hi = w & 0xF, (w >> 4) & 0xF
    e, n, k2 = w_u8.shape
    return (torch.stack([lo, hi], dim=-1).reshape(e, n, 2 * k2) - 8).to(torch.int8)


def dequantize(q, scale_kn, group: int):
    """Float32 weights ``[E, N, K]`` from int4 values ``q`` ([E, N, K]) and scales in the
    checkpoint layout ``[E, K // group, N]`` (compressed-tensors ``weight_scale``, transposed on
    load): ``w[e, n, k] = q[e, n, k] * scale[e, k // group, n]``."""
    s = scale_kn.float().transpose(1, 2).repeat_interleave(group, dim=2)  # [E, N, K]
    return q.float() * s


def reference_moe(x, topk_ids, topk_weights, w13_q, w13_scale, w2_q, w2_scale, group: int):
    """Float32 routed-MoE reference for ``x`` ([T, H]): per token t,
    ``sum_j w[t, j] * W2_e @ (silu(G_e x) * (U_e x))`` with e = topk_ids[t, j], [G_e; U_e] =
    dequantized ``w13`` (first half gate, second half up, as SGLang's ``silu_and_mul``),
    ``W2_e`` = dequantized ``w2``. ``w13_q`` [E, 2I, H], ``w2_q`` [E, H, I] int values; scales in
    the checkpoint layout [E, K // group, N]. Dequantizes only the touched experts."""
    import torch

    xf = x.float()
    out = torch.zeros(x.shape[0], w2_q.shape[1], dtype=torch.float32, device=x.device)
    for e in sorted({int(v) for v in topk_ids.reshape(-1).tolist()}):
        w13 = dequantize(w13_q[e:e + 1], w13_scale[e:e + 1], group)[0]
        w2 = dequantize(w2_q[e:e + 1], w2_scale[e:e + 1], group)[0]
        rows, slots = torch.nonzero(topk_ids == e, as_tuple=True)
        gu = xf[rows] @ w13.t()
        inter = w13.shape[0] // 2
        h = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, rows, (h @ w2.t()) * topk_weights[rows, slots].float()[:, None])
    return out


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64 (inf when b is zero, NaN when either holds a NaN)."""
    a, b = a.double(), b.double()
    nb = b.norm().item()
    return (a - b).norm().item() / nb if nb else float("inf")


# ------------------------------------------------------------------ plan and statistics (CPU) -

def percentile(xs, q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of a non-empty sequence, q in [0, 100]."""
    s = sorted(xs)
    if not s:
        raise ValueError("no samples")
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(samples) -> dict:
    """Median, p10 and p90 (ms) of per-replay samples."""
    return {"median_ms": statistics.median(samples), "p10_ms": percentile(samples, 10),
            "p90_ms": percentile(samples, 90), "n": len(samples)}


def copies_for(bytes_per_set: float, l2_bytes: float, l2_multiple: float, max_copies: int) -> int:
    """Input sets to rotate so that a set is read again only after ``l2_multiple x L2`` bytes of the
    others: ``ceil(l2_multiple x L2 / bytes_per_set) + 1``, in [1, max_copies]; 1 when one set
    alone exceeds that."""
    if bytes_per_set >= l2_multiple * l2_bytes:
        return 1
    return max(1, min(max_copies, math.ceil(l2_multiple * l2_bytes / bytes_per_set) + 1))


def kv_slots(bs: int, ctx: int, ndt: int) -> int:
    """KV pool slots of one attention point: slot 0 (SGLang's padding slot) + bs x (ctx + ndt)."""
    return bs * (ctx + ndt) + 1


def parse_int_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.replace(" ", ",").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: a comma-separated list of integers")
    if not out:
        raise argparse.ArgumentTypeError(f"{s!r}: empty list")
    return out


def parse_name_list(choices):
    def parse(s: str) -> list[str]:
        out = [x for x in s.replace(" ", ",").split(",") if x]
        bad = [x for x in out if x not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"{s!r}: use a comma-separated subset of {','.join(choices)}")
        return out
    return parse


QUICK = {"batch_sizes": [1, 16], "contexts": [4096], "ndt": [3]}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=parse_int_list, default=[1, 4, 16, 32])
    ap.add_argument("--contexts", type=parse_int_list, default=[1024, 4096, 16384],
                    help="KV context (prefix tokens) per request")
    ap.add_argument("--ndt", type=parse_int_list, default=[3, 4],
                    help="verify tokens per request (num_steps + 1)")
    ap.add_argument("--routings", type=parse_name_list(ROUTINGS), default=list(ROUTINGS))
    ap.add_argument("--shared-p", type=float, default=0.5,
                    help="'shared' routing: probability a later token keeps each first-token expert")
    ap.add_argument("--compose-routing", choices=ROUTINGS, default="random",
                    help="routing whose MoE times enter the per-layer rows")
    ap.add_argument("--parts", type=parse_name_list(PARTS), default=list(PARTS))
    ap.add_argument("--moe-methods", type=parse_name_list(MOE_METHODS), default=["triton"],
                    help="triton: CompressedTensorsWNA16TritonMoE; marlin: CompressedTensorsWNA16MoE")
    ap.add_argument("--replays", type=int, default=60, help=f"timed graph replays per point (>= {MIN_REPLAYS})")
    ap.add_argument("--warmup", type=int, default=5, help="untimed graph replays before timing")
    ap.add_argument("--min-calls", type=int, default=8, help="calls per graph at least (the list repeats)")
    ap.add_argument("--moe-copies", type=int, default=8,
                    help="MoE weight sets (each 1.19 GB) rotated, each with its own routing draw")
    ap.add_argument("--max-copies", type=int, default=64, help="cap on rotated attention / dense input sets")
    ap.add_argument("--l2-multiple", type=float, default=4.0,
                    help="bytes of other sets between two reads of one set, in units of L2")
    ap.add_argument("--l2-mib", type=float, default=None,
                    help=f"L2 size for the rotation (default: the device's; {H200_L2_MIB} for --dry-run)")
    ap.add_argument("--hbm-tbps", type=float, default=H200_HBM_TBPS, help="nominal HBM bandwidth, TB/s")
    ap.add_argument("--copy-gib", type=float, default=2.0, help="bytes of the bandwidth copy (each side)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-checks", action="store_true", help="skip the correctness checks")
    ap.add_argument("--out", default=None, help="JSON file")
    ap.add_argument("--quick", action="store_true",
                    help="bs 1,16, ctx 4096, ndt 3 (explicit --batch-sizes/--contexts/--ndt win)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    a = ap.parse_args(argv)
    if a.quick:
        given = [x.split("=")[0] for x in (argv if argv is not None else sys.argv[1:])]
        for k, v in QUICK.items():
            if "--" + k.replace("_", "-") not in given:
                setattr(a, k, list(v))
    if a.replays < MIN_REPLAYS:
        ap.error(f"--replays {a.replays}: at least {MIN_REPLAYS}")
    if a.warmup < 0 or a.min_calls < 1 or a.moe_copies < 1 or a.max_copies < 1 or a.l2_multiple <= 0:
        ap.error("--warmup >= 0, --min-calls / --moe-copies / --max-copies >= 1, --l2-multiple > 0")
    if min(a.batch_sizes) < 1 or min(a.contexts) < 1:
        ap.error("--batch-sizes and --contexts: positive integers")
    if min(a.ndt) < 2:
        ap.error("--ndt: at least 2 tokens per request (the bonus token and one draft)")
    if not 0.0 <= a.shared_p <= 1.0:
        ap.error("--shared-p: a probability in [0, 1]")
    if a.compose_routing not in a.routings:
        a.compose_routing = a.routings[0]
    for k in ("batch_sizes", "contexts", "ndt"):
        setattr(a, k, sorted(set(getattr(a, k))))
    return a


def build_plan(a: argparse.Namespace, shape: LayerShape = KIMI_K25_TP8, l2_bytes: float | None = None,
               num_sms: int = H200_SMS) -> dict:
    """Every point the run times, with input-set counts and sizes (bytes). ``l2_bytes``: the L2 the
    rotation is sized for (``--l2-mib``, else the H200's 50 MiB)."""
    if l2_bytes is None:
        l2_bytes = (a.l2_mib if a.l2_mib else H200_L2_MIB) * 2 ** 20
    plan = {"attention": [], "moe": [], "dense": [], "l2_bytes": l2_bytes, "num_sms": num_sms}
    if "attention" in a.parts:
        for ctx in a.contexts:
            for bs in a.batch_sizes:
                slots = kv_slots(bs, ctx, max(a.ndt))
                per = slots * shape.qk_dim * 2
                n = copies_for(per, l2_bytes, a.l2_multiple, a.max_copies)
                plan["attention"].append({"bs": bs, "ctx": ctx, "ndt": list(a.ndt), "slots": slots,
                                          "kv_bytes_per_copy": per, "copies": n,
                                          "timings": 1 + 2 * len(a.ndt)})
    if "moe" in a.parts:
        for m in a.moe_methods:
            for bs in a.batch_sizes:
                plan["moe"].append({"method": m, "role": "decode", "bs": bs, "ndt": 1, "routing": "first",
                                    "tokens": bs})
                for ndt in a.ndt:
                    for r in a.routings:
                        plan["moe"].append({"method": m, "role": "verify", "bs": bs, "ndt": ndt, "routing": r,
                                            "tokens": bs * ndt})
    if "dense" in a.parts:
        ts = sorted({bs for bs in a.batch_sizes} | {bs * n for bs in a.batch_sizes for n in a.ndt})
        for t in ts:
            plan["dense"].append({"tokens": t, "ops": list(DENSE_OPS)})
    eb = expert_bytes(shape)
    set_bytes = shape.num_experts * eb["bytes"]
    plan["moe_weight_set_bytes"] = set_bytes
    plan["moe_weight_bytes_total"] = set_bytes * a.moe_copies * len(a.moe_methods) if plan["moe"] else 0
    plan["timings"] = (sum(p["timings"] for p in plan["attention"]) + len(plan["moe"])
                       + len(DENSE_OPS) * len(plan["dense"]))
    plan["expert_bytes"] = eb
    try:
        sys.path.insert(0, os.path.join(REPO, "sgl-kernel"))
        from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits

        plan["ours_kv_splits"] = {f"bs{bs}_ndt{n}": choose_num_kv_splits(
            ChainVerifyShape(shape.heads, 1, shape.qk_dim, shape.kv_lora, n, shape.rope), bs, num_sms)
            for bs in a.batch_sizes for n in a.ndt}
    except ImportError:
        pass
    return plan


def format_plan(a: argparse.Namespace, plan: dict) -> str:
    lines = [f"PLAN Kimi-K2.5 TP-8 shard, one layer: parts {','.join(a.parts)}; bs {a.batch_sizes}, "
             f"ctx {a.contexts}, ndt {a.ndt}; routings {a.routings} (shared p={a.shared_p}); "
             f"{a.replays} replays after {a.warmup} warm-up; L2 for rotation {plan['l2_bytes'] / 2 ** 20:.0f} MiB "
             f"x {a.l2_multiple}"]
    for p in plan["attention"]:
        lines.append(f"PLAN attention bs={p['bs']} ctx={p['ctx']} ndt={p['ndt']}: decode + ours/upstream per ndt, "
                     f"{p['copies']} KV buffer(s) of {p['kv_bytes_per_copy'] / 1e6:.1f} MB")
    for p in plan["moe"]:
        lines.append(f"PLAN moe {p['method']} {p['role']} bs={p['bs']} ndt={p['ndt']} routing={p['routing']} "
                     f"T={p['tokens']} ({a.moe_copies} weight sets / routing draws)")
    for p in plan["dense"]:
        lines.append(f"PLAN dense T={p['tokens']}: {','.join(p['ops'])}")
    eb = plan["expert_bytes"]
    lines.append(f"PLAN bytes per expert {eb['bytes']} ({eb['weight_bytes']} int4 + {eb['scale_bytes']} scales); "
                 f"MoE weight sets {plan['moe_weight_bytes_total'] / 1e9:.2f} GB; {plan['timings']} timed points")
    if "ours_kv_splits" in plan:
        lines.append(f"PLAN ours' KV splits ({plan['num_sms']} SMs): "
                     + ", ".join(f"{k}={v}" for k, v in plan["ours_kv_splits"].items()))
    return "\n".join(lines)


# ------------------------------------------------------------------ rows and tables (CPU) -----

def _ms(d, key="median_ms"):
    return None if d is None else d.get(key)


def combine_rows(a: argparse.Namespace, attention: list, moe: list, dense: list,
                 shape: LayerShape = KIMI_K25_TP8) -> list:
    """One row per (bs, ctx, ndt): the parts' medians (ms), the bytes model and the per-layer
    verify / decode split. ``attention`` items: {bs, ctx, ndt, ours, upstream, decode} (each a
    ``summarize`` dict); ``moe`` items: {method, role, bs, ndt, routing, tokens, time,
    unique_experts}; ``dense`` items: {tokens, ops: {name: summary}}. The MoE of
    ``a.compose_routing`` and the first of ``a.moe_methods`` enters the layer figures."""
    method = a.moe_methods[0]
    moe_v = {(m["bs"], m["ndt"]): m for m in moe
             if m["role"] == "verify" and m["routing"] == a.compose_routing and m["method"] == method}
    moe_d = {m["bs"]: m for m in moe if m["role"] == "decode" and m["method"] == method}
    dense_t = {d["tokens"]: sum(_ms(s) for s in d["ops"].values()) for d in dense}
    rows = []
    for at in attention:
        bs, ctx, ndt = at["bs"], at["ctx"], at["ndt"]
        mv, md = moe_v.get((bs, ndt)), moe_d.get(bs)
        r = {"bs": bs, "ctx": ctx, "ndt": ndt, "attn_ours_ms": _ms(at.get("ours")),
             "attn_decode_ms": _ms(at.get("decode")), "attn_upstream_ms": _ms(at.get("upstream")),
             "moe_verify_ms": _ms(mv and mv["time"]), "moe_decode_ms": _ms(md and md["time"]),
             "experts_verify": mv and mv["unique_experts"], "experts_decode": md and md["unique_experts"],
             "dense_verify_ms": dense_t.get(bs * ndt), "dense_decode_ms": dense_t.get(bs),
             "moe_routing": a.compose_routing, "moe_method": method}
        if r["experts_verify"] and r["experts_decode"]:
            r["bytes_ratio"] = r["experts_verify"] / r["experts_decode"]
        if r["moe_verify_ms"] and r["moe_decode_ms"]:
            r["moe_time_ratio"] = r["moe_verify_ms"] / r["moe_decode_ms"]
        if None not in (r["attn_ours_ms"], r["attn_decode_ms"], r["moe_verify_ms"], r["moe_decode_ms"]):
            dv, dd = r["dense_verify_ms"] or 0.0, r["dense_decode_ms"] or 0.0
            dec = r["attn_decode_ms"] + r["moe_decode_ms"] + dd
            ver = r["attn_ours_ms"] + r["moe_verify_ms"] + dv
            r.update(layer_decode_ms=dec, layer_verify_ms=ver, layer_ratio=ver / dec,
                     attn_contrib=(r["attn_ours_ms"] - r["attn_decode_ms"]) / dec,
                     moe_contrib=(r["moe_verify_ms"] - r["moe_decode_ms"]) / dec,
                     dense_contrib=(dv - dd) / dec,
                     layers_decode_ms_extrapolated=shape.layers * dec,
                     layers_verify_ms_extrapolated=shape.layers * ver)
            if r["attn_upstream_ms"] is not None:
                up = r["attn_upstream_ms"] + r["moe_verify_ms"] + dv
                r.update(layer_upstream_ms=up, layer_upstream_ratio=up / dec,
                         layers_upstream_ms_extrapolated=shape.layers * up)
        rows.append(r)
    return rows


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def format_table(rows: list, shape: LayerShape = KIMI_K25_TP8, with_dense: bool = True) -> str:
    """Markdown table of ``combine_rows`` rows (ms per layer; ratios verify / decode)."""
    hdr = ["bs", "ctx", "ndt", "attn ms ours / decode / upstream", "MoE ms verify / decode",
           "experts verify / decode", "bytes ratio", "MoE time ratio"]
    if with_dense:
        hdr.append("dense ms verify / decode")
    hdr += ["layer verify / decode", "= 1 + attn + MoE" + (" + dense" if with_dense else ""),
            "upstream layer / decode", f"{shape.layers} x layer ms verify / decode (extrapolated)"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        cells = [str(r["bs"]), str(r["ctx"]), str(r["ndt"]),
                 f"{_f(r['attn_ours_ms'], '{:.4f}')} / {_f(r['attn_decode_ms'], '{:.4f}')} / "
                 f"{_f(r['attn_upstream_ms'], '{:.4f}')}",
                 f"{_f(r['moe_verify_ms'], '{:.4f}')} / {_f(r['moe_decode_ms'], '{:.4f}')}",
                 f"{_f(r['experts_verify'], '{:.1f}')} / {_f(r['experts_decode'], '{:.1f}')}",
                 _f(r.get("bytes_ratio"), "{:.2f}"), _f(r.get("moe_time_ratio"), "{:.2f}")]
        if with_dense:
            cells.append(f"{_f(r['dense_verify_ms'], '{:.4f}')} / {_f(r['dense_decode_ms'], '{:.4f}')}")
        if "layer_ratio" in r:
            split = f"1 + {r['attn_contrib']:.3f} + {r['moe_contrib']:.3f}"
            if with_dense:
                split += f" + {r['dense_contrib']:.3f}"
            cells += [f"**{r['layer_ratio']:.2f}**", split, _f(r.get("layer_upstream_ratio"), "{:.2f}"),
                      f"{r['layers_verify_ms_extrapolated']:.2f} / {r['layers_decode_ms_extrapolated']:.2f}"]
        else:
            cells += ["-", "-", "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_moe_table(moe: list, shape: LayerShape = KIMI_K25_TP8, copy_tbps: float | None = None,
                     nominal_tbps: float = H200_HBM_TBPS) -> str:
    """Markdown table of the MoE points: ms (median, p10-p90), experts touched (mean over the
    routing draws; the uniform-routing expectation), MB touched and time over the bytes floor."""
    hdr = ["method", "role", "bs", "ndt", "routing", "T", "MoE ms (p10-p90)", "experts touched",
           "uniform E[U]", "MB touched", f"floor ms @{nominal_tbps} TB/s",
           "floor ms @copy" + (f" {copy_tbps:.2f} TB/s" if copy_tbps else ""), "time / floor (copy)"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for m in moe:
        b = moe_bytes_row(m["unique_experts"], shape, copy_tbps, nominal_tbps)
        t = m["time"]
        fl = b.get("floor_ms_copy")
        out.append("| " + " | ".join([
            m["method"], m["role"], str(m["bs"]), str(m["ndt"]), m["routing"], str(m["tokens"]),
            f"{t['median_ms']:.4f} ({t['p10_ms']:.4f}-{t['p90_ms']:.4f})", f"{m['unique_experts']:.1f}",
            f"{expected_unique_experts_uniform(shape.num_experts, shape.top_k, m['tokens']):.1f}",
            f"{b['touched_mb']:.1f}", f"{b['floor_ms_nominal']:.4f}", _f(fl, "{:.4f}"),
            _f(t["median_ms"] / fl if fl else None, "{:.2f}")]) + " |")
    return "\n".join(out)


def format_dense_table(dense: list) -> str:
    hdr = ["T"] + list(DENSE_OPS) + ["sum"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for d in dense:
        vals = [d["ops"][k]["median_ms"] for k in DENSE_OPS]
        out.append("| " + " | ".join([str(d["tokens"])] + [f"{v:.4f}" for v in vals] + [f"{sum(vals):.4f}"]) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------ GPU timing ---------------

def time_calls(calls, replays: int, warmup: int, min_calls: int = 8) -> dict:
    """Per-call GPU ms of ``calls`` (zero-argument callables, each on its own input set): run each
    once eagerly (compiles kernels), once more on a side stream, capture ``calls`` repeated to at
    least ``min_calls`` into one CUDA graph, replay it ``warmup`` times, then ``replays`` times
    between CUDA events. Returns ``summarize`` of (replay ms / calls in the graph) plus
    ``calls_per_replay``, ``input_sets`` and the samples."""
    import torch

    seq = list(calls) * max(1, math.ceil(min_calls / len(calls)))
    for f in calls:
        f()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in calls:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in seq:
            f()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for s, e in ev:
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) / len(seq) for s, e in ev]
    del g
    res = summarize(samples)
    res.update(calls_per_replay=len(seq), input_sets=len(calls), samples=[round(x, 6) for x in samples])
    return res


def measure_copy_bandwidth(gib: float, replays: int) -> dict:
    """Device-to-device ``copy_`` of ``gib`` GiB: TB/s = (bytes read + bytes written) / median time."""
    import torch

    n = int(gib * 2 ** 30) // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = time_calls([lambda: dst.copy_(src)], replays, 3, min_calls=1)
    assert torch.equal(dst[:1024], src[:1024]), "copy kernel wrote wrong data"
    t.pop("samples")
    return {"bytes_each_side": 2 * n, "time": t, "tbps": 4 * n / (t["median_ms"] * 1e-3) / 1e12}


def _install_sglang_runtime():
    """SGLang globals ``fused_experts`` reads: a published ``ServerArgs`` (dummy boundary, the test
    override of ``sglang.srt.runtime_context``) and a TP group of world size 1 (``get_tp_group``
    for the symmetric-memory context; gloo, no collective is issued)."""
    import torch
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_context

    try:
        from sglang.srt.runtime_context import get_server_args

        get_server_args().enable_fused_moe_sum_all_reduce
    except Exception:
        get_context().override_server_args().install()
    if not ps.model_parallel_is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        local = torch.cuda.current_device() if torch.cuda.is_available() else 0
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=local,
                                        distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        ps.initialize_model_parallel(tensor_model_parallel_size=1)


# ---- (a) attention ----

def bench_attention(a, shape: LayerShape, ctx: int, bs: int, copies: int, num_sms: int, checks: bool,
                    device: str = "cuda", dtype=None, timer=None) -> list:
    """One (ctx, bs) point: decode once, ours and upstream per ndt; ``copies`` KV buffers
    [slots, 1, 576] (``dtype``, default bf16, random normal), one page table [bs, ctx + max ndt]
    int32 of distinct slots >= 1. ``timer``: ``time_calls`` unless given. Returns one dict per ndt."""
    import torch
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    from sglang.srt.layers.attention.triton_backend import _mla_decode_kv_splits_cap
    from sglang_verify_graph.kernel import ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits, workspace_numel

    use_pdl = False
    if device == "cuda":  # as TritonAttnBackend: PDL where the architecture supports it
        try:
            from sgl_kernel.utils import is_arch_support_pdl

            use_pdl = bool(is_arch_support_pdl())
        except Exception:
            pass
    timer = timer or time_calls
    dev, dt = device, dtype or torch.bfloat16
    h, dk, dv = shape.heads, shape.qk_dim, shape.kv_lora
    max_ndt = max(a.ndt)
    slots = kv_slots(bs, ctx, max_ndt)
    torch.manual_seed(a.seed * 7919 + ctx * 31 + bs)
    kv_all = torch.randn(copies, slots, 1, dk, device=dev, dtype=dt)
    k_bufs = [kv_all[c] for c in range(copies)]
    v_bufs = [k[..., :dv] for k in k_bufs]
    r2t = (torch.randperm(slots - 1, device=dev)[: bs * (ctx + max_ndt)] + 1).view(bs, ctx + max_ndt).to(torch.int32)
    rpi = torch.arange(bs, device=dev, dtype=torch.int64)
    seq = torch.full((bs,), ctx, device=dev, dtype=torch.int64)
    scale = shape.sm_scale

    # decode: 1 token per request over ctx + 1 keys (seq_lens include the new token)
    max_splits = _mla_decode_kv_splits_cap(8, num_sms, shape.max_context_len)
    d_seq = torch.full((bs,), ctx + 1, device=dev, dtype=torch.int64)
    d_indptr = torch.arange(0, (bs + 1) * (ctx + 1), ctx + 1, device=dev, dtype=torch.int32)
    d_indices = r2t[:, :ctx + 1].reshape(-1).to(torch.int64).contiguous()
    nsp = torch.empty(bs, device=dev, dtype=torch.int32)
    get_num_kv_splits_triton[(1,)](nsp, d_seq, bs, 1, h, 1, max_splits, num_sms,
                                   MAX_NUM_SEQ=256 if bs < 256 else 1 << (bs - 1).bit_length())
    logits = torch.empty(bs, h, max_splits, dv, device=dev, dtype=torch.float32)
    lse = torch.empty(bs, h, max_splits, device=dev, dtype=torch.float32)
    qd = torch.randn(bs, h, dk, device=dev, dtype=dt)
    od = torch.empty(bs, h, dv, device=dev, dtype=dt)

    def dec(c):
        return lambda: decode_attention_fwd(qd, k_bufs[c], v_bufs[c], od, d_indptr, d_indices, logits, lse, nsp,
                                            max_splits, scale, 1.0, 1.0, has_mla=True, use_pdl=use_pdl)

    t_dec = timer([dec(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
    meta_dec = {"max_kv_splits": max_splits, "num_kv_splits": nsp.tolist()[:4], "use_pdl": use_pdl}
    out = []
    for ndt in a.ndt:
        t = bs * ndt
        q = torch.randn(t, h, dk, device=dev, dtype=dt)
        q.view(bs, ndt, h, dk)[:, 0] = qd  # the decode token is each chain's first row
        cshape = ChainVerifyShape(h, 1, dk, dv, ndt, shape.rope)
        ns = choose_num_kv_splits(cshape, bs, num_sms)
        n_out, n_lse = workspace_numel(cshape, bs, ns)
        ao, al = torch.empty(n_out, device=dev), torch.empty(n_lse, device=dev)
        o = torch.empty(t, h, dv, device=dev, dtype=dt)

        def ours(c):
            return lambda: chain_verify_attention_fwd(q, k_bufs[c], v_bufs[c], o, r2t, rpi, seq, cshape, ns, scale,
                                                      ao, al)

        draft_locs = r2t[:, ctx:ctx + ndt].reshape(-1).long()
        k_ext = k_bufs[0][draft_locs].contiguous()
        v_ext = v_bufs[0][draft_locs].contiguous()
        kv_indptr = torch.arange(0, (bs + 1) * ctx, ctx, device=dev, dtype=torch.int32)
        kv_indices = r2t[:, :ctx].reshape(-1).to(torch.int64).contiguous()
        qo_indptr = torch.arange(0, (bs + 1) * ndt, ndt, device=dev, dtype=torch.int32)
        mask_len = ndt * (ctx + ndt)
        mask_indptr = torch.arange(0, (bs + 1) * mask_len, mask_len, device=dev, dtype=torch.int64)
        tri = torch.ones(ndt, ctx + ndt, dtype=torch.bool, device=dev)
        tri[:, ctx:] = torch.tril(torch.ones(ndt, ndt, dtype=torch.bool, device=dev))
        custom_mask = tri.reshape(-1).repeat(bs)
        o_up = torch.empty(t, h, dv, device=dev, dtype=dt)

        def up(c):
            return lambda: extend_attention_fwd(q, k_ext, v_ext, o_up, k_bufs[c], v_bufs[c], qo_indptr, kv_indptr,
                                                kv_indices, custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale)

        res = {"bs": bs, "ctx": ctx, "ndt": ndt, "copies": copies, "kv_bytes_per_copy": slots * dk * 2,
               "ours_kv_splits": ns, "ours_block_r": cshape.block_r, "decode_meta": meta_dec}
        res["ours"] = timer([ours(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
        res["upstream"] = timer([up(c) for c in range(copies)], a.replays, a.warmup, a.min_calls)
        res["decode"] = t_dec
        if checks:  # copy 0, outputs poisoned first: every element written, and the three agree
            for buf in (o, o_up, od):
                buf.fill_(float("nan"))
            ours(0)()
            up(0)()
            dec(0)()
            if dev == "cuda":
                torch.cuda.synchronize()
            res["check"] = {
                "ours_finite": bool(torch.isfinite(o).all()), "upstream_finite": bool(torch.isfinite(o_up).all()),
                "decode_finite": bool(torch.isfinite(od).all()),
                "ours_vs_upstream_rel_err": rel_err(o, o_up),
                "decode_vs_ours_first_row_rel_err": rel_err(od, o.view(bs, ndt, h, dv)[:, 0])}
        out.append(res)
    return out


# ---- (b) MoE ----

class _SchemeHolder:
    """SGLang's MoE method objects and ``copies`` expert-weight sets, made as SGLang makes them:
    the scheme's ``create_weights`` (compressed-tensors ``pack-quantized``, 4 bit, group 32,
    symmetric, no act-order), random int32 words (= 8 random int4 values each) and bf16 scales
    copied in, then ``process_weights_after_loading`` (Triton: [E, N, K // 2] uint8 and [E, N,
    K // 32] scales; Marlin: ``gptq_marlin_moe_repack``)."""

    def __init__(self, method: str, shape: LayerShape, copies: int, seed: int, keep_raw: bool = False,
                 device: str = "cuda", dtype=None):
        import torch
        from types import SimpleNamespace

        from compressed_tensors import CompressionFormat
        from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
        from sglang.srt.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16_moe import (
            CompressedTensorsWNA16MoE,
            CompressedTensorsWNA16TritonMoE,
        )

        cls = CompressedTensorsWNA16TritonMoE if method == "triton" else CompressedTensorsWNA16MoE
        qcfg = SimpleNamespace(quant_format=CompressionFormat.pack_quantized.value)
        wq = SimpleNamespace(num_bits=shape.num_bits, strategy="group", group_size=shape.group, actorder=None,
                             symmetric=True)
        self.method, self.shape = method, shape
        self.scheme = cls(qcfg, wq)
        # inplace=False: the same fused_experts_impl kernels (inplace_fused_experts and
        # outplace_fused_experts both call it); in place, each replay's output would feed the next.
        # routed_scaling_factor=None: the output scale does not change the kernels run.
        dtype = dtype or torch.bfloat16
        self.device, self.dtype = device, dtype
        self.cfg = MoeRunnerConfig(num_experts=shape.num_experts, num_local_experts=shape.num_experts,
                                   hidden_size=shape.hidden, intermediate_size_per_partition=shape.moe_inter,
                                   top_k=shape.top_k, params_dtype=dtype, activation="silu",
                                   inplace=False, routed_scaling_factor=None)
        self.layers, self.raw = [], []
        g = torch.Generator(device=device)
        g.manual_seed(seed * 104729 + MOE_METHODS.index(method))
        for _ in range(copies):
            layer = torch.nn.Module()
            layer.moe_tp_size = 1
            with torch.device(device):
                self.scheme.create_weights(layer, shape.num_experts, shape.hidden, shape.moe_inter, dtype)
            for name, k in (("w13", shape.hidden), ("w2", shape.moe_inter)):
                wp = getattr(layer, f"{name}_weight_packed")
                wp.data.copy_(torch.randint(0, 256, (wp.numel() * 4,), dtype=torch.uint8, device=device,
                                            generator=g).view(torch.int32).view(wp.shape))
                sc = getattr(layer, f"{name}_weight_scale")
                # q uniform in [-8, 7] has rms 4.64; over K inputs of rms 1, a scale near
                # 1 / (4.6 sqrt(K)) keeps each GEMM's outputs near rms 1
                sc.data.copy_(((torch.rand(sc.shape, device=device, generator=g) + 0.5)
                               / (4.6 * math.sqrt(k))).to(sc.dtype))
            if keep_raw:
                self.raw.append({n: getattr(layer, n).data.clone() for n in
                                 ("w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale")})
            self.scheme.process_weights_after_loading(layer)
            self.layers.append(layer)
        if method == "triton":
            self.scheme.create_moe_runner(self.layers[0], self.cfg)
        else:  # the Marlin method's apply_weights reads only moe_runner_config
            self.scheme.moe_runner_config = self.cfg

    def call(self, c: int, x, topk_weights, topk_ids, router_logits):
        """``apply_weights`` of weight set ``c``; returns the [T, hidden] bf16 output."""
        from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
        from sglang.srt.layers.moe.topk import StandardTopKOutput

        d = StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                   topk_output=StandardTopKOutput(topk_weights, topk_ids, router_logits))
        return self.scheme.apply_weights(self.layers[c], d).hidden_states

    def kernel_config(self, tokens: int):
        """The fused_moe Triton config SGLang resolves for ``tokens`` (as ``_prepare_fused_moe_run``)."""
        if self.method != "triton":
            return None
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import (
            get_config_dtype_str,
            try_get_optimal_moe_config,
        )

        l0 = self.layers[0]
        w1, w2 = l0.w13_weight_packed, l0.w2_weight_packed
        try:
            cfg, (down, _) = try_get_optimal_moe_config(
                w1.shape, tuple(w2.shape), self.shape.top_k,
                get_config_dtype_str(self.dtype, use_int4_w4a16=True), tokens,
                block_shape=[0, self.shape.group], return_down_config=True)
        except Exception as e:  # the record only; the timed call resolves its own
            return {"error": f"{type(e).__name__}: {e}"[:200]}
        return {"up": dict(cfg), "down": dict(down) if down else None}


def bench_moe(a, holder: _SchemeHolder, role: str, bs: int, ndt: int, routing: str, timer=None) -> dict:
    """One MoE point: T = bs x ndt tokens (ndt = 1 for decode), one call per weight set of
    ``holder``, call c on weight set c with routing draw c; x [T, hidden] random normal in the
    holder's dtype. ``timer``: ``time_calls`` unless given."""
    import torch

    timer = timer or time_calls
    shape, dev = holder.shape, holder.device
    t = bs * ndt
    mode = "random" if routing == "first" else routing
    draws = [draw_routing(bs, ndt, shape.num_experts, shape.top_k, mode, a.shared_p, a.seed, c)
             for c in range(len(holder.layers))]
    uniq = [count_unique_experts(ids) for ids, _ in draws]
    ids_g = [ids.to(dev) for ids, _ in draws]
    w_g = [w.to(dev) for _, w in draws]
    torch.manual_seed(a.seed * 13 + t)
    x = torch.randn(t, shape.hidden, device=dev, dtype=holder.dtype)
    logits = torch.randn(t, shape.num_experts, device=dev, dtype=holder.dtype)

    def call(c):
        return lambda: holder.call(c, x, w_g[c], ids_g[c], logits)

    res = {"method": holder.method, "role": role, "bs": bs, "ndt": ndt, "routing": routing, "tokens": t,
           "unique_experts": statistics.mean(uniq), "unique_experts_per_draw": uniq,
           "uniform_expectation": expected_unique_experts_uniform(shape.num_experts, shape.top_k, t)}
    res["time"] = timer([call(c) for c in range(len(holder.layers))], a.replays, a.warmup, a.min_calls)
    res["kernel_config"] = holder.kernel_config(t)
    return res


def check_moe(a, method: str, shape: LayerShape, tokens: int = 4, device: str = "cuda", dtype=None) -> dict:
    """The MoE method at T = ``tokens`` (random routing) against ``reference_moe`` on the
    dequantized checkpoint-layout weights (a separate weight set, kept before conversion).
    Returns {finite, rel_err_vs_fp32_reference, ref_rms, ...}."""
    import torch

    hold = _SchemeHolder(method, shape, 1, a.seed + 1, keep_raw=True, device=device, dtype=dtype)
    ids, w = draw_routing(tokens, 1, shape.num_experts, shape.top_k, "random", seed=a.seed + 1)
    ids, w = ids.to(device), w.to(device)
    torch.manual_seed(a.seed + 5)
    x = torch.randn(tokens, shape.hidden, device=device, dtype=hold.dtype)
    out = hold.call(0, x, w, ids, torch.zeros(tokens, shape.num_experts, device=device, dtype=hold.dtype))
    if device == "cuda":
        torch.cuda.synchronize()
    raw = hold.raw[0]
    touched = sorted({int(e) for e in ids.reshape(-1).tolist()})
    idx = torch.tensor(touched, device=device)
    remap = torch.full((shape.num_experts,), -1, dtype=torch.int64, device=device)
    remap[idx] = torch.arange(len(touched), device=device)
    ref = reference_moe(x, remap[ids.long()],
                        w, unpack_int4_compressed_tensors(raw["w13_weight_packed"][idx]), raw["w13_weight_scale"][idx],
                        unpack_int4_compressed_tensors(raw["w2_weight_packed"][idx]), raw["w2_weight_scale"][idx],
                        shape.group)
    res = {"method": method, "tokens": tokens, "finite": bool(torch.isfinite(out).all()),
           "rel_err_vs_fp32_reference": rel_err(out.float(), ref), "ref_rms": ref.pow(2).mean().sqrt().item()}
    del hold
    if device == "cuda":
        torch.cuda.empty_cache()
    return res


# ---- (d) dense ----

def bench_dense(a, shape: LayerShape, tokens: int, l2_bytes: float, device: str = "cuda", dtype=None,
                timer=None) -> dict:
    """bf16 GEMMs of one layer at T = ``tokens`` (see the module docstring), each timed with
    rotated weight copies; inputs random normal. ``timer``: ``time_calls`` unless given."""
    import torch
    import torch.nn.functional as F

    timer = timer or time_calls
    dev, dt = device, dtype or torch.bfloat16
    h, H = shape.heads, shape.hidden
    torch.manual_seed(a.seed * 17 + tokens)
    x = torch.randn(tokens, H, device=dev, dtype=dt)
    q_lat = torch.randn(tokens, shape.q_lora, device=dev, dtype=dt)
    q_nope = torch.randn(h, tokens, shape.qk_nope, device=dev, dtype=dt)
    lat = torch.randn(h, tokens, shape.kv_lora, device=dev, dtype=dt)
    attn_o = torch.randn(tokens, h * shape.v_head, device=dev, dtype=dt)
    sh = torch.randn(tokens, shape.shared_inter, device=dev, dtype=dt)
    specs = {  # name: (weight shape, fn(input, weight))
        "qkv_a": ((shape.q_lora + shape.qk_dim, H), lambda w: F.linear(x, w)),
        "q_b": ((h * (shape.qk_nope + shape.rope), shape.q_lora), lambda w: F.linear(q_lat, w)),
        "w_kc": ((h, shape.qk_nope, shape.kv_lora), lambda w: torch.bmm(q_nope, w)),
        "w_vc": ((h, shape.kv_lora, shape.v_head), lambda w: torch.bmm(lat, w)),
        "o_proj": ((H, h * shape.v_head), lambda w: F.linear(attn_o, w)),
        "shared_gate_up": ((2 * shape.shared_inter, H), lambda w: F.linear(x, w)),
        "shared_down": ((H, shape.shared_inter), lambda w: F.linear(sh, w)),
        "router": ((shape.num_experts, H), lambda w: F.linear(x, w)),
    }
    ops = {}
    for name in DENSE_OPS:
        wshape, fn = specs[name]
        nbytes = math.prod(wshape) * 2
        n = copies_for(nbytes, l2_bytes, a.l2_multiple, a.max_copies)
        ws = [torch.randn(wshape, device=dev, dtype=dt) * (wshape[-1] ** -0.5 if name != "w_kc" else 0.1)
              for _ in range(n)]
        ops[name] = timer([(lambda w: (lambda: fn(w)))(w) for w in ws], a.replays, a.warmup, a.min_calls)
        ops[name]["weight_bytes"] = nbytes
        del ws
    return {"tokens": tokens, "ops": ops}


# ------------------------------------------------------------------ main ---------------------

def _versions() -> dict:
    import torch
    import triton

    v = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    try:
        import sglang

        v["sglang"] = getattr(sglang, "__version__", "?")
    except Exception as e:
        v["sglang"] = f"import failed: {e}"
    return v


def _repeat_record(part: str, first: dict, second: dict, keys) -> dict:
    """One point timed twice: both medians (ms) and second / first - 1 per timed key."""
    rec = {"part": part, **{k: first[k] for k in ("bs", "ctx", "ndt", "routing", "role") if k in first}}
    for k in keys:
        m0, m1 = first[k]["median_ms"], second[k]["median_ms"]
        rec[k] = {"first_ms": m0, "second_ms": m1, "change": m1 / m0 - 1}
    return rec


def main(argv=None) -> int:
    a = parse_args(argv)
    shape = KIMI_K25_TP8
    if a.dry_run:
        print(format_plan(a, build_plan(a, shape)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_verify_parts: needs a CUDA GPU (use --dry-run for the plan)", file=sys.stderr)
        return 2
    try:
        import sglang_verify_graph.kernel  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(REPO, "sgl-kernel"))
    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    l2_bytes = a.l2_mib * 2 ** 20 if a.l2_mib else float(getattr(props, "L2_cache_size", H200_L2_MIB * 2 ** 20))
    num_sms = props.multi_processor_count
    plan = build_plan(a, shape, l2_bytes, num_sms)
    print(format_plan(a, plan), flush=True)
    dev_name = torch.cuda.get_device_name(0)
    meta = {"device": dev_name, "num_sms": num_sms, "l2_bytes": l2_bytes, "versions": _versions(),
            "config": {k: v for k, v in vars(a).items()}, "shape": asdict(shape),
            "expert_bytes": expert_bytes(shape), "command": " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
            "extrapolation": EXTRAPOLATION_NOTE}
    bw = measure_copy_bandwidth(a.copy_gib, a.replays)
    print(f"COPY {bw['tbps']:.3f} TB/s (read + write, {bw['bytes_each_side'] / 2 ** 30:.1f} GiB each side)", flush=True)
    attention, moe, dense, checks, errors, repeat = [], [], [], {}, [], []

    if "attention" in a.parts:
        for p in plan["attention"]:
            try:
                for r in bench_attention(a, shape, p["ctx"], p["bs"], p["copies"], num_sms, not a.no_checks):
                    attention.append(r)
                    print(f"ATTN ctx={r['ctx']} bs={r['bs']} ndt={r['ndt']} ours={r['ours']['median_ms']:.4f} "
                          f"decode={r['decode']['median_ms']:.4f} upstream={r['upstream']['median_ms']:.4f} ms"
                          + (f" check={json.dumps(r['check'])}" if "check" in r else ""), flush=True)
            except Exception as e:  # report and go on with the other points
                errors.append(f"attention ctx={p['ctx']} bs={p['bs']}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)
            torch.cuda.empty_cache()
        if attention:  # the first point again: the spread of one version timed twice
            p = plan["attention"][0]
            try:
                again = bench_attention(a, shape, p["ctx"], p["bs"], p["copies"], num_sms, False)
                for r0, r1 in zip([r for r in attention if (r["ctx"], r["bs"]) == (p["ctx"], p["bs"])], again):
                    repeat.append(_repeat_record("attention", r0, r1, ("ours", "decode", "upstream")))
            except Exception as e:
                errors.append(f"attention repeat: {type(e).__name__}: {e}"[:400])

    if "moe" in a.parts:
        _install_sglang_runtime()
        for method in a.moe_methods:
            if not a.no_checks:
                try:
                    checks[f"moe_{method}"] = check_moe(a, method, shape)
                    print(f"CHECK moe {method}: {json.dumps(checks[f'moe_{method}'])}", flush=True)
                except Exception as e:
                    errors.append(f"moe check {method}: {type(e).__name__}: {e}"[:400])
                    print("ERROR " + errors[-1], flush=True)
            try:
                holder = _SchemeHolder(method, shape, a.moe_copies, a.seed)
            except Exception as e:
                errors.append(f"moe weights {method}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)
                continue
            for p in (q for q in plan["moe"] if q["method"] == method):
                try:
                    r = bench_moe(a, holder, p["role"], p["bs"], p["ndt"], p["routing"])
                    moe.append(r)
                    print(f"MOE {method} {r['role']} bs={r['bs']} ndt={r['ndt']} routing={r['routing']} "
                          f"T={r['tokens']} "
                          f"{r['time']['median_ms']:.4f} ms experts={r['unique_experts']:.1f}", flush=True)
                except Exception as e:
                    errors.append(f"moe {method} {p}: {type(e).__name__}: {e}"[:400])
                    print("ERROR " + errors[-1], flush=True)
            first = [m for m in moe if m["method"] == method]
            if first:
                m0 = first[0]
                try:
                    m1 = bench_moe(a, holder, m0["role"], m0["bs"], m0["ndt"], m0["routing"])
                    repeat.append(_repeat_record("moe", m0, m1, ("time",)))
                except Exception as e:
                    errors.append(f"moe repeat: {type(e).__name__}: {e}"[:400])
            del holder
            torch.cuda.empty_cache()

    if "dense" in a.parts:
        for p in plan["dense"]:
            try:
                d = bench_dense(a, shape, p["tokens"], l2_bytes)
                dense.append(d)
                print(f"DENSE T={d['tokens']} sum={sum(s['median_ms'] for s in d['ops'].values()):.4f} ms", flush=True)
            except Exception as e:
                errors.append(f"dense T={p['tokens']}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)

    rows = combine_rows(a, attention, moe, dense, shape)
    wall = time.time() - t_start
    print(f"\n{dev_name}, {meta['versions']}; ms per layer (median of {a.replays} CUDA-graph replays); "
          f"MoE: {a.moe_methods[0]}, routing '{a.compose_routing}'; copy bandwidth {bw['tbps']:.2f} TB/s; "
          f"{EXTRAPOLATION_NOTE}; wall {wall:.0f} s\n")
    if dense:
        print("Dense GEMMs, ms per call\n")
        print(format_dense_table(dense) + "\n")
    if moe:
        print("MoE (experts touched = mean over the routing draws; floor = touched bytes / bandwidth)\n")
        print(format_moe_table(moe, shape, bw["tbps"], a.hbm_tbps) + "\n")
    for r in repeat:
        print("REPEAT " + json.dumps(r))
    if rows:
        print(f"\nPer layer (MoE {a.moe_methods[0]}, routing '{a.compose_routing}'; verify = ours' attention)\n")
        print(format_table(rows, shape, with_dense="dense" in a.parts))
    bad = [f"{k}: {v}" for k, v in checks.items() if not v["finite"] or v["rel_err_vs_fp32_reference"] > 3e-2]
    bad += [f"attention ctx={r['ctx']} bs={r['bs']} ndt={r['ndt']}: {r['check']}" for r in attention
            if "check" in r and (not all(r["check"][k] for k in ("ours_finite", "upstream_finite", "decode_finite"))
                                 or r["check"]["ours_vs_upstream_rel_err"] > 2e-2
                                 or r["check"]["decode_vs_ours_first_row_rel_err"] > 2e-2)]
    for b in bad:
        print("CHECK FAILED " + b)
    for e in errors:
        print("ERROR " + e)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "plan": plan, "copy_bandwidth": bw, "attention": attention, "moe": moe,
                       "dense": dense, "rows": rows, "checks": checks, "repeat": repeat, "errors": errors,
                       "wall_s": wall}, f, indent=1)
    return 1 if (errors or bad) else 0


if __name__ == "__main__":
    sys.exit(main())
