"""``python -m bench models pair OUT_DIR [...]``: write a pair (flags of the old
``accept_pair.py``)."""

from __future__ import annotations

import argparse
import os

from bench.models.accept_pair.config import ACCEPT_TARGETS, AGREE_LLAMA8B, LLAMA8B, SHAPES, estimated_bytes
from bench.models.accept_pair.simulator import make_class_maps
from bench.models.accept_pair.builder import write_pair, write_shape_pair

DESCRIPTION = "A Llama target + EAGLE-3 draft whose agreement is set by construction (real weights, no hub)."


def _agree_list(text: str) -> list:
    """``--agree`` value: one share or a comma list (argparse type; error names the value)."""
    try:
        vals = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want shares in [0, 1], e.g. 0.7 or 0.36,0.55")
    if not vals or any(not 0.0 <= v <= 1.0 for v in vals):
        raise argparse.ArgumentTypeError(f"{text}: want shares in [0, 1], e.g. 0.7 or 0.36,0.55")
    return vals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench models pair", description=DESCRIPTION)
    ap.add_argument("out")
    ap.add_argument("--agree", type=_agree_list, default=None,
                    help="share of ids where the draft agrees (default 0.7); a comma list, or "
                         "--shape: one agreement class per value (default for llama8b: "
                         + ",".join(map(str, AGREE_LLAMA8B)) + ")")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attention", action="store_true",
                    help="write the attention pair (llama-pair-attn): its target's greedy token "
                         "goes through its verify attention")
    ap.add_argument("--prefix", action="store_true",
                    help="write the prefix-reading pair (llama-pair-prefix): its target's greedy "
                         "token depends on every prefix position within --span, every layer's "
                         "KV buffer and BOS; prompts need >= span + 2 tokens")
    ap.add_argument("--draft-attention", action="store_true",
                    help="write the draft-attention pair (llama-pair-draft-attn): the plain "
                         "target with a draft whose proposals go through its own (draft-extend) "
                         "attention")
    ap.add_argument("--span", type=int, default=None,
                    help="with --prefix: the farthest offset its last layer reads (default 1024)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None,
                    help="write the pair at that model's shape (llama8b: Llama-3.1-8B and its "
                         "EAGLE-3 draft, pytorch_model.bin with shared storages, ~3.3 GB)")
    ap.add_argument("--dry-run", action="store_true",
                    help="with --shape: print the folders and weight bytes, write nothing")
    a = ap.parse_args(argv)
    if a.span is not None and not a.prefix:
        ap.error("--span: only with --prefix")
    if a.draft_attention:
        from bench.models.accept_pair.draft_attn import write_draft_attention_pair

        if a.shape or a.attention or a.prefix or a.dry_run or (a.agree and len(a.agree) > 1):
            ap.error("--draft-attention: not with --shape, --attention, --prefix, --dry-run or "
                     "several --agree values")
        for d in write_draft_attention_pair(a.out, (a.agree or [0.7])[0], a.seed):
            print(f"wrote {d}", flush=True)
        return 0
    if a.prefix:
        from bench.models.accept_pair.prefix import DEFAULT_SPAN, PREFIX_KV_HEADS, write_prefix_pair

        if a.shape or a.attention or a.dry_run or (a.agree and len(a.agree) > 1):
            ap.error("--prefix: not with --shape, --attention, --dry-run or several --agree values")
        span = DEFAULT_SPAN if a.span is None else a.span
        if span < PREFIX_KV_HEADS:
            ap.error(f"--span {span}: want >= {PREFIX_KV_HEADS} (one offset per KV head)")
        for d in write_prefix_pair(a.out, span, (a.agree or [0.7])[0], a.seed):
            print(f"wrote {d}", flush=True)
        return 0
    if a.shape is None:
        if a.dry_run:
            ap.error("--dry-run: only with --shape")
        agree = a.agree or [0.7]
        if len(agree) > 1:
            ap.error(f"--agree {','.join(map(str, agree))}: several agreement classes need --shape")
        for d in write_pair(a.out, agree[0], a.seed, a.attention):
            print(f"wrote {d}", flush=True)
        return 0
    shape = SHAPES[a.shape]
    agrees = a.agree or list(AGREE_LLAMA8B)
    try:
        make_class_maps(shape.vocab, agrees, a.seed)
    except ValueError as ex:
        ap.error(f"--agree: {len(agrees)} agreement classes: {ex}")
    targets = list(ACCEPT_TARGETS) if a.agree is None and shape is LLAMA8B else None
    if a.dry_run:
        print(f"DRYRUN {os.path.join(a.out, shape.folder(a.attention))} and -eagle3: {shape}; "
              f"agreement classes {agrees}; ~{estimated_bytes(shape) / 2**30:.1f} GiB of "
              f"pytorch_model.bin", flush=True)
        return 0
    for d in write_shape_pair(a.out, shape, agrees, a.seed, a.attention, targets):
        size = os.path.getsize(os.path.join(d, "pytorch_model.bin"))
        print(f"wrote {d} ({size / 2**30:.2f} GiB pytorch_model.bin)", flush=True)
    return 0
