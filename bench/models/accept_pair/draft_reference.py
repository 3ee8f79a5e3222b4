"""A float reference of the draft-attention pair's draft (torch, CPU): its one layer as SGLang
0.5.16's ``LlamaForCausalLMEagle3`` computes it, replayed over the rows SGLang's EAGLE-3 loop runs
(draft prefill, draft decode, ``DRAFT_EXTEND_V2``; :mod:`bench.models.accept_pair.draft_attn`),
with a draft-extend test fault applied to the draft-extend rows as the chain kernel's contract
(:func:`sglang_verify_graph.kernel.faults.visible_columns`) states it. The target is the plain
pair's: its greedy id of ``t`` is ``g(t)`` and its EAGLE-3 aux states of ``t`` are ``E[t]`` three
times (every target layer writes nothing to the residual)."""

from __future__ import annotations

from bench.models.accept_pair.config import (
    AUX_IDS, HEAD_DIM, HEADS, KV_HEADS, MIN_KEYS_PER_SPLIT, RMS_EPS, ROPE_THETA, rope_inv_freq,
)
from bench.models.accept_pair.draft_attn import BOS_HEAD


class DraftReference:
    """The draft's layer over rows of one request, with that request's draft KV cache.

    ``draft``: the draft's state dict (HF names, ``midlayer.*``); ``embed``: the target's
    embedding (``[V, H]``; SGLang's ``set_embed`` gives it to the draft). ``bf16``: round to
    bfloat16 where SGLang keeps bfloat16 tensors (weights, the embedding, ``fc``'s output, every
    norm output, q / k / v before and after RoPE, the attention output, ``o_proj`` / MLP outputs,
    the residual, the logits); accumulation and softmax stay float32. ``max_len``: positions the
    cache holds.
    """

    def __init__(self, draft: dict, embed, bf16: bool = True, heads: int = HEADS,
                 kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                 rope_theta: float = ROPE_THETA, max_len: int = 4096):
        import torch

        self.R = (lambda x: x.to(torch.bfloat16).float()) if bf16 else (lambda x: x)  # noqa: E731
        self.W = {k: self.R(v.float()) for k, v in draft.items() if v.is_floating_point()}
        self._sparse = {}
        self.E = self.R(embed.float())
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.group = heads // kv_heads
        self.inv_freq = rope_inv_freq(head_dim, rope_theta)
        self.K = torch.zeros(max_len, kv_heads, head_dim)
        self.V = torch.zeros(max_len, kv_heads, head_dim)

    def lin(self, x, name: str):
        """``x @ W[name].T`` (float32), summed over the weight's nonzero entries only (a zero
        entry adds nothing; the weights are mostly zero): entry by entry for a few, else over the
        block of nonzero rows and columns."""
        import torch

        part = self._sparse.get(name)
        if part is None:
            w = self.W[name]
            r, c = w.nonzero(as_tuple=True)
            if len(r) <= 32768:
                part = ("entries", r, c, w[r, c], w.shape[0])
            else:
                rows, cols = w.any(1).nonzero()[:, 0], w.any(0).nonzero()[:, 0]
                part = ("block", rows, cols, w[rows][:, cols].T.contiguous(), w.shape[0])
            self._sparse[name] = part
        kind, r, c, val, out = part
        y = torch.zeros(x.shape[0], out)
        if kind == "entries":
            return y.index_add_(1, r, x[:, c] * val)
        y[:, r] = x[:, c] @ val
        return y

    def _norm(self, x, w):
        import torch

        return self.R(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w)

    def _rope(self, x, positions):
        import torch

        ang = torch.tensor(positions, dtype=torch.float)[:, None] * self.inv_freq[None]
        cos, sin = ang.cos()[:, None], ang.sin()[:, None]
        half = self.head_dim // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def fc(self, tokens: list):
        """The draft's hidden input of extend / prefill rows holding ``tokens`` as their hidden
        token: ``fc(cat(E[t] x 3))`` (float32 ``[n, H]``)."""
        import torch

        aux = torch.cat([self.E[torch.tensor(tokens)]] * len(AUX_IDS), -1)
        return self.R(self.lin(aux, "fc.weight"))

    def rows(self, ids: list, hidden, positions: list, columns: list) -> dict:
        """Run the layer over rows holding input ids ``ids`` with hidden inputs ``hidden``
        (float32 ``[n, H]``) at ``positions``: write every row's K/V at its position first, then
        row ``r`` attends to the positions ``columns[r]`` (a list of ints).

        Returns ``{"logits": [n, V], "out": [n, H] (the output state SGLang carries on),
        "self_read": [n, kv_heads] (the position each self head weights most), "self_gap": [n]
        (the smallest gap, logits, between a self head's best and second-best visible key; inf
        with one key), "bos_weight": [n] (the BOS head's weight on position 0)}``."""
        import torch

        p = "midlayer."
        W, R, hd = self.W, self.R, self.head_dim
        n = len(ids)
        emb = self.E[torch.tensor(ids)]
        res = hidden
        inp = torch.cat([self._norm(emb, W[p + "input_layernorm.weight"]),
                         self._norm(hidden, W[p + "hidden_norm.weight"])], -1)
        q = R(self.lin(inp, p + "self_attn.q_proj.weight")).view(n, self.heads, hd)
        k = R(self.lin(inp, p + "self_attn.k_proj.weight")).view(n, self.kv_heads, hd)
        v = R(self.lin(inp, p + "self_attn.v_proj.weight")).view(n, self.kv_heads, hd)
        q, k = R(self._rope(q, positions)), R(self._rope(k, positions))
        pos = torch.tensor(positions)
        self.K[pos], self.V[pos] = k, v
        top = max(max(c) for c in columns) + 1
        seen = torch.zeros(n, top, dtype=torch.bool)
        for r, c in enumerate(columns):
            seen[r, torch.tensor(c, dtype=torch.long)] = True
        kk = self.K[:top].permute(1, 0, 2)  # [kv, m, hd]
        qg = q.view(n, self.kv_heads, self.group, hd).permute(1, 0, 2, 3)  # [kv, n, group, hd]
        s = torch.einsum("knhd,kmd->knhm", qg, kk) * hd ** -0.5
        s = s.masked_fill(~seen[None, :, None, :], float("-inf"))
        pr = torch.softmax(s, -1)
        o = torch.einsum("knhm,kmd->nkhd", pr, self.V[:top].permute(1, 0, 2)).reshape(n, self.heads, hd)
        own = s[:, :, 0]  # the self heads: q head group * kvh, [kv, n, m]
        self_read = own.argmax(-1).T  # [n, kv]: positions (column index = position)
        two = own.topk(2, -1).values if top > 1 else None
        gaps = [float((two[:, r, 0] - two[:, r, 1]).min()) if two is not None and len(columns[r]) > 1
                else float("inf") for r in range(n)]
        bos_w = [float(pr[BOS_HEAD // self.group, r, BOS_HEAD % self.group, 0]) if seen[r, 0] else 0.0
                 for r in range(n)]
        attn = R(self.lin(R(o).reshape(n, -1), p + "self_attn.o_proj.weight"))
        res = R(res + attn)
        h = self._norm(res, W[p + "post_attention_layernorm.weight"])
        act = R(torch.nn.functional.silu(R(self.lin(h, p + "mlp.gate_proj.weight")))
                * R(self.lin(h, p + "mlp.up_proj.weight")))
        out = R(res + R(self.lin(act, p + "mlp.down_proj.weight")))
        logits = R(self.lin(self._norm(out, W["norm.weight"]), "lm_head.weight"))
        return {"logits": logits, "out": out, "self_read": self_read,
                "self_gap": torch.tensor(gaps), "bos_weight": torch.tensor(bos_w)}


def _margin(logits) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


def replay(draft: dict, embed, maps: dict, prompt: list, max_new_tokens: int, num_steps: int,
           fault: str | None = None, num_kv_splits: int = 2, bf16: bool = True) -> dict:
    """Greedy EAGLE-3 (topk 1) of one request with the float draft and the target map ``g``:
    draft prefill over ``prompt``, then per cycle ``num_steps - 1`` draft-decode rows, the verify
    (``g`` of each chain token), and ``num_steps + 1`` draft-extend rows whose columns are
    ``visible_columns(P, num_steps + 1, j, num_kv_splits, 64, fault)`` (``fault``: a draft-extend
    test fault name or None; the prefill and decode rows are unfaulted).

    Returns ``{"output_ids", "accepted"}`` as :func:`bench.models.accept_pair.simulate` does, and
    ``"rows"``: one dict per row whose argmax SGLang uses (the prefill's last row, every decode
    row, each draft extend's row ``a``): ``{"kind": "prefill" | "decode" | "extend", "position",
    "draft" (its argmax), "margin" (top-1 minus top-2 logit), "self_read" (list of positions),
    "self_gap", "bos_weight"}``."""
    from sglang_verify_graph.kernel.faults import visible_columns

    g = maps["g"]
    nd = num_steps + 1
    model = DraftReference(draft, embed, bf16=bf16, max_len=len(prompt) + max_new_tokens + 2 * nd)
    rows = []

    def note(kind, res, r, position):
        d = int(res["logits"][r].argmax())
        rows.append({"kind": kind, "position": position, "draft": d,
                     "margin": _margin(res["logits"][r]),
                     "self_read": res["self_read"][r].tolist(),
                     "self_gap": float(res["self_gap"][r]), "bos_weight": float(res["bos_weight"][r])})
        return d, res["out"][r:r + 1]

    L = len(prompt)
    b = g[prompt[-1]]
    res = model.rows(list(prompt[1:]) + [b], model.fc(prompt), list(range(L)),
                     [list(range(i + 1)) for i in range(L)])
    d1, hid = note("prefill", res, L - 1, L - 1)
    out, accepted, plen = [b], [], L
    while len(out) < max_new_tokens:
        drafts, x = [d1], d1
        for i in range(num_steps - 1):
            pos = plen + i
            res = model.rows([x], hid, [pos], [list(range(pos + 1))])
            x, hid = note("decode", res, 0, pos)
            drafts.append(x)
        chain = [b] + drafts
        preds = [g[t] for t in chain]
        a = 0
        while a < num_steps and drafts[a] == preds[a]:
            a += 1
        accepted.append(a)
        out.extend(drafts[:a] + [preds[a]])
        cols = [visible_columns(plen, nd, j, num_kv_splits, MIN_KEYS_PER_SPLIT, fault)
                for j in range(nd)]
        res = model.rows(preds, model.fc(chain), list(range(plen, plen + nd)), cols)
        d1, hid = note("extend", res, a, plen + a)
        b, plen = preds[a], plen + a + 1
    return {"output_ids": out[:max_new_tokens], "accepted": accepted, "rows": rows}


def self_scores(draft: dict, embed, query_position: int, bf16: bool = True):
    """The self head's (q head 0) scores, logits, of a row at ``query_position`` against keys at
    positions ``0 .. query_position + 1`` (float32 ``[query_position + 2]``), every row holding an
    extend row's input (hidden ``c``): the score as a function of the offset alone."""
    import torch

    model = DraftReference(draft, embed, bf16=bf16, max_len=query_position + 2)
    n = query_position + 2
    ids = [10] * n  # any regular id: the self heads' q and k read the embedding's sum only
    res_in = model.fc([10] * n)
    p = "midlayer."
    W, R, hd = model.W, model.R, model.head_dim
    emb = model.E[torch.tensor(ids)]
    inp = torch.cat([model._norm(emb, W[p + "input_layernorm.weight"]),
                     model._norm(res_in, W[p + "hidden_norm.weight"])], -1)
    positions = list(range(n))
    q = R(model.lin(inp, p + "self_attn.q_proj.weight")).view(n, model.heads, hd)
    k = R(model.lin(inp, p + "self_attn.k_proj.weight")).view(n, model.kv_heads, hd)
    q, k = R(model._rope(q, positions)), R(model._rope(k, positions))
    return (k[:, 0] @ q[query_position, 0]) * hd ** -0.5
