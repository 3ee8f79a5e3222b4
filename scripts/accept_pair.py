#!/usr/bin/env python3
"""A Llama target + EAGLE-3 draft whose agreement is set by construction (real weights, no hub).

    python3 scripts/accept_pair.py OUT_DIR [--agree 0.7] [--seed 0]

writes ``OUT_DIR/llama-pair`` (LlamaForCausalLM) and ``OUT_DIR/llama-pair-eagle3``
(LlamaForCausalLMEagle3): config.json, tokenizer (``sglang_verify_graph.dummy_models.write_model``) and
``model.safetensors`` with every weight SGLang loads, plus ``pair_maps.json`` (the maps below).
Random dummy weights give an accept length of 1.0 (the draft never agrees), so accept-length
bookkeeping bugs (sgl-project/sglang#16974) cannot show; this
pair makes every accepted count 0..num_steps occur, mixed within a batch, and predictable.

Construction (``H`` hidden, ``V`` vocab, ``V <= H / 2``; ``e_t`` = unit vector ``t``, ``u_t`` =
unit vector ``V + t``):

* target: ``embed_tokens[t] = e_t``; every layer's ``o_proj`` and ``down_proj`` are zero (q/k/v
  and gate/up are random, so the attention kernels still read and write real KV), so the residual
  stream of token ``t`` stays ``e_t`` at every layer; ``lm_head[g(t), t] = 1``. Greedy next
  token: exactly ``g(t)``, a random cyclic permutation of the ids >= 3 (0/1/2 = pad/bos/eos map
  to themselves), with no near-ties.
* draft (SGLang 0.5.16 ``llama_eagle3.py``): the aux hidden states (the residual entering the
  captured layers) are ``e_y`` three times; ``fc`` maps the first copy to ``u_y``. Its one layer
  has ``o_proj = 0``, so its output state is ``h + mlp(norm(h))``; the MLP is a lookup table
  (intermediate unit ``k`` reads input dim ``k`` through gate and up, ``down`` writes
  ``target - source`` scaled by the unit's activation): ``u_y -> e_{D1(y)}`` and
  ``e_t -> e_{G(t)}``. ``lm_head[t, t] = 1`` reads the state's token.
* So in an EAGLE-3 cycle whose bonus token ``b = g(y)`` follows the last accepted token ``y``,
  the drafts are ``d_1 = D1(y)``, ``d_{k+1} = G(d_k)``; the target accepts ``d_1`` iff
  ``D1(y) = g(g(y))`` and ``d_{k+1}`` iff ``G(d_k) = g(d_k)``. ``D1`` and ``G`` agree with the
  target on a random share ``--agree`` of the ids and name another token elsewhere.

:func:`simulate` replays greedy EAGLE-3 on these maps and gives the accepted-draft count of every
cycle, which the server test compares with SGLang's ``spec_correct_drafts_histogram``.
Needs torch and safetensors (the GPU machine has both); the maps need only the standard library.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

HIDDEN, VOCAB, HEADS, KV_HEADS, HEAD_DIM, LAYERS, INTERMEDIATE = 1024, 512, 8, 4, 128, 4, 2048
AUX_IDS = [0, 1, 2]  # SGLang captures the residual entering layers 1, 2, 3 (< LAYERS)
SPECIAL = 3  # ids 0/1/2: pad/bos/eos, fixed points of every map
GATE_Z = 4.0  # pre-activation of a lookup unit: silu(4) * 4 = 15.7


def make_maps(vocab: int = VOCAB, agree: float = 0.7, seed: int = 0) -> dict:
    """The target map ``g`` and the draft maps ``D1`` (first draft) and ``G`` (later drafts).

    Returns a dict of three lists of ``vocab`` ints each (``"g"``, ``"d1"``, ``"G"``). ``g`` is a
    single cycle over the ids >= 3. ``d1[y] == g[g[y]]`` and ``G[t] == g[t]`` on a random share
    ``agree`` (0..1) of the ids >= 3 (independently drawn), another id >= 3 elsewhere.
    """
    if not 0.0 <= agree <= 1.0:
        raise ValueError(f"agree must be in [0, 1], got {agree}")
    if vocab - SPECIAL < 2:
        raise ValueError(f"vocab must be >= {SPECIAL + 2}, got {vocab}")
    rng = random.Random(seed)
    ids = list(range(SPECIAL, vocab))
    rng.shuffle(ids)
    g = list(range(vocab))
    for a, b in zip(ids, ids[1:] + ids[:1]):
        g[a] = b
    d1, G = list(range(vocab)), list(range(vocab))
    for t in range(SPECIAL, vocab):
        for table, right in ((d1, g[g[t]]), (G, g[t])):
            if rng.random() < agree:
                table[t] = right
            else:  # another id >= 3
                table[t] = SPECIAL + (right - SPECIAL + rng.randrange(1, vocab - SPECIAL)) % (
                    vocab - SPECIAL)
    return {"g": g, "d1": d1, "G": G}


def simulate(maps: dict, prompt: list, max_new_tokens: int, num_steps: int) -> dict:
    """Greedy EAGLE-3 (topk 1) on the maps: the output ids and the accepted drafts per cycle.

    The prefill emits ``g(prompt[-1])``; each cycle then drafts ``num_steps`` tokens, accepts the
    longest agreeing prefix (``a`` drafts) and emits ``a + 1`` tokens (capped at
    ``max_new_tokens``). Returns ``{"output_ids": [...], "accepted": [a per cycle]}``; the
    histogram SGLang reports counts these ``a`` values (index = accepted drafts).
    """
    g, d1, G = maps["g"], maps["d1"], maps["G"]
    y, b = prompt[-1], g[prompt[-1]]
    out, accepted = [b], []
    while len(out) < max_new_tokens:
        drafts = [d1[y]]
        for _ in range(num_steps - 1):
            drafts.append(G[drafts[-1]])
        a, last = 0, b
        for d in drafts:
            if d != g[last]:
                break
            a, last = a + 1, d
        accepted.append(a)
        emitted = drafts[:a] + [g[last]]
        out.extend(emitted)
        y, b = last, g[last]
    return {"output_ids": out[:max_new_tokens], "accepted": accepted}


def _configs() -> tuple:
    from sglang_verify_graph import dummy_models as mm

    target = mm._llama(HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, 8192, 10000.0,
                       head_dim=HEAD_DIM)
    draft = mm._eagle3_draft(dict(target), AUX_IDS, HIDDEN)
    mm.check_pair("llama-pair", target, draft)
    return mm, target, draft


def build_weights(maps: dict, hidden: int = HIDDEN, vocab: int = VOCAB, layers: int = LAYERS,
                  heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                  intermediate: int = INTERMEDIATE, seed: int = 0):
    """The two state dicts (HF names, float32 CPU tensors): ``(target, draft)``.

    Raises:
        ValueError: ``vocab > hidden // 2`` or ``intermediate < 2 * vocab`` (no room for the
            one-hot states or the lookup units).
    """
    import torch

    if vocab > hidden // 2 or intermediate < 2 * vocab:
        raise ValueError(f"need vocab <= hidden/2 and intermediate >= 2*vocab "
                         f"(vocab {vocab}, hidden {hidden}, intermediate {intermediate})")
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
    return target, draft


def write_pair(out: str, agree: float = 0.7, seed: int = 0) -> tuple:
    """Write both folders under ``out``; returns their paths ``(target_dir, draft_dir)``."""
    import torch
    from safetensors.torch import save_file

    mm, tcfg, dcfg = _configs()
    maps = make_maps(VOCAB, agree, seed)
    tw, dw = build_weights(maps, seed=seed)
    dirs = []
    for name, cfg, weights in (("llama-pair", tcfg, tw), ("llama-pair-eagle3", dcfg, dw)):
        d = mm.write_model(out, name, cfg)
        save_file({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in weights.items()}, os.path.join(d, "model.safetensors"))
        with open(os.path.join(d, "pair_maps.json"), "w") as f:
            json.dump(dict(maps, agree=agree, seed=seed), f)
        dirs.append(d)
    return tuple(dirs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--agree", type=float, default=0.7, help="share of ids where the draft agrees")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for d in write_pair(a.out, a.agree, a.seed):
        print(f"wrote {d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
