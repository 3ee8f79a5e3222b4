"""The routed MoE (SGLang's WNA16 Triton and Marlin methods on random INT4 weights) and the dense
per-layer GEMMs on the GPU, each timed from a CUDA graph, with the MoE checked against a float
reference."""

from __future__ import annotations

import math
import socket
import statistics

from bench.lib.timing import time_calls
from bench.parts.model import (
    DENSE_OPS, MOE_METHODS, copies_for, count_unique_experts, draw_routing,
    expected_unique_experts_uniform, LayerShape, reference_moe, rel_err,
    unpack_int4_compressed_tensors,
)


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
