"""The pair's weights (state dicts of the target and the EAGLE-3 draft) and writing the two
model folders: the small pair (``model.safetensors``) and the real-shape pairs
(``pytorch_model.bin`` with shared storages)."""

from __future__ import annotations

import dataclasses
import json
import os

from bench.models.accept_pair.config import (
    AGREE_LLAMA8B, AUX_IDS, BOS, BOS_PLANES, BOS_SCORE, GATE_Z, HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE,
    KV_HEADS, LAYERS, LLAMA8B, NAMES, NUM_STEPS, PARTNER_BONUS, RMS_EPS, ROPE_THETA, SELF_HEAD, SELF_PLANES,
    SELF_SCORE, SPEEDUP_NEW_TOKENS, VOCAB, _configs, bos_heads, feature_dims, PairShape, rope_inv_freq,
    shape_configs,
)
from bench.models.accept_pair.simulator import code_bits, make_class_maps, make_codes, pair_maps


def _attention_target(target: dict, maps: dict, hidden: int, vocab: int, heads: int,
                      kv_heads: int, head_dim: int, rope_theta: float = ROPE_THETA,
                      rope_scaling: dict | None = None, absorber: float = 0.0) -> None:
    """Turn the plain target (one-hot residual, zero ``o_proj``) into the attention pair's, in
    place: embedding bias dim, layer-0 self and BOS heads (:func:`bos_heads`), the code lm_head
    (module docstring); the self head's planes follow ``rope_theta`` / ``rope_scaling``.
    ``absorber``: a constant in the last residual dim of every token (read by nothing), so that
    the RMSNorm of a row changes by little when its features do; 0: none."""
    import torch

    code, g = maps["code"], maps["g"]
    dims = feature_dims(vocab)
    nbits = len(dims["self"])
    group, half = heads // kv_heads, head_dim // 2
    if group < 2 or kv_heads < 2 or SELF_PLANES + BOS_PLANES > half:
        raise ValueError(f"the attention pair needs >= 2 KV heads of >= 2 q heads and head_dim >= "
                         f"{2 * (SELF_PLANES + BOS_PLANES)} (heads {heads}, kv {kv_heads}, "
                         f"head_dim {head_dim})")
    if hidden < vocab + nbits + 3:
        raise ValueError(f"the attention pair needs hidden >= vocab + {nbits + 3}, got {hidden}")
    bos_q = bos_heads(heads, kv_heads)
    target["model.embed_tokens.weight"][:, dims["bias"]] = 1.0
    if absorber:
        target["model.embed_tokens.weight"][:, hidden - 1] = absorber
    r0 = 1.0 / ((2.0 + absorber ** 2) / hidden + RMS_EPS) ** 0.5  # normalized e_t and bias dim
    scale = head_dim ** -0.5
    w = rope_inv_freq(head_dim, rope_theta, rope_scaling).double()
    p = "model.layers.0.self_attn."
    wq, wk = target[p + "q_proj.weight"], target[p + "k_proj.weight"]
    wv, wo = target[p + "v_proj.weight"], target[p + "o_proj.weight"]
    qh = lambda h: slice(h * head_dim, (h + 1) * head_dim)  # noqa: E731
    for h in (SELF_HEAD,) + bos_q:
        wq[qh(h)] = 0.0
    for kvh in (SELF_HEAD // group, bos_q[0] // group):
        wk[qh(kvh)] = 0.0
        wv[qh(kvh)] = 0.0
    # self head: score(d) = SELF_SCORE * sum_i A_i cos((d + 1) w_i) / sum_i A_i, A_i ~ sqrt(w_i)
    amp = w[:SELF_PLANES].sqrt()
    a = (amp / amp.sum() * SELF_SCORE / scale).sqrt()
    qv, kv = torch.zeros(head_dim, dtype=torch.float64), torch.zeros(head_dim, dtype=torch.float64)
    kv[:SELF_PLANES] = a
    qv[:SELF_PLANES] = a * w[:SELF_PLANES].cos()
    qv[half:half + SELF_PLANES] = a * w[:SELF_PLANES].sin()
    base = SELF_HEAD * head_dim
    wq[base:base + head_dim, dims["bias"]] = (qv / r0).float()
    base = (SELF_HEAD // group) * head_dim
    wk[base:base + head_dim, dims["bias"]] = (kv / r0).float()
    hbits = torch.tensor([code_bits(c, vocab)[0] for c in code])  # [V, nbits]
    sgn = torch.tensor([code_bits(c, vocab)[1] for c in code])  # [V]
    wv[base:base + nbits, :vocab] = hbits.T / r0
    for j in range(nbits):
        wo[dims["self"][j], SELF_HEAD * head_dim + j] = 1.0
    # BOS heads: k from e_BOS only, q = +-s(t); value +1 for BOS, -1 for every other id
    b = (BOS_SCORE / BOS_PLANES / scale) ** 0.5
    planes = list(range(half - BOS_PLANES, half))
    base = (bos_q[0] // group) * head_dim
    for i in planes:
        wk[base + i, BOS] = b / r0
        for h, sign in zip(bos_q, (1.0, -1.0)):
            wq[h * head_dim + i, :vocab] = sign * sgn * b / r0
    wv[base, :vocab] = -1.0 / r0
    wv[base, BOS] = 1.0 / r0
    for h, d in zip(bos_q, dims["bos"]):
        wo[d, h * head_dim] = 1.0
    # lm_head: logit(n) = w(n) . f + PARTNER_BONUS [n = g(p(t))], w(n) = features of g^-1(n)
    feats = torch.cat([hbits, sgn[:, None], -sgn[:, None]], dim=1)  # F(t) [V, nbits + 2]
    ginv = [0] * vocab
    for t, n in enumerate(g):
        ginv[n] = t
    lm = torch.zeros(vocab, hidden)
    lm[:, dims["self"] + dims["bos"]] = feats[torch.tensor(ginv)]
    inv = {c: i for i, c in enumerate(code)}
    sign_bit = 1 << nbits
    for t in range(vocab):
        lm[g[inv[code[t] ^ sign_bit]], t] = PARTNER_BONUS
    target["lm_head.weight"] = lm


def build_weights(maps: dict, hidden: int = HIDDEN, vocab: int = VOCAB, layers: int = LAYERS,
                  heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                  intermediate: int = INTERMEDIATE, seed: int = 0, attention: bool = False,
                  rope_theta: float = ROPE_THETA, rope_scaling: dict | None = None,
                  absorber: float = 0.0):
    """The two state dicts (HF names, float32 CPU tensors): ``(target, draft)``.

    ``attention``: the attention pair's target (``maps`` then needs ``"code"``, from
    :func:`make_codes`; its self head is built for ``rope_theta`` / ``rope_scaling``); the draft
    is the same either way. ``absorber``: see :func:`_attention_target` (attention pair only).

    Raises:
        ValueError: ``vocab > hidden // 2`` or ``intermediate < 2 * vocab`` (no room for the
            one-hot states or the lookup units); with ``attention``, a shape without room for
            its heads or features, or a vocab that is not a power of two.
    """
    import torch

    if vocab > hidden // 2 or intermediate < 2 * vocab:
        raise ValueError(f"need vocab <= hidden/2 and intermediate >= 2*vocab "
                         f"(vocab {vocab}, hidden {hidden}, intermediate {intermediate})")
    if attention and len(maps.get("code", ())) != vocab:
        raise ValueError("attention=True needs maps['code'] (make_codes) with one code per id")
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    eye = torch.eye(vocab)
    embed = torch.zeros(vocab, hidden)
    embed[:, :vocab] = eye  # e_t
    target = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(hidden)}
    lm_head = torch.zeros(vocab, hidden)
    lm_head[torch.tensor(maps["g"]), torch.arange(vocab)] = 1.0
    target["lm_head.weight"] = lm_head
    for i in range(layers):
        p = f"model.layers.{i}."
        target.update({
            p + "self_attn.q_proj.weight": rand(q_out, hidden),
            p + "self_attn.k_proj.weight": rand(kv_out, hidden),
            p + "self_attn.v_proj.weight": rand(kv_out, hidden),
            p + "self_attn.o_proj.weight": torch.zeros(hidden, q_out),
            p + "mlp.gate_proj.weight": rand(intermediate, hidden),
            p + "mlp.up_proj.weight": rand(intermediate, hidden),
            p + "mlp.down_proj.weight": torch.zeros(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })

    # Draft: fc maps the first aux copy e_y -> u_y; the MLP is the lookup u_y -> e_D1(y),
    # e_t -> e_G(t); lm_head reads e_t.
    fc = torch.zeros(hidden, hidden * len(AUX_IDS))
    fc[vocab + torch.arange(vocab), torch.arange(vocab)] = 1.0
    a = GATE_Z / hidden ** 0.5  # normalized one-hot input = sqrt(hidden) at its dim
    act = GATE_Z * torch.sigmoid(torch.tensor(GATE_Z)).item() * GATE_Z  # silu(z) * z
    gate, up = torch.zeros(intermediate, hidden), torch.zeros(intermediate, hidden)
    down = torch.zeros(hidden, intermediate)
    for src, dst_of in ((vocab, maps["d1"]), (0, maps["G"])):  # u_y rows, then e_t rows
        for t in range(vocab):
            k = src + t  # unit k reads input dim k
            gate[k, k] = up[k, k] = a
            down[dst_of[t], k] += 1.0 / act
            down[k, k] -= 1.0 / act
    lm_head_d = torch.zeros(vocab, hidden)
    lm_head_d[:, :vocab] = eye
    p = "midlayer."
    draft = {
        "fc.weight": fc, "norm.weight": torch.ones(hidden), "lm_head.weight": lm_head_d,
        "embed_tokens.weight": rand(vocab, hidden),
        "d2t": torch.zeros(vocab, dtype=torch.int64),
        p + "self_attn.q_proj.weight": rand(q_out, 2 * hidden),
        p + "self_attn.k_proj.weight": rand(kv_out, 2 * hidden),
        p + "self_attn.v_proj.weight": rand(kv_out, 2 * hidden),
        p + "self_attn.o_proj.weight": torch.zeros(hidden, q_out),
        p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
        p + "mlp.down_proj.weight": down,
        p + "input_layernorm.weight": torch.ones(hidden),
        p + "hidden_norm.weight": torch.ones(hidden),
        p + "post_attention_layernorm.weight": torch.ones(hidden),
    }
    if attention:
        _attention_target(target, maps, hidden, vocab, heads, kv_heads, head_dim, rope_theta,
                          rope_scaling, absorber)
    return target, draft

def write_pair(out: str, agree: float = 0.7, seed: int = 0, attention: bool = False) -> tuple:
    """Write both folders under ``out`` (:data:`NAMES`: ``llama-pair`` or, with ``attention``,
    ``llama-pair-attn``, and the draft's ``-eagle3``); returns ``(target_dir, draft_dir)``."""
    import torch
    from safetensors.torch import save_file

    mm, tcfg, dcfg = _configs()
    maps = pair_maps(agree, seed, attention)
    tw, dw = build_weights(maps, seed=seed, attention=attention)
    dirs = []
    base = NAMES[attention]
    for name, cfg, weights in ((base, tcfg, tw), (base + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=agree, seed=seed, attention=attention), f)
        dirs.append(d)
    return tuple(dirs)

def build_shape_weights(maps: dict, shape: PairShape, seed: int = 0, attention: bool = True,
                        dtype=None) -> tuple:
    """The two state dicts of ``shape`` (HF names, CPU tensors of ``dtype``, default bfloat16):
    ``(target, draft)``, for ``torch.save`` (``pytorch_model.bin``).

    Layer 0 and the draft are :func:`build_weights`' at ``shape.vocab`` ids. Layers 1 ..
    ``layers - 1`` cost a real layer's compute but write nothing: random q/k/v and gate/up at full
    size, ``o_proj`` and ``down_proj`` zero, so the residual is the one layer 0 leaves. They all
    hold views of the same few tensors (and layer 0's MLP too: it writes nothing in either pair):
    ``torch.save`` stores a shared storage once, SGLang's loader copies it into every layer's own
    parameter. The embedding and lm_head are padded with zero rows to ``vocab_size``: no prompt
    holds an id ``>= vocab``, and a zero lm_head row's logit 0 never wins, the greedy token's
    logit being positive (``test_accept_pair.py``). The draft's lm_head is padded to
    ``draft_vocab`` rows, its ``d2t`` is zeros of that length; it has no ``embed_tokens``
    (SGLang 0.5.16's EAGLE-3 worker gives the draft the target's embedding, ``set_embed``).

    Raises ValueError as :func:`build_weights`, or for a shape whose vocab or draft vocab is
    below ``vocab``.
    """
    import torch

    dtype = dtype or torch.bfloat16
    V, H, I = shape.vocab, shape.hidden, shape.intermediate
    q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    if shape.vocab_size < V or shape.draft_vocab < V:
        raise ValueError(f"shape {shape.name}: vocab_size {shape.vocab_size} and draft_vocab "
                         f"{shape.draft_vocab} must be >= vocab {V}")
    t32, d32 = build_weights(maps, hidden=H, vocab=V, layers=1, heads=shape.heads,
                             kv_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate=I,
                             seed=seed, attention=attention, rope_theta=shape.rope_theta,
                             rope_scaling=shape.rope_scaling)
    gen = torch.Generator().manual_seed(seed + 1)
    rand = lambda *sz: (torch.randn(*sz, generator=gen) * 0.02).to(dtype)  # noqa: E731
    gate, up, attn = rand(I, H), rand(I, H), rand(q_out + 2 * kv_out, H)  # attn: q, k, v rows
    zeros = torch.zeros(H * max(I, q_out), dtype=dtype)
    ones = torch.ones(H, dtype=dtype)
    shared = {"self_attn.q_proj.weight": attn[:q_out], "self_attn.k_proj.weight": attn[q_out:q_out + kv_out],
              "self_attn.v_proj.weight": attn[q_out + kv_out:],
              "self_attn.o_proj.weight": zeros[:H * q_out].view(H, q_out),
              "mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up,
              "mlp.down_proj.weight": zeros[:H * I].view(H, I),
              "input_layernorm.weight": ones, "post_attention_layernorm.weight": ones}

    def padded(w, rows):
        out = torch.zeros(rows, w.shape[1], dtype=dtype)
        out[:w.shape[0]] = w
        return out

    target = {k: v.to(dtype) for k, v in t32.items() if not k.startswith("model.layers.0.mlp.")}
    target["model.embed_tokens.weight"] = padded(t32["model.embed_tokens.weight"], shape.vocab_size)
    target["lm_head.weight"] = padded(t32["lm_head.weight"], shape.vocab_size)
    target["model.norm.weight"] = ones
    for k in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        target["model.layers.0." + k] = ones
    for k in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):
        target["model.layers.0." + k] = shared[k]
    for i in range(1, shape.layers):
        target.update({f"model.layers.{i}.{k}": v for k, v in shared.items()})
    draft = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in d32.items()
             if k not in ("embed_tokens.weight", "d2t")}
    draft["lm_head.weight"] = padded(d32["lm_head.weight"], shape.draft_vocab)
    draft["d2t"] = torch.zeros(shape.draft_vocab, dtype=torch.int64)
    return target, draft


def unique_bytes(sd: dict) -> int:
    """Bytes ``torch.save`` writes for the tensors of ``sd``: each storage counted once."""
    seen = {}
    for v in sd.values():
        st = v.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def write_shape_pair(out: str, shape: PairShape = LLAMA8B, agrees=AGREE_LLAMA8B, seed: int = 0,
                     attention: bool = True, targets=None) -> tuple:
    """Write the pair of ``shape`` under ``out``: ``shape.folder(attention)`` and its ``-eagle3``,
    each with config.json, tokenizer, ``pytorch_model.bin`` (:func:`build_shape_weights`, shared
    storages written once; SGLang 0.5.16's default loader reads ``*.bin`` when no
    ``*.safetensors`` is there: ``torch.load(weights_only=True)``) and ``pair_maps.json``
    (:func:`make_class_maps`, one class per value of ``agrees``, each with its ``target_accept_length``
    from ``targets`` when given, and the ``shape``). Returns ``(target_dir, draft_dir)``."""
    import torch

    mm, tcfg, dcfg = shape_configs(shape)
    maps = make_class_maps(shape.vocab, agrees, seed)
    if attention:
        maps["code"] = make_codes(shape.vocab, seed)
    for c, cls in enumerate(maps["classes"]):
        cls["target_accept_length"] = targets[c] if targets else None
    tw, dw = build_shape_weights(maps, shape, seed, attention)
    dirs = []
    base = shape.folder(attention)
    for name in (base, base + "-eagle3"):  # a build cut short leaves no pair_maps.json: not "ready"
        stale = os.path.join(out, name, "pair_maps.json")
        if os.path.exists(stale):
            os.remove(stale)
    for name, cfg, weights in ((base, tcfg, tw), (base + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        for old in ("model.safetensors", "pytorch_model.bin"):
            if os.path.exists(os.path.join(d, old)):
                os.remove(os.path.join(d, old))
        torch.save(weights, os.path.join(d, "pytorch_model.bin"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=list(agrees), seed=seed, attention=attention,
                           shape=dataclasses.asdict(shape), num_steps=NUM_STEPS,
                           new_tokens=SPEEDUP_NEW_TOKENS), f)
        dirs.append(d)
    return tuple(dirs)
