"""The prefix-reading pair: a target whose greedy token depends, through attention, on every
prefix position, every layer's KV buffer and the first KV split, with the plain pair's draft.

    python -m bench models pair OUT_DIR --prefix [--span 1024]

writes ``OUT_DIR/llama-pair-prefix`` and ``OUT_DIR/llama-pair-prefix-eagle3`` (+ ``pair_maps.json``
with the span and the offsets). The attention pair (:mod:`.builder`) reads only its own key and
BOS, so a wrong page-table entry in the middle of the prefix, a dropped middle KV split or a wrong
layer's KV buffer cannot change its tokens. This target adds *offset checks*.

Shape (:data:`PREFIX_SHAPE`): hidden 1024, 4 layers, 32 q / 16 KV heads of 128, vocab 512,
``rope_theta`` 500000 (the 4 slowest rotary planes turn by < 0.05 rad over 10k positions, so a
key at position 0 scores the same from any row). Layer 0 is the attention pair's (self head on
KV head 0, BOS heads on KV head 1; module docstring of :mod:`bench.models.accept_pair`); its other
KV heads are zero. Greedy token: ``g(t)`` when every check passes; else ``g(p(t))`` (the partner,
as when BOS is missing).

An *offset check* (q heads ``2j``, ``2j + 1`` = A, B on KV head ``j`` of layer ``l >= 1``, offset
``K``) reads the key at ``n - K`` from the row at position ``n``:

* its key ``k = k_off(l) + k_bos``: ``k_off`` (fastest :data:`OFFSET_PLANES` planes, amplitude
  ``~ w_i ** OFFSET_AMP_POWER``, sign pattern ``sigma_l`` per layer) from ``bias - e_BOS`` (so BOS
  has none), ``k_bos`` (slowest 4 planes) from ``e_BOS``; value dim 127: +1 for BOS, -1 else.
* its queries rotate ``k_off`` to peak at offset ``K`` (:data:`PEAK_SCORE` logits; every other
  offset, and another layer's pattern at any offset, scores at most :data:`NON_PEAK_MAX` of it),
  plus ``+-s(t)`` times ``k_bos`` (:data:`SINK_SCORE` logits on BOS, between the two). BOS's own
  query is zero.
* so with the key at ``n - K`` readable (the right slot, the right layer, not dropped) A and B
  both read it: value -1 each. Without it, the head whose BOS term is ``+SINK`` (A when
  ``s(t) = +1``) reads BOS (+1), the other the best other key (-1): ``A - B = 2 s(t)``. Without
  BOS either (first split dropped) both read other keys: ``A - B = 0``.
* ``o_proj`` adds ``(B - A) (1, -1)`` to the two BOS feature dims: 0 when the check passes,
  ``-2 (s, -s)`` when it fails, which flips the feature the lm_head compares (``c`` below).

Layers 1 and 2 hold checks of offset 1 on KV heads 0 and 1 (every row but BOS has a previous key,
so no prompt row fails a check there and the keys of later layers stay exact); layer 3 holds one
check per KV head at the offsets :func:`prefix_offsets` (1 .. span). A wrong layer's buffer read by
layer ``l >= 1`` fails its KV-1 check (layer 0's KV head 1 holds BOS keys and values, the other
layers' KV head 1 a check of another sign pattern); read by layer 0 it gives zero features (the
other layers' value dims 0..8 are zero).

Readout (lm_head of the attention pair): with ``c`` = 1 (BOS seen) or 0 (BOS missing or
unreadable) minus 2 per failed check, and ``f`` the self head's code bits (0 when layer 0 reads
another layer), ``logit(n) = h(g^-1 n) . f + 2 c s(g^-1 n) s(t) + 2 [n = g(p(t))]``
(:func:`bench.models.accept_pair.prefix_sim.readout`).

Prompts: BOS, then at least ``span + 1`` ids, so every output row finds each of its offsets;
positions ``T - span .. T - 1`` are read by the output rows of the first ``span / 15 + 1`` new
tokens (:func:`bench.models.accept_pair.prefix_sim.prefix_prompts`).
"""

from __future__ import annotations

import json
import math
import os
import random

from bench.models.accept_pair.config import (
    AUX_IDS, BOS, BOS_PLANES, HEAD_DIM, HIDDEN, INTERMEDIATE, RMS_EPS, VOCAB, feature_dims,
    rope_inv_freq,
)

PREFIX_THETA = 500000.0
PREFIX_HEADS, PREFIX_KV_HEADS, PREFIX_LAYERS = 32, 16, 4
PREFIX_NAME = "llama-pair-prefix"
OFFSET_PLANES = 60  # the fastest planes carry k_off; the slowest BOS_PLANES carry k_bos
OFFSET_AMP_POWER = 1.0
PEAK_SCORE = 240.0  # logits (after sm_scale) of a check's key at its offset
SINK_SCORE = 216.0  # logits of BOS for the check head whose BOS term is positive
NON_PEAK_MAX = 0.84  # every other offset (|d| <= 17000) and another layer's keys: at most this share
VALUE_DIM = HEAD_DIM - 1  # the checks' and BOS keys' +-1 value
CHECK_OFFSET = 1  # layers 1 .. L-2
CHECK_KV_HEADS = (0, 1)
DEFAULT_SPAN = 1024
FEATURES_AT_LAYER_1 = 12  # squared residual entering layers >= 1: e_t, bias, 8 code bits, 2 BOS dims
ABSORBER = 64.0  # the last residual dim of every token: a failed check in layer 1 or 2 moves a
# row's RMSNorm by < 2 %, so the keys later layers write there stay within the score margins


def prefix_offsets(span: int, kv_heads: int = PREFIX_KV_HEADS) -> list:
    """The last layer's check offsets, one per KV head: ``1 + round(j (span - 1) / (kv_heads -
    1))`` for ``j = 0 .. kv_heads - 1`` (1 and ``span`` included; positions). Raises ValueError
    for ``span < kv_heads``."""
    if span < kv_heads:
        raise ValueError(f"span {span}: want >= {kv_heads} (one distinct offset per KV head)")
    return [1 + round(j * (span - 1) / (kv_heads - 1)) for j in range(kv_heads)]


def layer_signs(layer: int, planes: int = OFFSET_PLANES) -> list:
    """``sigma_l``: the sign (+-1.0) of each offset plane of layer ``layer``'s checks."""
    rng = random.Random(f"prefix-signs-{layer}")
    return [1.0 if rng.random() < 0.5 else -1.0 for _ in range(planes)]


def offset_amplitudes(theta: float = PREFIX_THETA, head_dim: int = HEAD_DIM) -> list:
    """``a_i`` per offset plane with ``sum_i a_i^2 / sqrt(head_dim) = PEAK_SCORE``,
    ``a_i^2 ~ w_i ** OFFSET_AMP_POWER``."""
    w = rope_inv_freq(head_dim, theta).double()[:OFFSET_PLANES]
    share = w ** OFFSET_AMP_POWER
    share = share / share.sum()
    return (share * PEAK_SCORE * head_dim ** 0.5).sqrt().tolist()


def check_score(d, offset: int, q_layer: int, k_layer: int, theta: float = PREFIX_THETA,
                head_dim: int = HEAD_DIM):
    """The offset part of a check's score (logits) for keys at ``m - n = d`` (a float64 tensor
    of offsets): queries of layer ``q_layer``'s check at ``offset``, keys of ``k_layer``'s
    pattern. Equals :data:`PEAK_SCORE` at ``d = -offset`` when the layers agree."""
    import torch

    w = rope_inv_freq(head_dim, theta).double()[:OFFSET_PLANES]
    a = torch.tensor(offset_amplitudes(theta, head_dim), dtype=torch.float64)
    sq = torch.tensor(layer_signs(q_layer), dtype=torch.float64)
    sk = torch.tensor(layer_signs(k_layer), dtype=torch.float64)
    d = torch.as_tensor(d, dtype=torch.float64)
    return (a * a * sq * sk * torch.cos((d[:, None] + offset) * w[None, :])).sum(1) * head_dim ** -0.5


def _unit(squares: float, hidden: int) -> float:
    """The RMSNorm output of a unit entry in a residual of ``squares`` unit entries."""
    return 1.0 / (squares / hidden + RMS_EPS) ** 0.5


def _add_check(sd: dict, layer: int, kvh: int, offset: int, code: list, hidden: int, vocab: int,
               head_dim: int, theta: float) -> None:
    """Write one offset check (q heads ``2 kvh``, ``2 kvh + 1`` on KV head ``kvh``) into ``sd``."""
    import torch

    from bench.models.accept_pair.simulator import code_bits

    dims = feature_dims(vocab)
    u = _unit(FEATURES_AT_LAYER_1 + ABSORBER ** 2, hidden)
    half, scale = head_dim // 2, head_dim ** -0.5
    w = rope_inv_freq(head_dim, theta).double()
    a = offset_amplitudes(theta, head_dim)
    sig = layer_signs(layer)
    bb = (SINK_SCORE / BOS_PLANES / scale) ** 0.5
    sgn = torch.tensor([code_bits(c, vocab)[1] for c in code], dtype=torch.float64)
    sgn[BOS] = 0.0  # BOS's own query stays zero
    p = f"model.layers.{layer}.self_attn."
    wq, wk, wv, wo = (sd[p + n + "_proj.weight"] for n in "qkvo")
    kb, heads = kvh * head_dim, (2 * kvh, 2 * kvh + 1)
    bias = dims["bias"]
    for i in range(OFFSET_PLANES):
        amp = sig[i] * a[i] / u
        wk[kb + i, bias], wk[kb + i, BOS] = amp, -amp
        for h in heads:
            c, s = amp * math.cos(offset * w[i].item()), -amp * math.sin(offset * w[i].item())
            wq[h * head_dim + i, bias], wq[h * head_dim + i, BOS] = c, -c
            wq[h * head_dim + half + i, bias], wq[h * head_dim + half + i, BOS] = s, -s
    for i in range(half - BOS_PLANES, half):
        wk[kb + i, BOS] = bb / u
        for h, sign in zip(heads, (1.0, -1.0)):
            wq[h * head_dim + i, :vocab] = (sign * sgn * bb / u).float()
    wv[kb + VALUE_DIM, bias], wv[kb + VALUE_DIM, BOS] = -1.0 / u, 2.0 / u
    b0, b1 = dims["bos"]
    for h, sign in zip(heads, (-1.0, 1.0)):  # (B - A) (1, -1)
        wo[b0, h * head_dim + VALUE_DIM] = sign
        wo[b1, h * head_dim + VALUE_DIM] = -sign


def build_prefix_weights(maps: dict, span: int = DEFAULT_SPAN, seed: int = 0) -> tuple:
    """The two state dicts (HF names, float32 CPU tensors) of the prefix pair: ``(target,
    draft)``. ``maps`` needs ``"g"``, ``"d1"``, ``"G"``, ``"code"`` (:func:`pair_maps` with
    ``attention=True``). Raises ValueError as :func:`prefix_offsets`."""
    from bench.models.accept_pair.builder import build_weights

    offsets = prefix_offsets(span)
    target, draft = build_weights(maps, hidden=HIDDEN, vocab=VOCAB, layers=PREFIX_LAYERS,
                                  heads=PREFIX_HEADS, kv_heads=PREFIX_KV_HEADS, head_dim=HEAD_DIM,
                                  intermediate=INTERMEDIATE, seed=seed, attention=True,
                                  rope_theta=PREFIX_THETA, absorber=ABSORBER)
    # logits in the units of the pair without the absorber (the final norm's unit shrinks)
    target["lm_head.weight"] *= ((FEATURES_AT_LAYER_1 + ABSORBER ** 2) / FEATURES_AT_LAYER_1) ** 0.5
    hd = HEAD_DIM
    p0 = "model.layers.0.self_attn."
    u0 = _unit(2.0 + ABSORBER ** 2, HIDDEN)
    for name in ("k_proj", "v_proj"):  # layer 0: only the self and BOS KV heads
        target[p0 + name + ".weight"][2 * hd:] = 0.0
    wv0 = target[p0 + "v_proj.weight"]
    wv0[hd + VALUE_DIM, :VOCAB] = -1.0 / u0  # BOS keys' value in the checks' dim too
    wv0[hd + VALUE_DIM, BOS] = 1.0 / u0
    for layer in range(1, PREFIX_LAYERS):
        p = f"model.layers.{layer}.self_attn."
        for name in ("q_proj", "k_proj", "v_proj"):
            target[p + name + ".weight"].zero_()
        last = layer == PREFIX_LAYERS - 1
        checks = enumerate(offsets) if last else ((j, CHECK_OFFSET) for j in CHECK_KV_HEADS)
        for kvh, off in checks:
            _add_check(target, layer, kvh, off, maps["code"], HIDDEN, VOCAB, hd, PREFIX_THETA)
    return target, draft


def prefix_configs() -> tuple:
    """``(dummy_models module, target config, draft config)`` of the prefix pair."""
    from bench.models import dummy_models as mm

    target = mm._llama(HIDDEN, PREFIX_LAYERS, PREFIX_HEADS, PREFIX_KV_HEADS, INTERMEDIATE, VOCAB,
                       32768, PREFIX_THETA, head_dim=HEAD_DIM)
    draft = mm._eagle3_draft(dict(target), AUX_IDS, HIDDEN)
    mm.check_pair(PREFIX_NAME, target, draft)
    return mm, target, draft


def write_prefix_pair(out: str, span: int = DEFAULT_SPAN, agree: float = 0.7, seed: int = 0) -> tuple:
    """Write ``llama-pair-prefix`` and its ``-eagle3`` under ``out`` (config, tokenizer,
    ``model.safetensors`` in bfloat16, ``pair_maps.json`` with ``span`` and ``offsets``).
    Returns ``(target_dir, draft_dir)``."""
    import torch
    from safetensors.torch import save_file

    from bench.models.accept_pair.simulator import pair_maps

    mm, tcfg, dcfg = prefix_configs()
    maps = pair_maps(agree, seed, attention=True)
    tw, dw = build_prefix_weights(maps, span, seed)
    dirs = []
    for name, cfg, weights in ((PREFIX_NAME, tcfg, tw), (PREFIX_NAME + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=agree, seed=seed, attention=True, prefix=True, span=span,
                           offsets=prefix_offsets(span)), f)
        dirs.append(d)
    return tuple(dirs)
