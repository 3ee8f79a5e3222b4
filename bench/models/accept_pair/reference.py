"""A float reference forward of the target (torch, CPU): its logits for a token sequence, with
a verify-attention fault applied to the chain rows (the check that the attention pair's greedy
token depends on the verify attention)."""

from __future__ import annotations

import dataclasses

from bench.models.accept_pair.config import HEAD_DIM, HEADS, KV_HEADS, RMS_EPS, ROPE_THETA, rope_inv_freq


@dataclasses.dataclass(frozen=True)
class AttentionFault:
    """A verify-attention fault of :func:`reference_logits`, applied to the chain rows only.

    ``causal_shift``: row ``r`` sees keys ``[0, r + 1 + causal_shift)`` (capped at the sequence);
    ``drop_below``: keys ``[0, drop_below)`` unread; ``drop``: ``(a, b)``, keys ``[a, b)``
    unread; ``page``: ``(p, q)``, the page-table entry of position ``p`` holds the slot of
    position ``q`` (key and value of ``q``, rotated at ``q``); ``kv_layer``: per layer, the layer
    whose K/V buffer its chain rows read (a later layer's K/V come from an unfaulted forward).
    """

    causal_shift: int = 0
    drop_below: int = 0
    page: tuple | None = None
    drop: tuple | None = None
    kv_layer: tuple | None = None


def reference_logits(sd: dict, ids: list, chain_start: int | None = None,
                     fault: AttentionFault | None = None, bf16: bool = False,
                     heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                     rope_theta: float = ROPE_THETA, skip_zero: bool = True,
                     rope_scaling: dict | None = None, logits_from: int = 0) -> tuple:
    """The float CPU forward of a target state dict over one sequence: ``(logits, entering)``.

    A plain Llama forward as SGLang 0.5.16 computes it for this config: RMSNorm (eps
    :data:`RMS_EPS`), neox RoPE with float32 ``cos``/``sin`` (``rope_inv_freq``, with
    ``rope_scaling``), causal GQA
    softmax attention with ``head_dim ** -0.5``, SiLU-gated MLP, final norm, lm_head.
    ``ids``: token ids (positions 0..T-1); ``chain_start``: first row of the verify chain, the
    rows ``fault`` applies to (None: no chain). ``bf16``: round to bfloat16 where SGLang keeps
    bfloat16 tensors (weights; every norm output; q, k, v; q and k after RoPE; the attention
    output; ``o_proj`` / MLP outputs; the residual; the logits); accumulation stays float32.
    ``skip_zero``: skip a head whose ``o_proj`` columns are all zero and an MLP whose
    ``down_proj`` is (they add exactly 0). Returns ``logits`` float32 ``[T, V]`` and
    ``entering``: the residual (float32 ``[T, hidden]``) entering each layer.
    ``logits_from``: the last layer's attention is computed for rows ``>= logits_from`` only
    (the logits of earlier rows are then not the model's; long prompts cost less).
    """
    import torch

    R = (lambda x: x.to(torch.bfloat16).float()) if bf16 else (lambda x: x)  # noqa: E731
    W = {k: R(v.float()) for k, v in sd.items() if v.is_floating_point()}
    fault = fault or AttentionFault()
    later = None
    if fault.kv_layer is not None:  # a later layer's buffer: K/V of an unfaulted forward
        later = _forward(W, ids, None, AttentionFault(), R, heads, kv_heads, head_dim,
                         rope_theta, skip_zero, rope_scaling, None)[2]
    logits, entering, _ = _forward(W, ids, chain_start, fault, R, heads, kv_heads, head_dim,
                                   rope_theta, skip_zero, rope_scaling, later, logits_from)
    return logits, entering


def _forward(W, ids, chain_start, fault, R, heads, kv_heads, head_dim, rope_theta, skip_zero,
             rope_scaling, later, logits_from=0):
    """:func:`reference_logits`' forward: ``(logits, entering, kv)``, ``kv[i]`` = layer ``i``'s
    post-RoPE keys and values (``[T, kv_heads, head_dim]`` each; None for a layer without a live
    head). ``later``: the ``kv`` of an unfaulted forward, for ``fault.kv_layer`` entries that
    name a later layer; ``logits_from``: :func:`reference_logits`'."""
    import torch

    T = len(ids)
    cs = T if chain_start is None else chain_start
    group, half = heads // kv_heads, head_dim // 2
    ang = torch.arange(T, dtype=torch.float)[:, None] * rope_inv_freq(head_dim, rope_theta, rope_scaling)[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(v):  # [T, h, D]
        a, b = v[..., :half], v[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def norm(v, w):
        return R(v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w)

    causal = torch.ones(T, T, dtype=torch.bool).tril()
    src = torch.arange(T)
    if fault.page is not None:
        src[fault.page[0]] = fault.page[1]
    rows = torch.arange(cs, T)
    keys = torch.arange(T)
    seen = keys[None, :] < torch.clamp(rows[:, None] + 1 + fault.causal_shift, max=T)
    seen &= keys[None, :] >= fault.drop_below
    if fault.drop is not None:
        seen &= (keys[None, :] < fault.drop[0]) | (keys[None, :] >= fault.drop[1])
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    entering, kv = [], []
    layers = sum(1 for k in W if k.endswith("input_layernorm.weight"))
    for i in range(layers):
        p = f"model.layers.{i}."
        entering.append(x.clone())
        h = norm(x, W[p + "input_layernorm.weight"])
        wo = W[p + "self_attn.o_proj.weight"]
        live = [hh for hh in range(heads)
                if not skip_zero or wo[:, hh * head_dim:(hh + 1) * head_dim].any()]
        kv.append(None)
        if live:
            q = R(rope(R(h @ W[p + "self_attn.q_proj.weight"].T).view(T, heads, head_dim)))
            k = R(rope(R(h @ W[p + "self_attn.k_proj.weight"].T).view(T, kv_heads, head_dim)))
            v = R(h @ W[p + "self_attn.v_proj.weight"].T).view(T, kv_heads, head_dim)
            kv[i] = (k, v)
            kc, vc = k, v  # what the chain rows read
            j = i if fault.kv_layer is None else fault.kv_layer[i]
            if j != i:
                kc, vc = kv[j] if j < i else later[j]
                if kc is None:  # a layer without live heads: its buffer is never built here
                    raise ValueError(f"kv_layer: layer {j} has no live head to read")
            out = torch.zeros(T, heads, head_dim)
            first = logits_from if i == layers - 1 else 0
            for hh in live:
                kk, vv = k[:, hh // group], v[:, hh // group]
                s = (q[first:, hh] @ kk.T) * head_dim ** -0.5
                out[first:, hh] = torch.softmax(s.masked_fill(~causal[first:], float("-inf")), -1) @ vv
                if len(rows):  # chain rows: the fault
                    kf, vf = kc[src, hh // group], vc[src, hh // group]
                    sf = (q[rows, hh] @ kf.T) * head_dim ** -0.5
                    pf = torch.softmax(sf.masked_fill(~seen, float("-inf")), -1)
                    out[rows, hh] = torch.nan_to_num(pf) @ vf
            x = R(x + R(R(out).reshape(T, -1) @ wo.T))
        h = norm(x, W[p + "post_attention_layernorm.weight"])
        down = W[p + "mlp.down_proj.weight"]
        if not skip_zero or down.any():
            act = torch.nn.functional.silu(R(h @ W[p + "mlp.gate_proj.weight"].T))
            x = R(x + R(R(act * R(h @ W[p + "mlp.up_proj.weight"].T)) @ down.T))
    logits = R(norm(x, W["model.norm.weight"]) @ W["lm_head.weight"].T)
    return logits, entering, kv
