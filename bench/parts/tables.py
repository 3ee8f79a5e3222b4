"""The parts bench's rows (one per (bs, ctx, ndt): decode and verify per layer, part by part)
and its markdown tables."""

from __future__ import annotations

import argparse

from bench.parts.model import (
    DENSE_OPS, H200_HBM_TBPS, KIMI_K25_TP8, expected_unique_experts_uniform, LayerShape,
    moe_bytes_row,
)


def _ms(d, key="median_ms"):
    return None if d is None else d.get(key)


def combine_rows(a: argparse.Namespace, attention: list, moe: list, dense: list,
                 shape: LayerShape = KIMI_K25_TP8) -> list:
    """One row per (bs, ctx, ndt): the parts' medians (ms), the bytes model and the per-layer
    verify / decode split. ``attention`` items: {bs, ctx, ndt, ours, upstream, decode} (each a
    ``summarize`` dict); ``moe`` items: {method, role, bs, ndt, routing, tokens, time,
    unique_experts}; ``dense`` items: {tokens, ops: {name: summary}}. The MoE of
    ``a.compose_routing`` and the first of ``a.moe_methods`` enters the layer figures."""
    method = a.moe_methods[0]
    moe_v = {(m["bs"], m["ndt"]): m for m in moe
             if m["role"] == "verify" and m["routing"] == a.compose_routing and m["method"] == method}
    moe_d = {m["bs"]: m for m in moe if m["role"] == "decode" and m["method"] == method}
    dense_t = {d["tokens"]: sum(_ms(s) for s in d["ops"].values()) for d in dense}
    rows = []
    for at in attention:
        bs, ctx, ndt = at["bs"], at["ctx"], at["ndt"]
        mv, md = moe_v.get((bs, ndt)), moe_d.get(bs)
        r = {"bs": bs, "ctx": ctx, "ndt": ndt, "attn_ours_ms": _ms(at.get("ours")),
             "attn_decode_ms": _ms(at.get("decode")), "attn_upstream_ms": _ms(at.get("upstream")),
             "moe_verify_ms": _ms(mv and mv["time"]), "moe_decode_ms": _ms(md and md["time"]),
             "experts_verify": mv and mv["unique_experts"], "experts_decode": md and md["unique_experts"],
             "dense_verify_ms": dense_t.get(bs * ndt), "dense_decode_ms": dense_t.get(bs),
             "moe_routing": a.compose_routing, "moe_method": method}
        if r["experts_verify"] and r["experts_decode"]:
            r["bytes_ratio"] = r["experts_verify"] / r["experts_decode"]
        if r["moe_verify_ms"] and r["moe_decode_ms"]:
            r["moe_time_ratio"] = r["moe_verify_ms"] / r["moe_decode_ms"]
        if None not in (r["attn_ours_ms"], r["attn_decode_ms"], r["moe_verify_ms"], r["moe_decode_ms"]):
            dv, dd = r["dense_verify_ms"] or 0.0, r["dense_decode_ms"] or 0.0
            dec = r["attn_decode_ms"] + r["moe_decode_ms"] + dd
            ver = r["attn_ours_ms"] + r["moe_verify_ms"] + dv
            r.update(layer_decode_ms=dec, layer_verify_ms=ver, layer_ratio=ver / dec,
                     attn_contrib=(r["attn_ours_ms"] - r["attn_decode_ms"]) / dec,
                     moe_contrib=(r["moe_verify_ms"] - r["moe_decode_ms"]) / dec,
                     dense_contrib=(dv - dd) / dec,
                     layers_decode_ms_extrapolated=shape.layers * dec,
                     layers_verify_ms_extrapolated=shape.layers * ver)
            if r["attn_upstream_ms"] is not None:
                up = r["attn_upstream_ms"] + r["moe_verify_ms"] + dv
                r.update(layer_upstream_ms=up, layer_upstream_ratio=up / dec,
                         layers_upstream_ms_extrapolated=shape.layers * up)
        rows.append(r)
    return rows


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def format_table(rows: list, shape: LayerShape = KIMI_K25_TP8, with_dense: bool = True) -> str:
    """Markdown table of ``combine_rows`` rows (ms per layer; ratios verify / decode)."""
    hdr = ["bs", "ctx", "ndt", "attn ms ours / decode / upstream", "MoE ms verify / decode",
           "experts verify / decode", "bytes ratio", "MoE time ratio"]
    if with_dense:
        hdr.append("dense ms verify / decode")
    hdr += ["layer verify / decode", "= 1 + attn + MoE" + (" + dense" if with_dense else ""),
            "upstream layer / decode", f"{shape.layers} x layer ms verify / decode (extrapolated)"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for r in rows:
        cells = [str(r["bs"]), str(r["ctx"]), str(r["ndt"]),
                 f"{_f(r['attn_ours_ms'], '{:.4f}')} / {_f(r['attn_decode_ms'], '{:.4f}')} / "
                 f"{_f(r['attn_upstream_ms'], '{:.4f}')}",
                 f"{_f(r['moe_verify_ms'], '{:.4f}')} / {_f(r['moe_decode_ms'], '{:.4f}')}",
                 f"{_f(r['experts_verify'], '{:.1f}')} / {_f(r['experts_decode'], '{:.1f}')}",
                 _f(r.get("bytes_ratio"), "{:.2f}"), _f(r.get("moe_time_ratio"), "{:.2f}")]
        if with_dense:
            cells.append(f"{_f(r['dense_verify_ms'], '{:.4f}')} / {_f(r['dense_decode_ms'], '{:.4f}')}")
        if "layer_ratio" in r:
            split = f"1 + {r['attn_contrib']:.3f} + {r['moe_contrib']:.3f}"
            if with_dense:
                split += f" + {r['dense_contrib']:.3f}"
            cells += [f"**{r['layer_ratio']:.2f}**", split, _f(r.get("layer_upstream_ratio"), "{:.2f}"),
                      f"{r['layers_verify_ms_extrapolated']:.2f} / {r['layers_decode_ms_extrapolated']:.2f}"]
        else:
            cells += ["-", "-", "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def format_moe_table(moe: list, shape: LayerShape = KIMI_K25_TP8, copy_tbps: float | None = None,
                     nominal_tbps: float = H200_HBM_TBPS) -> str:
    """Markdown table of the MoE points: ms (median, p10-p90), experts touched (mean over the
    routing draws; the uniform-routing expectation), MB touched and time over the bytes floor."""
    hdr = ["method", "role", "bs", "ndt", "routing", "T", "MoE ms (p10-p90)", "experts touched",
           "uniform E[U]", "MB touched", f"floor ms @{nominal_tbps} TB/s",
           "floor ms @copy" + (f" {copy_tbps:.2f} TB/s" if copy_tbps else ""), "time / floor (copy)"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for m in moe:
        b = moe_bytes_row(m["unique_experts"], shape, copy_tbps, nominal_tbps)
        t = m["time"]
        fl = b.get("floor_ms_copy")
        out.append("| " + " | ".join([
            m["method"], m["role"], str(m["bs"]), str(m["ndt"]), m["routing"], str(m["tokens"]),
            f"{t['median_ms']:.4f} ({t['p10_ms']:.4f}-{t['p90_ms']:.4f})", f"{m['unique_experts']:.1f}",
            f"{expected_unique_experts_uniform(shape.num_experts, shape.top_k, m['tokens']):.1f}",
            f"{b['touched_mb']:.1f}", f"{b['floor_ms_nominal']:.4f}", _f(fl, "{:.4f}"),
            _f(t["median_ms"] / fl if fl else None, "{:.2f}")]) + " |")
    return "\n".join(out)


def format_dense_table(dense: list) -> str:
    hdr = ["T"] + list(DENSE_OPS) + ["sum"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for d in dense:
        vals = [d["ops"][k]["median_ms"] for k in DENSE_OPS]
        out.append("| " + " | ".join([str(d["tokens"])] + [f"{v:.4f}" for v in vals] + [f"{sum(vals):.4f}"]) + " |")
    return "\n".join(out)
