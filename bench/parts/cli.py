"""``python -m bench parts``: flags, the plan (``--dry-run``) and ``main`` (the parts in order,
the tables, ``--out`` JSON)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from bench.parts.model import (
    DENSE_OPS, EXTRAPOLATION_NOTE, H200_HBM_TBPS, H200_L2_MIB, H200_SMS, KIMI_K25_TP8, MIN_REPLAYS,
    MOE_METHODS, PARTS, ROUTINGS, copies_for, expert_bytes, kv_slots, LayerShape,
)
from bench.parts.tables import combine_rows, format_dense_table, format_moe_table, format_table
from bench.parts.attention import bench_attention, measure_copy_bandwidth
from bench.parts.moe import _install_sglang_runtime, _SchemeHolder, bench_dense, bench_moe, check_moe


DESCRIPTION = ("Where one verify layer's time goes, part by part: attention vs routed MoE (vs dense GEMMs), "
               "for verify (bs x ndt tokens) against decode (bs tokens), on one Kimi-K2.5 TP-8 shard layer.")


def parse_int_list(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.replace(" ", ",").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r}: a comma-separated list of integers")
    if not out:
        raise argparse.ArgumentTypeError(f"{s!r}: empty list")
    return out


def parse_name_list(choices):
    def parse(s: str) -> list[str]:
        out = [x for x in s.replace(" ", ",").split(",") if x]
        bad = [x for x in out if x not in choices]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"{s!r}: use a comma-separated subset of {','.join(choices)}")
        return out
    return parse


QUICK = {"batch_sizes": [1, 16], "contexts": [4096], "ndt": [3]}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench parts", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=parse_int_list, default=[1, 4, 16, 32])
    ap.add_argument("--contexts", type=parse_int_list, default=[1024, 4096, 16384],
                    help="KV context (prefix tokens) per request")
    ap.add_argument("--ndt", type=parse_int_list, default=[3, 4],
                    help="verify tokens per request (num_steps + 1)")
    ap.add_argument("--routings", type=parse_name_list(ROUTINGS), default=list(ROUTINGS))
    ap.add_argument("--shared-p", type=float, default=0.5,
                    help="'shared' routing: probability a later token keeps each first-token expert")
    ap.add_argument("--compose-routing", choices=ROUTINGS, default="random",
                    help="routing whose MoE times enter the per-layer rows")
    ap.add_argument("--parts", type=parse_name_list(PARTS), default=list(PARTS))
    ap.add_argument("--moe-methods", type=parse_name_list(MOE_METHODS), default=["triton"],
                    help="triton: CompressedTensorsWNA16TritonMoE; marlin: CompressedTensorsWNA16MoE")
    ap.add_argument("--replays", type=int, default=60, help=f"timed graph replays per point (>= {MIN_REPLAYS})")
    ap.add_argument("--warmup", type=int, default=5, help="untimed graph replays before timing")
    ap.add_argument("--min-calls", type=int, default=8, help="calls per graph at least (the list repeats)")
    ap.add_argument("--moe-copies", type=int, default=8,
                    help="MoE weight sets (each 1.19 GB) rotated, each with its own routing draw")
    ap.add_argument("--max-copies", type=int, default=64, help="cap on rotated attention / dense input sets")
    ap.add_argument("--l2-multiple", type=float, default=4.0,
                    help="bytes of other sets between two reads of one set, in units of L2")
    ap.add_argument("--l2-mib", type=float, default=None,
                    help=f"L2 size for the rotation (default: the device's; {H200_L2_MIB} for --dry-run)")
    ap.add_argument("--hbm-tbps", type=float, default=H200_HBM_TBPS, help="nominal HBM bandwidth, TB/s")
    ap.add_argument("--copy-gib", type=float, default=2.0, help="bytes of the bandwidth copy (each side)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-checks", action="store_true", help="skip the correctness checks")
    ap.add_argument("--out", default=None, help="JSON file")
    ap.add_argument("--quick", action="store_true",
                    help="bs 1,16, ctx 4096, ndt 3 (explicit --batch-sizes/--contexts/--ndt win)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU)")
    a = ap.parse_args(argv)
    if a.quick:
        given = [x.split("=")[0] for x in (argv if argv is not None else sys.argv[1:])]
        for k, v in QUICK.items():
            if "--" + k.replace("_", "-") not in given:
                setattr(a, k, list(v))
    if a.replays < MIN_REPLAYS:
        ap.error(f"--replays {a.replays}: at least {MIN_REPLAYS}")
    if a.warmup < 0 or a.min_calls < 1 or a.moe_copies < 1 or a.max_copies < 1 or a.l2_multiple <= 0:
        ap.error("--warmup >= 0, --min-calls / --moe-copies / --max-copies >= 1, --l2-multiple > 0")
    if min(a.batch_sizes) < 1 or min(a.contexts) < 1:
        ap.error("--batch-sizes and --contexts: positive integers")
    if min(a.ndt) < 2:
        ap.error("--ndt: at least 2 tokens per request (the bonus token and one draft)")
    if not 0.0 <= a.shared_p <= 1.0:
        ap.error("--shared-p: a probability in [0, 1]")
    if a.compose_routing not in a.routings:
        a.compose_routing = a.routings[0]
    for k in ("batch_sizes", "contexts", "ndt"):
        setattr(a, k, sorted(set(getattr(a, k))))
    return a


def build_plan(a: argparse.Namespace, shape: LayerShape = KIMI_K25_TP8, l2_bytes: float | None = None,
               num_sms: int = H200_SMS) -> dict:
    """Every point the run times, with input-set counts and sizes (bytes). ``l2_bytes``: the L2 the
    rotation is sized for (``--l2-mib``, else the H200's 50 MiB)."""
    if l2_bytes is None:
        l2_bytes = (a.l2_mib if a.l2_mib else H200_L2_MIB) * 2 ** 20
    plan = {"attention": [], "moe": [], "dense": [], "l2_bytes": l2_bytes, "num_sms": num_sms}
    if "attention" in a.parts:
        for ctx in a.contexts:
            for bs in a.batch_sizes:
                slots = kv_slots(bs, ctx, max(a.ndt))
                per = slots * shape.qk_dim * 2
                n = copies_for(per, l2_bytes, a.l2_multiple, a.max_copies)
                plan["attention"].append({"bs": bs, "ctx": ctx, "ndt": list(a.ndt), "slots": slots,
                                          "kv_bytes_per_copy": per, "copies": n,
                                          "timings": 1 + 2 * len(a.ndt)})
    if "moe" in a.parts:
        for m in a.moe_methods:
            for bs in a.batch_sizes:
                plan["moe"].append({"method": m, "role": "decode", "bs": bs, "ndt": 1, "routing": "first",
                                    "tokens": bs})
                for ndt in a.ndt:
                    for r in a.routings:
                        plan["moe"].append({"method": m, "role": "verify", "bs": bs, "ndt": ndt, "routing": r,
                                            "tokens": bs * ndt})
    if "dense" in a.parts:
        ts = sorted({bs for bs in a.batch_sizes} | {bs * n for bs in a.batch_sizes for n in a.ndt})
        for t in ts:
            plan["dense"].append({"tokens": t, "ops": list(DENSE_OPS)})
    eb = expert_bytes(shape)
    set_bytes = shape.num_experts * eb["bytes"]
    plan["moe_weight_set_bytes"] = set_bytes
    plan["moe_weight_bytes_total"] = set_bytes * a.moe_copies * len(a.moe_methods) if plan["moe"] else 0
    plan["timings"] = (sum(p["timings"] for p in plan["attention"]) + len(plan["moe"])
                       + len(DENSE_OPS) * len(plan["dense"]))
    plan["expert_bytes"] = eb
    try:
        from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits

        plan["ours_kv_splits"] = {f"bs{bs}_ndt{n}": choose_num_kv_splits(
            ChainVerifyShape(shape.heads, 1, shape.qk_dim, shape.kv_lora, n, shape.rope), bs, num_sms)
            for bs in a.batch_sizes for n in a.ndt}
    except ImportError:
        pass
    return plan


def format_plan(a: argparse.Namespace, plan: dict) -> str:
    lines = [f"PLAN Kimi-K2.5 TP-8 shard, one layer: parts {','.join(a.parts)}; bs {a.batch_sizes}, "
             f"ctx {a.contexts}, ndt {a.ndt}; routings {a.routings} (shared p={a.shared_p}); "
             f"{a.replays} replays after {a.warmup} warm-up; L2 for rotation {plan['l2_bytes'] / 2 ** 20:.0f} MiB "
             f"x {a.l2_multiple}"]
    for p in plan["attention"]:
        lines.append(f"PLAN attention bs={p['bs']} ctx={p['ctx']} ndt={p['ndt']}: decode + ours/upstream per ndt, "
                     f"{p['copies']} KV buffer(s) of {p['kv_bytes_per_copy'] / 1e6:.1f} MB")
    for p in plan["moe"]:
        lines.append(f"PLAN moe {p['method']} {p['role']} bs={p['bs']} ndt={p['ndt']} routing={p['routing']} "
                     f"T={p['tokens']} ({a.moe_copies} weight sets / routing draws)")
    for p in plan["dense"]:
        lines.append(f"PLAN dense T={p['tokens']}: {','.join(p['ops'])}")
    eb = plan["expert_bytes"]
    lines.append(f"PLAN bytes per expert {eb['bytes']} ({eb['weight_bytes']} int4 + {eb['scale_bytes']} scales); "
                 f"MoE weight sets {plan['moe_weight_bytes_total'] / 1e9:.2f} GB; {plan['timings']} timed points")
    if "ours_kv_splits" in plan:
        lines.append(f"PLAN ours' KV splits ({plan['num_sms']} SMs): "
                     + ", ".join(f"{k}={v}" for k, v in plan["ours_kv_splits"].items()))
    return "\n".join(lines)

def _versions() -> dict:
    import torch
    import triton

    v = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    try:
        import sglang

        v["sglang"] = getattr(sglang, "__version__", "?")
    except Exception as e:
        v["sglang"] = f"import failed: {e}"
    return v


def _repeat_record(part: str, first: dict, second: dict, keys) -> dict:
    """One point timed twice: both medians (ms) and second / first - 1 per timed key."""
    rec = {"part": part, **{k: first[k] for k in ("bs", "ctx", "ndt", "routing", "role") if k in first}}
    for k in keys:
        m0, m1 = first[k]["median_ms"], second[k]["median_ms"]
        rec[k] = {"first_ms": m0, "second_ms": m1, "change": m1 / m0 - 1}
    return rec


def main(argv=None) -> int:
    a = parse_args(argv)
    shape = KIMI_K25_TP8
    if a.dry_run:
        print(format_plan(a, build_plan(a, shape)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("python -m bench parts: needs a CUDA GPU (use --dry-run for the plan)", file=sys.stderr)
        return 2
    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    l2_bytes = a.l2_mib * 2 ** 20 if a.l2_mib else float(getattr(props, "L2_cache_size", H200_L2_MIB * 2 ** 20))
    num_sms = props.multi_processor_count
    plan = build_plan(a, shape, l2_bytes, num_sms)
    print(format_plan(a, plan), flush=True)
    dev_name = torch.cuda.get_device_name(0)
    meta = {"device": dev_name, "num_sms": num_sms, "l2_bytes": l2_bytes, "versions": _versions(),
            "config": {k: v for k, v in vars(a).items()}, "shape": asdict(shape),
            "expert_bytes": expert_bytes(shape), "command": " ".join([sys.argv[0]] + (argv or sys.argv[1:])),
            "extrapolation": EXTRAPOLATION_NOTE}
    bw = measure_copy_bandwidth(a.copy_gib, a.replays)
    print(f"COPY {bw['tbps']:.3f} TB/s (read + write, {bw['bytes_each_side'] / 2 ** 30:.1f} GiB each side)", flush=True)
    attention, moe, dense, checks, errors, repeat = [], [], [], {}, [], []

    if "attention" in a.parts:
        for p in plan["attention"]:
            try:
                for r in bench_attention(a, shape, p["ctx"], p["bs"], p["copies"], num_sms, not a.no_checks):
                    attention.append(r)
                    print(f"ATTN ctx={r['ctx']} bs={r['bs']} ndt={r['ndt']} ours={r['ours']['median_ms']:.4f} "
                          f"decode={r['decode']['median_ms']:.4f} upstream={r['upstream']['median_ms']:.4f} ms"
                          + (f" check={json.dumps(r['check'])}" if "check" in r else ""), flush=True)
            except Exception as e:  # report and go on with the other points
                errors.append(f"attention ctx={p['ctx']} bs={p['bs']}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)
            torch.cuda.empty_cache()
        if attention:  # the first point again: the spread of one version timed twice
            p = plan["attention"][0]
            try:
                again = bench_attention(a, shape, p["ctx"], p["bs"], p["copies"], num_sms, False)
                for r0, r1 in zip([r for r in attention if (r["ctx"], r["bs"]) == (p["ctx"], p["bs"])], again):
                    repeat.append(_repeat_record("attention", r0, r1, ("ours", "decode", "upstream")))
            except Exception as e:
                errors.append(f"attention repeat: {type(e).__name__}: {e}"[:400])

    if "moe" in a.parts:
        _install_sglang_runtime()
        for method in a.moe_methods:
            if not a.no_checks:
                try:
                    checks[f"moe_{method}"] = check_moe(a, method, shape)
                    print(f"CHECK moe {method}: {json.dumps(checks[f'moe_{method}'])}", flush=True)
                except Exception as e:
                    errors.append(f"moe check {method}: {type(e).__name__}: {e}"[:400])
                    print("ERROR " + errors[-1], flush=True)
            try:
                holder = _SchemeHolder(method, shape, a.moe_copies, a.seed)
            except Exception as e:
                errors.append(f"moe weights {method}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)
                continue
            for p in (q for q in plan["moe"] if q["method"] == method):
                try:
                    r = bench_moe(a, holder, p["role"], p["bs"], p["ndt"], p["routing"])
                    moe.append(r)
                    print(f"MOE {method} {r['role']} bs={r['bs']} ndt={r['ndt']} routing={r['routing']} "
                          f"T={r['tokens']} "
                          f"{r['time']['median_ms']:.4f} ms experts={r['unique_experts']:.1f}", flush=True)
                except Exception as e:
                    errors.append(f"moe {method} {p}: {type(e).__name__}: {e}"[:400])
                    print("ERROR " + errors[-1], flush=True)
            first = [m for m in moe if m["method"] == method]
            if first:
                m0 = first[0]
                try:
                    m1 = bench_moe(a, holder, m0["role"], m0["bs"], m0["ndt"], m0["routing"])
                    repeat.append(_repeat_record("moe", m0, m1, ("time",)))
                except Exception as e:
                    errors.append(f"moe repeat: {type(e).__name__}: {e}"[:400])
            del holder
            torch.cuda.empty_cache()

    if "dense" in a.parts:
        for p in plan["dense"]:
            try:
                d = bench_dense(a, shape, p["tokens"], l2_bytes)
                dense.append(d)
                print(f"DENSE T={d['tokens']} sum={sum(s['median_ms'] for s in d['ops'].values()):.4f} ms", flush=True)
            except Exception as e:
                errors.append(f"dense T={p['tokens']}: {type(e).__name__}: {e}"[:400])
                print("ERROR " + errors[-1], flush=True)

    rows = combine_rows(a, attention, moe, dense, shape)
    wall = time.time() - t_start
    print(f"\n{dev_name}, {meta['versions']}; ms per layer (median of {a.replays} CUDA-graph replays); "
          f"MoE: {a.moe_methods[0]}, routing '{a.compose_routing}'; copy bandwidth {bw['tbps']:.2f} TB/s; "
          f"{EXTRAPOLATION_NOTE}; wall {wall:.0f} s\n")
    if dense:
        print("Dense GEMMs, ms per call\n")
        print(format_dense_table(dense) + "\n")
    if moe:
        print("MoE (experts touched = mean over the routing draws; floor = touched bytes / bandwidth)\n")
        print(format_moe_table(moe, shape, bw["tbps"], a.hbm_tbps) + "\n")
    for r in repeat:
        print("REPEAT " + json.dumps(r))
    if rows:
        print(f"\nPer layer (MoE {a.moe_methods[0]}, routing '{a.compose_routing}'; verify = ours' attention)\n")
        print(format_table(rows, shape, with_dense="dense" in a.parts))
    bad = [f"{k}: {v}" for k, v in checks.items() if not v["finite"] or v["rel_err_vs_fp32_reference"] > 3e-2]
    bad += [f"attention ctx={r['ctx']} bs={r['bs']} ndt={r['ndt']}: {r['check']}" for r in attention
            if "check" in r and (not all(r["check"][k] for k in ("ours_finite", "upstream_finite", "decode_finite"))
                                 or r["check"]["ours_vs_upstream_rel_err"] > 2e-2
                                 or r["check"]["decode_vs_ours_first_row_rel_err"] > 2e-2)]
    for b in bad:
        print("CHECK FAILED " + b)
    for e in errors:
        print("ERROR " + e)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "plan": plan, "copy_bandwidth": bw, "attention": attention, "moe": moe,
                       "dense": dense, "rows": rows, "checks": checks, "repeat": repeat, "errors": errors,
                       "wall_s": wall}, f, indent=1)
    return 1 if (errors or bad) else 0
