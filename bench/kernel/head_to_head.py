"""The head-to-head columns: each kernel on one point's inputs, checked and timed, and the lines
that summarise the rows (see :mod:`bench.kernel.cli` for the kernels)."""

from __future__ import annotations

import math

import torch
import triton

from bench.kernel.inputs import (bench, boost_drafts, chain_reference, check_rows, decode_ms, make_inputs,
                                 upstream_layout)
from sglang_verify_graph.kernel import (ChainVerifyShape, chain_verify_attention_fwd, choose_num_kv_splits,
                                        workspace_numel)

KERNELS = ("decode", "extend", "splitkv", "shared_kv", "ours", "splitkv_installed")
DEFAULT_KERNELS = ("decode", "extend", "splitkv", "shared_kv", "ours")
UPSTREAM = {"splitkv": "splitkv", "shared_kv": "shared_kv"}  # bench kernel -> bench.upstream_kernels name
CPU_SMS = 132  # the split policies' SM count off a GPU (an H200's)


def launch_facts(name: str, s: dict, bs: int, ndt: int, ctx: int, mod=None, ours_shape=None,
                 ours_splits=None, device="cuda") -> dict:
    """The stage-1 launch of kernel ``name`` for this point, read from the kernel module's own
    functions and tables (``mod``: the upstream module the bench called): ``grid``, ``programs``,
    ``kv_splits`` (per request), ``prefix_reads`` (stage-1 programs that load each prefix KV
    block of one KV head: the q heads or head/row blocks sharing it), ``index`` (how it finds
    the KV slots), ``partials`` (dtype of the split partials)."""
    h, kvh, dk, dv = s["h"], s["kvh"], s["dk"], s["dv"]
    group = h // kvh
    if name == "extend":
        from sglang.kernels.ops.attention import extend_attention as ea

        block_m = ea._get_block_sizes_for_extend_attention(dk, dv)[3]
        mb = triton.cdiv(ndt, block_m)
        return dict(grid=[bs, h, mb], programs=bs * h * mb, kv_splits=1, prefix_reads=group * mb,
                    index="kv_indices int64 (flat, built before the call)", partials="none")
    if name in ("splitkv", "splitkv_installed"):
        n = mod.choose_n_splits(ctx)
        return dict(grid=[bs, h, n], programs=bs * h * n, kv_splits=n, prefix_reads=group,
                    index="kv_indices int64 (flat, built before the call)", partials="float32")
    if name == "shared_kv":
        block_h = mod.block_config(dk)[0]
        if group < h and group % block_h:
            block_h = group
        nhb = triton.cdiv(h, block_h)
        n = max(1, min(mod.MAX_N_SPLITS, mod.TARGET_PROGRAMS // max(1, bs * nhb)))
        return dict(grid=[bs, nhb, n], programs=bs * nhb * n, kv_splits=n,
                    kv_splits_active=max(1, min(n, ctx // mod.block_config(dk)[1])),
                    prefix_reads=triton.cdiv(group, block_h), block_h=block_h,
                    index="kv_indices int64 (flat, built before the call)", partials="bfloat16")
    if name.startswith("ours"):
        rb = ours_shape.row_blocks
        return dict(grid=[bs, kvh * rb, ours_splits], programs=bs * kvh * rb * ours_splits,
                    kv_splits=ours_splits, prefix_reads=rb, block_r=ours_shape.block_r,
                    index="req_to_token int32 (read in the kernel)", partials="float32")
    return {}


def run_point(name, s, ctx, bs, ndt, kernels=DEFAULT_KERNELS, upstream=None, block_rows=(), device="cuda",
              rep=100, num_sms=None):
    """One point: the same inputs for every kernel of ``kernels``; returns the row
    ``{shape, ctx, bs, ndt, kernels: {name: {ms, status, error, acc, launch, source}}}``.
    ``status``: ``ok``, ``inaccurate`` (ran, failed :func:`check_rows`; still timed),
    ``declined`` (returned False), ``error`` (raised), ``not_run`` (with ``error`` saying why).
    ``upstream``: ``{name: bench.upstream_kernels.UpstreamKernel}``; ``ms`` None off a GPU."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    h, kvh, dk, dv, rope = s["h"], s["kvh"], s["dk"], s["dv"], s["rope"]
    on_gpu = device != "cpu"
    dt = torch.bfloat16 if on_gpu else torch.float32  # the interpreter's bf16 dot is unusable
    inputs = make_inputs(s, ctx, bs, ndt, device, dtype=dt)
    boost_drafts(s, inputs, ndt)
    k_buf, v_buf, r2t, rpi, seq, q = inputs
    t = bs * ndt
    scale = dk ** -0.5
    ref = chain_reference(q, k_buf, v_buf, r2t, rpi, seq, ndt, scale)
    k_ext, v_ext, kv_indptr, kv_indices, qo_indptr, custom_mask, mask_indptr = upstream_layout(
        r2t, k_buf, v_buf, bs, ctx, ndt, device)
    sms = num_sms or (torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else CPU_SMS)
    upstream = upstream or {}
    out = {}

    def run(kname, call, o, check=True, source=None, launch=None):
        r = out[kname] = dict(ms=None, status=None, error=None, acc=None, launch=launch or {}, source=source)
        try:
            ran = call()
            if on_gpu:
                torch.cuda.synchronize()
        except Exception as e:  # reported, not hidden
            r.update(status="error", error=f"{type(e).__name__}: {e}"[:300])
            return
        if ran is False:
            r.update(status="declined", error="returned False: its can_handle declined this problem")
            return
        if check:
            r["acc"] = check_rows(o, ref, ndt)
        r["status"] = "ok" if not check or r["acc"]["pass"] else "inaccurate"
        if on_gpu:
            try:
                r["ms"] = bench(call, rep)
            except Exception as e:  # noqa: BLE001
                r.update(status="error", error=f"timing: {type(e).__name__}: {e}"[:300])

    for kname in kernels:
        if kname == "decode":
            if on_gpu:
                out["decode"] = dict(ms=decode_ms(s, inputs, ndt, device, rep), status="ok", error=None,
                                     acc=None, launch={}, source="installed (timing only: one token per request)")
            else:
                out["decode"] = dict(ms=None, status="not_run", error="timing only: not run off a GPU",
                                     acc=None, launch={}, source=None)
        elif kname == "extend":
            o = torch.empty(t, h, dv, device=device, dtype=dt)
            run("extend", lambda o=o: extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr,
                                                           kv_indices, custom_mask, True, mask_indptr, ndt,
                                                           1.0, 1.0, scale),
                o, source="installed", launch=launch_facts("extend", s, bs, ndt, ctx))
        elif kname in ("splitkv", "shared_kv", "splitkv_installed"):
            k = upstream.get(kname)
            src = k.record() if k is not None else None
            if k is None or k.fn is None:
                out[kname] = dict(ms=None, status="error", acc=None, launch={}, source=src,
                                  error=(k.error if k is not None else "not loaded"))
                continue
            if kname == "splitkv_installed" and dk != dv:
                out[kname] = dict(ms=None, status="not_run", acc=None, launch={}, source=src,
                                  error="not run on MLA: this release's verify_splitkv neither masks head dims "
                                        "nor declines Dk != Dv (0.5.23 declines it: it faults there)")
                continue
            o = torch.empty(t, h, dv, device=device, dtype=dt)
            fn = k.fn
            run(kname, lambda o=o, fn=fn: fn(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                             custom_mask, True, mask_indptr, ndt, 1.0, 1.0, scale, max_bs=bs),
                o, source=src, launch=launch_facts(kname, s, bs, ndt, ctx, mod=k.mod))
        elif kname == "ours":
            for b in (0, *block_rows):
                shape = ChainVerifyShape(h, kvh, dk, dv, ndt, rope, b)
                ns = choose_num_kv_splits(shape, bs, sms)
                n_out, n_lse = workspace_numel(shape, bs, ns)
                ao, al = torch.empty(n_out, device=device), torch.empty(n_lse, device=device)
                o = torch.empty(t, h, dv, device=device, dtype=dt)
                run("ours" if not b else f"ours_r{b}",
                    lambda o=o, shape=shape, ns=ns, ao=ao, al=al: chain_verify_attention_fwd(
                        q, k_buf, v_buf, o, r2t, rpi, seq, shape, ns, scale, ao, al),
                    o, source="sglang_verify_graph (this checkout)",
                    launch=launch_facts("ours", s, bs, ndt, ctx, ours_shape=shape, ours_splits=ns))
        else:
            raise ValueError(f"unknown kernel {kname!r}")
    return dict(shape=name, ctx=ctx, bs=bs, ndt=ndt, kernels=out)


def ratios(row: dict) -> dict:
    """``{kernel: ours ms / kernel ms}`` for every other kernel of the row that was timed (ours
    and it both accurate or not: the row's statuses say)."""
    ks = row["kernels"]
    ours = ks.get("ours", {}).get("ms")
    return {k: ours / v["ms"] for k, v in ks.items() if k != "ours" and ours and v.get("ms")}


def summary_lines(rows: list[dict]) -> list[str]:
    """Per shape and kernel: ours / kernel over the points where both ran accurately (geometric
    mean, range, points where ours is faster), and the points where either was not accurate or
    did not run."""
    lines = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        rs = [r for r in rows if r["shape"] == shape]
        for k in dict.fromkeys(k for r in rs for k in r["kernels"]):
            if k == "ours":
                continue
            good, other = [], []
            for r in rs:
                a, b = r["kernels"].get("ours", {}), r["kernels"].get(k, {})
                if a.get("status") == "ok" and b.get("status") == "ok" and a.get("ms") and b.get("ms"):
                    good.append((r, a["ms"] / b["ms"]))
                else:
                    other.append(f"{r['ctx']}/{r['bs']}/{r['ndt']}:{k}={b.get('status')},ours={a.get('status')}")
            if good:
                v = [x for _, x in good]
                gm = math.exp(sum(map(math.log, v)) / len(v))
                lo, hi = min(good, key=lambda p: p[1]), max(good, key=lambda p: p[1])
                ahead = sum(x < 1 for x in v)
                lines.append(f"SUMMARY {shape} ours/{k}: geomean {gm:.3f} over {len(v)} points, "
                             f"{lo[1]:.3f} (ctx {lo[0]['ctx']} bs {lo[0]['bs']} ndt {lo[0]['ndt']}) .. "
                             f"{hi[1]:.3f} (ctx {hi[0]['ctx']} bs {hi[0]['bs']} ndt {hi[0]['ndt']}); "
                             f"ours faster at {ahead}/{len(v)}")
            if other:
                lines.append(f"SUMMARY {shape} ours/{k}: not compared at {len(other)} points "
                             f"(ctx/bs/ndt:status): {' '.join(other[:6])}{' ...' if len(other) > 6 else ''}")
    return lines


def structure_lines(rows: list[dict]) -> list[str]:
    """Per shape and draft length, each kernel's stage-1 launch at the smallest and largest bs of
    the rows (programs, KV splits, prefix reads per KV block, index source, partials dtype)."""
    lines = []
    seen = set()
    for r in rows:
        key = (r["shape"], r["ndt"], r["ctx"])
        bss = sorted({x["bs"] for x in rows if (x["shape"], x["ndt"], x["ctx"]) == key})
        if key in seen or r["ctx"] != max(x["ctx"] for x in rows if x["shape"] == r["shape"]):
            continue
        seen.add(key)
        for bs in (bss[0], bss[-1]) if len(bss) > 1 else bss[:1]:
            rr = next(x for x in rows if (x["shape"], x["ndt"], x["ctx"], x["bs"]) == (*key, bs))
            parts = []
            for k, v in rr["kernels"].items():
                f = v.get("launch") or {}
                if f:
                    parts.append(f"{k} {f['programs']} progs x{f['kv_splits']} splits reads/KV-block "
                                 f"{f['prefix_reads']} {f['index'].split(' ')[0]} {f['partials']}")
            lines.append(f"LAUNCH {r['shape']} ndt={r['ndt']} ctx={r['ctx']} bs={bs}: " + "; ".join(parts))
    return lines


def print_table(rows: list[dict], kernels) -> None:
    """The per-point table: ms per kernel (its status instead when it has no time), ours / each,
    and the kernels that were not accurate or did not run."""
    shown = [k for k in dict.fromkeys(k for r in rows for k in r["kernels"])]
    others = [k for k in shown if k != "ours"]
    print(f"{'shape':12s} {'ctx':>6s} {'bs':>3s} {'ndt':>3s} " + " ".join(f"{k[:10]:>10s}" for k in shown)
          + " " + " ".join(f"{'o/' + k[:8]:>10s}" for k in others) + "  not ok")
    for r in rows:
        ks, rat = r["kernels"], ratios(r)
        cells = []
        for k in shown:
            v = ks.get(k)
            cells.append(f"{'-':>10s}" if v is None else f"{v['ms']:10.4f}" if v.get("ms") else f"{v['status'][:10]:>10s}")
        bad = [f"{k}:{v['status']}" for k, v in ks.items() if v["status"] != "ok"]
        print(f"{r['shape'][:12]:12s} {r['ctx']:6d} {r['bs']:3d} {r['ndt']:3d} " + " ".join(cells) + " "
              + " ".join(f"{rat[k]:10.3f}" if k in rat else f"{'-':>10s}" for k in others)
              + "  " + (" ".join(bad) or "-"))
