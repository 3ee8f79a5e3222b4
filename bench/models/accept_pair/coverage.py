"""``python -m bench models coverage``: the prefix pair's fault coverage, and the simulator
checked against the float reference forward.

    python -m bench models coverage --span 1024 [--prompts 8] [--reference 8] [--out F.json]

Coverage (:func:`bench.models.accept_pair.prefix_sim.coverage`): the share of single wrong
page-table entries (every prefix position), dropped KV splits (every split index, the launch's
``num_kv_splits`` at batch size 1 on an H200's 132 SMs unless given) and layers reading another
layer's buffer (every ordered pair) that change at least one output token. The reference check
runs the bfloat16 float forward (:func:`bench.models.accept_pair.reference_logits`) of the
built target on the first prompt's greedy sequence, clean and under ``--reference`` sampled
faults of each kind, and compares every output row up to the first changed one with the
simulator's row. Exit status 1 when a row differs or a share is below ``--min-share``.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time

from bench.models.accept_pair.prefix import (
    DEFAULT_SPAN, HEAD_DIM, PREFIX_HEADS, PREFIX_KV_HEADS, PREFIX_LAYERS, PREFIX_THETA,
    build_prefix_weights,
)
from bench.models.accept_pair.prefix_sim import (
    PrefixFault, PrefixModel, coverage, prefix_prompts, split_bounds,
)
from bench.models.accept_pair.reference import AttentionFault, reference_logits
from bench.models.accept_pair.simulator import pair_maps, simulate

H200_SMS = 132


def default_kv_splits(bs: int = 1, num_draft_tokens: int = 4, num_sms: int = H200_SMS) -> int:
    """The chain kernel's ``num_kv_splits`` for the prefix pair's verify at batch size ``bs``
    (:func:`sglang_verify_graph.kernel.choose_num_kv_splits`)."""
    from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits

    shape = ChainVerifyShape(num_q_heads=PREFIX_HEADS, num_kv_heads=PREFIX_KV_HEADS,
                             head_dim_qk=HEAD_DIM, head_dim_v=HEAD_DIM,
                             num_draft_tokens=num_draft_tokens)
    return choose_num_kv_splits(shape, bs, num_sms)


def reference_check(sd: dict, maps: dict, span: int, prompt: list, new_tokens: int,
                    num_steps: int, faults: list) -> list:
    """For the clean forward and each ``(label, PrefixFault)`` of ``faults``: the output rows
    (positions ``>= len(prompt)`` of the greedy sequence) up to the first changed one where the
    float reference's greedy id differs from :meth:`PrefixModel.row`. Returns ``[{"fault",
    "rows", "changed_at", "mismatches"}]``."""
    model = PrefixModel(maps, span)
    sim = simulate(maps, prompt, new_tokens, num_steps, predict=model.predict(None, num_steps + 1))
    seq = list(prompt) + sim["output_ids"]
    T = len(prompt)
    kw = dict(heads=PREFIX_HEADS, kv_heads=PREFIX_KV_HEADS, rope_theta=PREFIX_THETA, bf16=True,
              logits_from=T - 1)
    out = []
    for label, f in [("clean", PrefixFault())] + list(faults):
        af = AttentionFault(causal_shift=f.causal_shift, page=f.page, drop=f.drop,
                            kv_layer=f.kv_layer)
        ref = reference_logits(sd, seq, chain_start=T, fault=af, **kw)[0].argmax(-1).tolist()
        changed, bad, rows = None, [], 0
        for n in range(T, len(seq) - 1):
            want = model.row(seq, n, n + 1, f)
            rows += 1
            if ref[n] != want:
                bad.append(n)
            if want != seq[n + 1]:
                changed = n
                break
        if label == "clean" and ref[T - 1] != seq[T]:
            bad.append(T - 1)
        out.append({"fault": label, "rows": rows, "changed_at": changed, "mismatches": bad})
    return out


def sample_faults(prompt: list, span: int, num_steps: int, num_kv_splits: int, k: int,
                  seed: int = 0) -> list:
    """``k`` page faults (positions ``T - span .. T - 1`` and 0), every split of the first
    verify step's bounds (held for every row) up to ``k``, and ``k`` ordered layer pairs."""
    rng = random.Random(seed)
    T = len(prompt)
    pages = [0, T - 1] + rng.sample(range(max(1, T - span), T - 1), max(0, k - 2))
    out = [(f"page {p}->{p + 1}", PrefixFault(page=(p, p + 1))) for p in pages[:k]]
    for s, b in list(enumerate(split_bounds(T + num_steps + 1, num_kv_splits)))[:k]:
        out.append((f"drop split {s} {b}", PrefixFault(drop=b)))
    pairs = [(a, b) for a in range(PREFIX_LAYERS) for b in range(PREFIX_LAYERS) if a != b]
    for a, b in rng.sample(pairs, min(k, len(pairs))):
        kv = tuple(b if x == a else x for x in range(PREFIX_LAYERS))
        out.append((f"layer {a} reads {b}", PrefixFault(kv_layer=kv)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench models coverage", description=__doc__.split("\n\n")[0])
    ap.add_argument("--span", type=int, default=DEFAULT_SPAN)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--slack", type=int, default=8, help="prompt length - span - 1 at most")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="default: span / 15 + 48 (every offset of the last layer is read)")
    ap.add_argument("--num-steps", type=int, default=3)
    ap.add_argument("--num-kv-splits", type=int, default=None)
    ap.add_argument("--reference", type=int, default=6, metavar="K",
                    help="faults of each kind checked against the float reference (0: none)")
    ap.add_argument("--min-share", type=float, default=0.95)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.span < PREFIX_KV_HEADS:
        ap.error(f"--span {a.span}: want >= {PREFIX_KV_HEADS}")
    new_tokens = a.new_tokens or a.span // 15 + 48
    splits = a.num_kv_splits or default_kv_splits(1, a.num_steps + 1)
    maps = pair_maps(0.7, 0, attention=True)
    prompts = prefix_prompts(a.prompts, a.span, slack=a.slack)
    t0 = time.time()
    cov = coverage(maps, a.span, prompts, new_tokens, a.num_steps, splits)
    args = sys.argv[1:] if argv is None else list(argv)
    shown = [w for w, prev in zip(args, [None] + args) if w != "--out" and prev != "--out"]
    result = {"command": shlex.join(["python", "-m", "bench", "models", "coverage"] + shown),
              "span": a.span, "prompts": a.prompts, "prompt_lengths": [len(p) for p in prompts],
              "new_tokens": new_tokens, "num_steps": a.num_steps, "num_kv_splits": splits,
              "coverage": cov, "coverage_s": round(time.time() - t0, 1)}
    ok = all(v["share"] is not None and v["share"] >= a.min_share for v in cov.values())
    for kind, v in cov.items():
        print(f"{kind:6s} {v['changed']}/{v['faults']} = {v['share']:.4f}", flush=True)
    if a.reference:
        import torch

        t0 = time.time()
        tw, _ = build_prefix_weights(maps, a.span)
        bf = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in tw.items()}
        faults = sample_faults(prompts[0], a.span, a.num_steps, splits, a.reference)
        checks = reference_check(bf, maps, a.span, prompts[0], new_tokens, a.num_steps, faults)
        for c in checks:
            print(f"reference {c['fault']}: rows {c['rows']}, changed at {c['changed_at']}, "
                  f"mismatches {c['mismatches'] or 'none'}", flush=True)
        result.update(reference=checks, reference_s=round(time.time() - t0, 1))
        ok = ok and not any(c["mismatches"] for c in checks)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if ok else 1


TABLE_NOTE = ("A fault counts as seen when it changes at least one output token of its request (greedy, "
              "num_steps 3, the simulator's verify steps). page: one page-table entry of a prefix position "
              "holding the next position's slot; split: one KV split unread; layer: one layer reading another "
              "layer's KV buffer. Reference: the bfloat16 float forward of the built target against the "
              "simulator's rows, clean and under sampled faults of each kind.")
TABLE_HEAD = ["span", "prompts (tokens)", "new tokens", "KV splits", "page entries", "KV splits dropped",
              "layer buffers", "reference mismatches"]


def table_rows(results: list[dict]) -> list[list[str]]:
    """One row of :data:`TABLE_HEAD` cells per result (:func:`main`'s ``--out`` JSON): span, prompts,
    KV splits, per fault kind "changed / faults = share %", the float reference's mismatched rows."""
    rows = []
    for c in results:
        lens = c["prompt_lengths"]
        cells = [str(c["span"]), f"{len(lens)} x {min(lens)}-{max(lens)}", str(c["new_tokens"]), str(c["num_kv_splits"])]
        for kind in ("page", "split", "layer"):
            v = c["coverage"][kind]
            cells.append(f"{v['changed']} / {v['faults']} = {100 * v['changed'] / v['faults']:.1f}%")
        ref = c.get("reference") or []
        cells.append(f"{sum(len(r['mismatches']) for r in ref)} in {sum(r['rows'] for r in ref)} rows, "
                     f"{len(ref)} forwards" if ref else "not run")
        rows.append(cells)
    return rows
