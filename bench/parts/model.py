"""The layer the parts bench times (one Kimi-K2.5 TP-8 shard layer, :class:`LayerShape`) and its
CPU-side models: the MoE bytes model, drawn routings, INT4 packing and a float reference MoE,
the rotation of input copies past L2."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
