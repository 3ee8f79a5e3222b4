"""The draft-attention pair: the plain pair's target with an EAGLE-3 draft whose proposals go
through the draft's own attention, so a wrong draft-extend attention changes the accepted drafts.

    python -m bench models pair OUT_DIR --draft-attention [--agree 0.7] [--seed 0]

writes ``OUT_DIR/llama-pair-draft-attn`` (the plain pair's target: the same weights as
``llama-pair`` for the same ``--agree`` / ``--seed``) and ``OUT_DIR/llama-pair-draft-attn-eagle3``
(LlamaForCausalLMEagle3, this module's draft), each with ``model.safetensors`` (bfloat16) and
``pair_maps.json`` (the plain maps and ``"draft_attention": true``). Both pairs' other drafts have
``o_proj = 0``: their proposals never read their attention, so a broken draft-extend kernel cannot
change anything a server reports.

Rows the draft's one layer runs (SGLang 0.5.16: EAGLE3 always runs ``EAGLEWorkerV2``,
``speculative/eagle_worker_v2.py``, ``eagle_worker_common.py``, ``models/llama_eagle3.py``; topk 1,
``num_draft_tokens = num_steps + 1``). A row at position ``n`` holds an input id ``x`` (the
token at ``n + 1``) and a hidden state ``h``; its attention input is ``cat(norm(E[x]),
norm(h))`` (``E``: the target's embedding, shared by ``set_embed``), its residual starts at ``h``:

* draft prefill (``_draft_extend_for_prefill``): the row at prompt position ``i`` holds ``x =
  prompt[i + 1]`` (the last row: the prefill's greedy token) and ``h = fc(aux(prompt[i]))``; the
  last row's argmax is the first cycle's first draft, its output state that cycle's draft-decode
  input.
* draft decode (``draft_forward``, steps ``i = 0 .. num_steps - 2``): position ``P' + i`` (``P'``
  the committed length), ``x`` = draft ``i + 1``, ``h`` = the previous row's output state; it
  writes its KV at ``P' + i`` and attends to ``[0, P' + i]``; its argmax is draft ``i + 2``.
* verify: the chain ``(b, d_1 .. d_{nd-1})`` at positions ``P .. P + nd - 1``; ``preds[j]`` the
  target's greedy id at chain row ``j``, ``a`` drafts accepted.
* draft extend (``_draft_extend_for_decode`` -> ``prepare_for_draft_extend``, ``DRAFT_EXTEND_V2``):
  ``nd`` rows per request at positions ``P + j`` with ``x = preds[j]`` and ``h =
  fc(aux(chain[j]))``, accepted or not; every row writes its KV at the slot of ``P + j`` before
  the attention, row ``j`` attends to ``[0, P + j]`` (the chain kernel's ``seq_lens`` = ``P +
  nd``). ``select_index`` picks row ``a``: its argmax is the next cycle's first draft, its output
  state the next draft decode's input. Rows ``a + 1 ..`` are rejected: their KV slots are written
  again (draft decode, the next draft extend) before a correct attention reads them.

Construction (``H`` hidden, ``V`` vocab, ``V = kv_heads * head_dim``; ``e_t`` = unit vector
``t``, ``u_t`` = ``e_{V + t}``; three of the ``u`` dims, never an id's, carry ``c`` = ``u_0``
(the constant), ``beta`` = ``u_1`` (BOS's hidden) and ``f`` = ``u_2`` (the BOS feature)):

* ``fc``: ``c`` = 1 for every token, ``beta`` = 1 for BOS; nothing of the token otherwise. So an
  extend or prefill row starts at ``h = c`` (BOS: ``c + beta``), a decode row at the previous
  output ``c + e_d``.
* self heads (q heads ``group * k``, one per KV head ``k``): q and k read the sum of the one-hot
  embedding (the same at every row), so the score of a key at offset ``m - n`` is the target's
  self head (:mod:`bench.models.accept_pair` docstring): it peaks at ``m = n + 1``; among keys up
  to ``n`` the row's own key wins by ~35 logits; with one more key visible the next one wins,
  with the own key hidden the previous one. Value of KV head ``k``: the one-hot of ``x`` on ids
  ``128 k .. 128 k + 127`` minus the same one-hot of ``h``'s token dims, so an extend or prefill
  row's value is ``e_x`` and a decode row's (``h = c + e_x``) ~0. ``o_proj`` writes ``u_x``.
* BOS head (q head 1, KV head 0): k reads ``beta`` (only BOS at position 0 has it; the 4 slowest
  rotary planes, 24 logits), q the embedding sum; value dim 0 of KV head 0 is 1 at BOS, 0 at every
  other key. ``o_proj`` writes it to ``f``: 1 when BOS is read, 0 when it is not (every other key's
  value is 0).
* MLP (``silu(gate) * up``; a unit whose gate input is 0 gives exactly 0): ``A_x`` (gate ``u_x``,
  up ``f``) writes ``e_{DA(x)} - u_x - f``; ``B_x`` (gate ``u_x``, up ``c - f``) writes ``e_{DB(x)}
  - u_x``; ``E_t`` (gate ``e_t``, up ``c``) writes ``e_{G(t)} - e_t - f``. Each unit's weights
  are set for the RMS of the residual it fires on (3 unit entries, ``B``: 2). ``lm_head[t, t] = 1``.
* So an extend or prefill row proposes ``DA(x')`` when its self head reads the key holding ``x'``
  and BOS is read, ``DB(x')`` when BOS is not; a decode row proposes ``G(d)``; every output
  state is ``c + e_proposal``. ``DA(x) = D1(g^-1(x))`` (the plain draft's ``D1`` of the token
  before ``x``, so the clean proposals are the plain pair's) and ``DB(x) = g(x)`` where ``DA(x) !=
  g(x)``, else ``g(g(x))`` (:func:`draft_tables`): a draft that misses BOS flips the acceptance of
  every first draft.

:mod:`bench.models.accept_pair.draft_attn_sim` predicts the proposals under each draft-extend test
fault; :mod:`bench.models.accept_pair.draft_reference` is the float forward of this draft.
"""

from __future__ import annotations

import json
import os

from bench.models.accept_pair.config import (
    AUX_IDS, BOS, BOS_PLANES, BOS_SCORE, GATE_Z, HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, KV_HEADS, RMS_EPS,
    ROPE_THETA, SELF_PLANES, SELF_SCORE, SPECIAL, VOCAB, rope_inv_freq,
)

DRAFT_ATTN_NAME = "llama-pair-draft-attn"
"""The target folder (the draft's adds ``-eagle3``)."""
BOS_HEAD = 1
"""The draft's BOS q head (KV head 0, beside self head 0)."""


def draft_dims(vocab: int = VOCAB) -> dict:
    """The draft's residual dims of the non-token entries (ints): ``{"c": V, "beta": V + 1,
    "f": V + 2}`` (``u_0 .. u_2``: no id's ``u`` dim is written, ids 0/1/2 never being an
    extend row's input id)."""
    return {"c": vocab, "beta": vocab + 1, "f": vocab + 2}


def draft_tables(maps: dict) -> tuple:
    """``(DA, DB)``: the proposal of an extend / prefill row whose self head read the input id
    ``x`` with BOS read (``DA[x]``) or not (``DB[x]``); lists of ``len(maps["g"])`` ints.

    ``DA[x] = D1[g^-1[x]]`` (so a clean row after the target's greedy token ``x = g(y)`` proposes
    the plain pair's ``D1(y)``); ``DB[x] = g[x]`` where ``DA[x] != g[x]``, else ``g[g[x]]`` (never
    ``DA[x]``: ``g`` has no fixed point >= 3). Ids below 3 map to themselves. ``maps``: ``"g"``
    (a permutation), ``"d1"``."""
    g, d1 = maps["g"], maps["d1"]
    ginv = [0] * len(g)
    for t, n in enumerate(g):
        ginv[n] = t
    da, db = list(range(len(g))), list(range(len(g)))
    for x in range(SPECIAL, len(g)):
        da[x] = d1[ginv[x]]
        db[x] = g[x] if da[x] != g[x] else g[g[x]]
    return da, db


def _rms_unit(squares: float, hidden: int) -> float:
    """RMSNorm's output for an entry of 1 in a row of ``squares`` unit entries (eps included)."""
    return 1.0 / (squares / hidden + RMS_EPS) ** 0.5


def build_draft_attention_weights(maps: dict, hidden: int = HIDDEN, vocab: int = VOCAB,
                                  heads: int = HEADS, kv_heads: int = KV_HEADS,
                                  head_dim: int = HEAD_DIM, intermediate: int = INTERMEDIATE,
                                  rope_theta: float = ROPE_THETA, seed: int = 0) -> tuple:
    """The two state dicts (HF names, float32 CPU tensors): ``(target, draft)``; the target is
    :func:`bench.models.accept_pair.build_weights`' plain target for ``maps`` and ``seed``, the
    draft the construction of the module docstring (its ``embed_tokens`` random and unread: SGLang
    gives the draft the target's; ``d2t`` zeros).

    ``maps``: ``"g"``, ``"d1"``, ``"G"`` (:func:`bench.models.accept_pair.pair_maps`). Raises
    ValueError unless ``vocab == kv_heads * head_dim`` (the values hold a one-hot of the input
    id), ``heads >= 2 * kv_heads``, ``hidden >= 2 * vocab``, ``intermediate >= 3 * vocab`` and
    ``head_dim / 2 >= SELF_PLANES + BOS_PLANES``."""
    import torch

    from bench.models.accept_pair.builder import build_weights

    group, half = heads // kv_heads, head_dim // 2
    if (vocab != kv_heads * head_dim or group < 2 or hidden < 2 * vocab or intermediate < 3 * vocab
            or SELF_PLANES + BOS_PLANES > half):
        raise ValueError(f"the draft-attention draft needs vocab == kv_heads * head_dim, >= 2 q "
                         f"heads per KV head, hidden >= 2 vocab, intermediate >= 3 vocab and "
                         f"head_dim >= {2 * (SELF_PLANES + BOS_PLANES)} (vocab {vocab}, heads "
                         f"{heads}, kv {kv_heads}, head_dim {head_dim}, hidden {hidden}, "
                         f"intermediate {intermediate})")
    target, plain = build_weights(maps, hidden=hidden, vocab=vocab, heads=heads,
                                  kv_heads=kv_heads, head_dim=head_dim, intermediate=intermediate,
                                  seed=seed)
    da, db = draft_tables(maps)
    G = maps["G"]
    dims = draft_dims(vocab)
    C, BETA, F = dims["c"], dims["beta"], dims["f"]
    H = hidden
    r_emb = _rms_unit(1.0, H)  # norm(E[x]): a one-hot embedding
    r_h2 = _rms_unit(2.0, H)  # norm(h) of BOS's row (c + beta) and of a decode row (c + e_d)
    r3, r2 = _rms_unit(3.0, H), _rms_unit(2.0, H)  # the MLP input: BOS read (c, u_x, f) / not
    scale = head_dim ** -0.5
    w = rope_inv_freq(head_dim, rope_theta).double()
    q = torch.zeros(heads * head_dim, 2 * H, dtype=torch.float64)
    k = torch.zeros(kv_heads * head_dim, 2 * H, dtype=torch.float64)
    v = torch.zeros(kv_heads * head_dim, 2 * H, dtype=torch.float64)
    o = torch.zeros(H, heads * head_dim, dtype=torch.float64)
    # self heads: score(m - n = s) = SELF_SCORE * sum_i A_i cos((s - 1) w_i) / sum_i A_i
    amp = w[:SELF_PLANES].sqrt()
    a = (amp / amp.sum() * SELF_SCORE / scale).sqrt()
    qv, kv = torch.zeros(head_dim, dtype=torch.float64), torch.zeros(head_dim, dtype=torch.float64)
    kv[:SELF_PLANES] = a
    qv[:SELF_PLANES] = a * w[:SELF_PLANES].cos()
    qv[half:half + SELF_PLANES] = a * w[:SELF_PLANES].sin()
    ids = torch.arange(SPECIAL, vocab)
    for kvh in range(kv_heads):
        qh = group * kvh
        q[qh * head_dim:(qh + 1) * head_dim, :vocab] = (qv / r_emb)[:, None]
        k[kvh * head_dim:(kvh + 1) * head_dim, :vocab] = (kv / r_emb)[:, None]
    # values: e_x (embedding) minus e_x (hidden's token dims); o_proj: u_x
    rows = ids  # value row kvh * head_dim + j holds id kvh * head_dim + j
    v[rows, ids] = 1.0 / r_emb
    v[rows, H + ids] = -1.0 / r_h2
    for x in ids.tolist():
        kvh, j = divmod(x, head_dim)
        o[vocab + x, group * kvh * head_dim + j] = 1.0
    # BOS head: k from beta (position 0 only), q from the embedding sum, value dim 0 of KV head 0
    b = (BOS_SCORE / BOS_PLANES / scale) ** 0.5
    for i in range(half - BOS_PLANES, half):
        k[i, H + BETA] = b / r_h2
        q[BOS_HEAD * head_dim + i, :vocab] = b / r_emb
    v[0, H + BETA] = 1.0 / r_h2
    o[F, BOS_HEAD * head_dim] = 1.0
    # MLP units: E_t at t, A_x at V + x, B_x at 2 V + x
    gate = torch.zeros(intermediate, H, dtype=torch.float64)
    up = torch.zeros(intermediate, H, dtype=torch.float64)
    down = torch.zeros(H, intermediate, dtype=torch.float64)
    act = GATE_Z * torch.sigmoid(torch.tensor(GATE_Z, dtype=torch.float64)).item() * GATE_Z
    for t in range(vocab):
        gate[t, t], up[t, C] = GATE_Z / r3, GATE_Z / r3
        down[G[t], t] += 1.0 / act
        down[t, t] -= 1.0 / act
        down[F, t] -= 1.0 / act
    for x in ids.tolist():
        ua, ub = vocab + x, 2 * vocab + x
        gate[ua, vocab + x], up[ua, F] = GATE_Z / r3, GATE_Z / r3
        down[da[x], ua] += 1.0 / act
        down[vocab + x, ua] -= 1.0 / act
        down[F, ua] -= 1.0 / act
        gate[ub, vocab + x], up[ub, C], up[ub, F] = GATE_Z / r2, GATE_Z / r2, -GATE_Z / r2
        down[db[x], ub] += 1.0 / act
        down[vocab + x, ub] -= 1.0 / act
    fc = torch.zeros(H, H * len(AUX_IDS))
    fc[C, :vocab] = 1.0
    fc[BETA, BOS] = 1.0
    p = "midlayer."
    draft = dict(plain)
    draft.update({
        "fc.weight": fc,
        p + "self_attn.q_proj.weight": q.float(), p + "self_attn.k_proj.weight": k.float(),
        p + "self_attn.v_proj.weight": v.float(), p + "self_attn.o_proj.weight": o.float(),
        p + "mlp.gate_proj.weight": gate.float(), p + "mlp.up_proj.weight": up.float(),
        p + "mlp.down_proj.weight": down.float(),
    })
    return target, draft


def write_draft_attention_pair(out: str, agree: float = 0.7, seed: int = 0) -> tuple:
    """Write :data:`DRAFT_ATTN_NAME` and its ``-eagle3`` under ``out`` (config and tokenizer as
    the plain pair's, ``model.safetensors`` in bfloat16, ``pair_maps.json``: the plain maps of
    ``agree`` / ``seed`` with ``"draft_attention": true``). Returns ``(target_dir, draft_dir)``."""
    import torch
    from safetensors.torch import save_file

    from bench.models.accept_pair.config import _configs
    from bench.models.accept_pair.simulator import pair_maps

    mm, tcfg, dcfg = _configs()
    maps = pair_maps(agree, seed)
    tw, dw = build_draft_attention_weights(maps, seed=seed)
    dirs = []
    for name, cfg, weights in ((DRAFT_ATTN_NAME, tcfg, tw), (DRAFT_ATTN_NAME + "-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=agree, seed=seed, attention=False, draft_attention=True), f)
        dirs.append(d)
    return tuple(dirs)
